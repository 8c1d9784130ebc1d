"""A complete minimal srpo env: two solvers answer together (one event, K=2), then a judge picks one (K=1).

==============  ======================================================================================
Make            ``PairSumEnv(n_tasks=32, seed=0)``; as a plugin: ``srpo_envs.register("PairSum-v0", PairSumEnv)``
Agents          ``solver_0``, ``solver_1`` (role ``solver``), ``judge``
Spaces          text in, text out (``srpo_envs.spaces.UnicodeText``, from the base class)
Event types     ``propose`` (both solvers, K=2), then ``judge`` (the judge, K=1)
Rewards         1 when the candidate the judge picks is the sum, else 0, written to every event; minus
                ``format_penalty`` on an event holding an output without ``\\boxed{...}``
==============  ======================================================================================
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from srpo_envs.base import EventParallelEnv, Parsed, Transition, parse_route
from srpo_envs.grading import extract_answer


@dataclass(frozen=True)
class SumTask:
    id: str
    a: int
    b: int


class PairSumEnv(EventParallelEnv):
    """What is a + b? Two solvers propose, a judge picks one of their answers."""

    def __init__(self, n_tasks: int = 32, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(["solver_0", "solver_1", "judge"], **kwargs)
        rng = random.Random(seed)  # the dataset: fixed by its seed, so every env of a run shares it
        self.tasks = [SumTask(f"sum-{i}", rng.randint(0, 99), rng.randint(0, 99)) for i in range(n_tasks)]

    def _reset_episode(self, options: dict[str, Any]) -> None:
        self.task = self._pick_task(self.tasks, options)  # seeded draw, or options["task_id"]
        self.task_id = self.task.id
        self.phase, self.candidates, self.choice = "propose", {}, None

    def _active(self) -> tuple[str, ...]:
        return ("solver_0", "solver_1") if self.phase == "propose" else ("judge",)

    def _event_type(self) -> str:
        return self.phase

    def _observe(self, agent: str) -> str:
        question = f"What is {self.task.a} + {self.task.b}? Answer as \\boxed{{n}}."
        if agent != "judge":
            return question
        listed = "\n".join(f"{i}. {self.candidates.get(f'solver_{i - 1}')}" for i in (1, 2))
        return f"{question}\nCandidates:\n{listed}\nPick one: \\boxed{{1}} or \\boxed{{2}}."

    def _parse(self, agent: str, text: str) -> Parsed:
        if agent == "judge":
            return parse_route(text, 2)  # \boxed{1} or \boxed{2}
        answer = (extract_answer(text) or "").strip()
        ok = answer.isdigit() and len(answer) <= 6
        return Parsed(ok, answer if ok else None, "" if ok else "no \\boxed{integer}")

    def _transition(self, outputs: dict[str, str], parsed: dict[str, Parsed]) -> Transition:
        if self.phase == "propose":
            self.candidates = {agent: p.value for agent, p in parsed.items()}
            self.phase = "judge"
            return Transition(done=False)
        self.choice = parsed["judge"].value if parsed["judge"].valid else 1
        return Transition(done=True, info={"choice": self.choice})

    def _shared_state(self) -> dict[str, Any]:
        return {"task": self.task_id, "phase": self.phase, "candidates": self.candidates}

    def _outcome(self) -> tuple[float, dict[str, Any]]:
        picked = self.candidates.get(f"solver_{(self.choice or 1) - 1}")
        correct = picked == str(self.task.a + self.task.b)
        return float(correct), {"correct": correct}

    def state_text(self) -> str:
        return f"{self.task.a} + {self.task.b}; phase {self.phase}; candidates {self.candidates}"
