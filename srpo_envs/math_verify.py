"""Math verification env: three team workflows, each a different active-set pattern.

* ``solver-verifier`` (division of labour): ``propose`` (solver, K=1) -> ``verify`` (verifier, K=1)
  -> on reject, ``revise`` (solver) -> ``verify`` ... for at most ``max_rounds`` revisions. The
  solver's latest answer is graded.
* ``proposers-aggregator`` (joint co-evolution): ``propose`` (all n proposers, one event, K=n)
  -> ``aggregate`` (aggregator, K=1), whose answer is graded.
* ``routed`` (mixed): ``route`` (router, K=1) chooses k in 1..n -> ``propose`` (the first k
  proposers, K=k) -> ``aggregate`` (K=1).

Answers are extracted from ``\\boxed{...}`` or ``<answer>...</answer>`` and graded with math-verify in
time-bounded workers (:mod:`srpo_envs.grading`). The team reward is 1 for a correct final answer,
else 0; an event holding a malformed output (no answer, unknown verdict, bad route) is flagged
invalid and its reward is reduced by ``format_penalty``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from srpo_envs.base import EventParallelEnv, Parsed, Transition
from srpo_envs.grading import MAX_ANSWER_CHARS, extract_answer, grade
from srpo_envs.tasks.math_data import MathTask, load_math

WORKFLOWS = ("solver-verifier", "proposers-aggregator", "routed")
_ACCEPT = {"accept", "accepted", "correct", "yes", "true"}
_REJECT = {"reject", "rejected", "incorrect", "wrong", "no", "false"}
_FIRST_INT = re.compile(r"-?\d+")
#: Candidate texts shown to the aggregator are cut to this many characters each.
CANDIDATE_CHARS = 2000


class MathVerifyEnv(EventParallelEnv):
    """A team of LLM agents solves math problems; see the module docstring for the workflows."""

    metadata = {"name": "math_verify_v0", "render_modes": ["ansi", "human"], "is_parallelizable": True}

    def __init__(
        self,
        workflow: str = "proposers-aggregator",
        dataset: str = "math500",
        *,
        tasks: list[MathTask] | None = None,
        split: str | None = None,
        dataset_size: int | None = None,
        difficulty: int | Sequence[int] = 2,
        max_operand: int = 30,
        n_proposers: int = 3,
        max_rounds: int = 2,
        default_route: int = 1,
        format_penalty: float = 0.1,
        max_steps: int = 32,
        max_action_chars: int = 8192,
        render_mode: str | None = None,
    ) -> None:
        if workflow not in WORKFLOWS:
            raise ValueError(f"workflow must be one of {WORKFLOWS}, got {workflow!r}")
        if n_proposers < 1 or max_rounds < 0:
            raise ValueError("need n_proposers >= 1 and max_rounds >= 0")
        self.workflow = workflow
        self.n_proposers = int(n_proposers)
        self.max_rounds = int(max_rounds)
        self.default_route = min(max(1, int(default_route)), self.n_proposers)
        self.dataset = dataset
        if tasks is not None:
            self.tasks = list(tasks)
        elif dataset.startswith("procedural"):
            levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
            per_level = [
                load_math(
                    dataset,
                    split=split or "train",
                    limit=dataset_size or 512,
                    difficulty=d,
                    max_operand=max_operand,
                    strict=False,  # dataset_size is an upper bound for small problem spaces
                )
                for d in levels
            ]
            # Interleave levels so any prefix mixes difficulties; a level with fewer problems (one
            # operation on one-digit operands has 111 train problems) runs out early and the rest keep
            # going, so no level's problems are dropped.
            self.tasks = [
                t for group in itertools.zip_longest(*per_level) for t in group if t is not None
            ]
        else:
            self.tasks = load_math(dataset, split=split, limit=dataset_size)
        if not self.tasks:
            raise ValueError("no tasks")
        self.proposers = [f"proposer_{i}" for i in range(self.n_proposers)]
        if workflow == "solver-verifier":
            agents = ["solver", "verifier"]
        elif workflow == "proposers-aggregator":
            agents = [*self.proposers, "aggregator"]
        else:
            agents = ["router", *self.proposers, "aggregator"]
        super().__init__(
            agents,
            max_steps=max_steps,
            format_penalty=format_penalty,
            max_action_chars=max_action_chars,
            render_mode=render_mode,
        )
        self.task: MathTask = self.tasks[0]
        self._phase = ""
        self._round = 0
        self._team_size = self.n_proposers
        self._history: list[dict[str, Any]] = []
        self._answer: str | None = None
        self._candidates: dict[str, str] = {}
        self._feedback = ""
        self._solution = ""

    # ------------------------------------------------------------------ state machine
    def _reset_episode(self, options: dict[str, Any]) -> None:
        self.task = self._pick_task(self.tasks, options)
        self.task_id = self.task.id
        self._phase = {"solver-verifier": "propose", "proposers-aggregator": "propose", "routed": "route"}[
            self.workflow
        ]
        self._round = 0
        self._team_size = self.n_proposers
        self._history = []
        self._answer = None
        self._candidates = {}
        self._feedback = ""
        self._solution = ""

    def _active(self) -> tuple[str, ...]:
        if self._phase == "route":
            return ("router",)
        if self._phase in ("propose", "revise") and self.workflow == "solver-verifier":
            return ("solver",)
        if self._phase == "verify":
            return ("verifier",)
        if self._phase == "propose":
            return tuple(self.proposers[: self._team_size])
        if self._phase == "aggregate":
            return ("aggregator",)
        raise RuntimeError(f"no active set in phase {self._phase!r}")

    def _event_type(self) -> str:
        return self._phase

    def _parse(self, agent: str, text: str) -> Parsed:
        answer = extract_answer(text)
        if answer is None:
            return Parsed(False, None, "no \\boxed{} or <answer> found")
        if len(answer) > MAX_ANSWER_CHARS:
            return Parsed(False, None, f"answer longer than {MAX_ANSWER_CHARS} chars")
        role = self.role_of(agent)
        if role == "verifier":
            word = re.sub(r"[^a-z]", "", answer.lower())
            if word in _ACCEPT:
                return Parsed(True, True)
            if word in _REJECT:
                return Parsed(True, False)
            return Parsed(False, None, f"verdict {answer[:40]!r} is neither accept nor reject")
        if role == "router":
            m = _FIRST_INT.search(answer)
            if m is None or len(m.group()) > 6 or not 1 <= int(m.group()) <= self.n_proposers:
                return Parsed(False, None, f"route must be an integer in 1..{self.n_proposers}")
            return Parsed(True, int(m.group()))
        return Parsed(True, answer)

    def _transition(self, outputs: dict[str, str], parsed: dict[str, Parsed]) -> Transition:
        phase = self._phase
        self._history.append({"phase": phase, "outputs": dict(outputs)})
        info: dict[str, Any] = {}
        done = False
        if phase == "route":
            p = parsed["router"]
            self._team_size = p.value if p.valid else self.default_route
            info["team_size"] = self._team_size
            self._phase = "propose"
        elif phase == "propose" and self.workflow != "solver-verifier":
            self._candidates = dict(outputs)
            info["answers"] = {a: p.value for a, p in parsed.items()}
            self._phase = "aggregate"
        elif phase == "aggregate":
            self._answer = parsed["aggregator"].value if parsed["aggregator"].valid else None
            info["answer"] = self._answer
            done = True
        elif phase in ("propose", "revise"):
            self._solution = outputs["solver"]
            self._answer = parsed["solver"].value if parsed["solver"].valid else None
            info["answer"] = self._answer
            self._phase = "verify"
        elif phase == "verify":
            p = parsed["verifier"]
            accepted = bool(p.valid and p.value)
            self._feedback = outputs["verifier"]
            info["accepted"] = accepted
            if accepted or self._round >= self.max_rounds:
                done = True
            else:
                self._round += 1
                self._phase = "revise"
        return Transition(done=done, info=info)

    def _outcome(self) -> tuple[float, dict[str, Any]]:
        correct = grade(self._answer, self.task.answer) if self._answer is not None else False
        facts: dict[str, Any] = {"correct": bool(correct), "answer": self._answer, "gold": self.task.answer}
        if self.workflow == "routed":
            facts["team_size"] = self._team_size
        return (1.0 if correct else 0.0), facts

    def _shared_state(self) -> dict[str, Any]:
        return {
            "task_id": self.task.id,
            "problem": self.task.problem,
            "workflow": self.workflow,
            "phase": self._phase,
            "round": self._round,
            "team_size": self._team_size,
            "history": self._history,
        }

    # ------------------------------------------------------------------ text
    def _observe(self, agent: str) -> str:
        problem = f"Problem: {self.task.problem}\n"
        phase = self._phase
        if phase == "route":
            return (
                f"{problem}Role: router. Decide how many proposers (1 to {self.n_proposers}) should solve "
                f"this problem. Reply with the number in \\boxed{{}}."
            )
        if phase == "propose":
            return f"{problem}Role: {self.role_of(agent)}. Solve the problem and put the final answer in \\boxed{{}}."
        if phase == "revise":
            return (
                f"{problem}Your previous solution:\n{_cut(self._solution)}\n"
                f"Verifier feedback:\n{_cut(self._feedback)}\n"
                "Role: solver. Revise your solution and put the final answer in \\boxed{}."
            )
        if phase == "verify":
            return (
                f"{problem}Proposed solution:\n{_cut(self._solution)}\n"
                "Role: verifier. Check the solution. Reply \\boxed{accept} or \\boxed{reject} and say why."
            )
        if phase == "aggregate":
            cands = "\n".join(
                f"Candidate {i + 1}:\n{_cut(t)}" for i, t in enumerate(self._candidates.values())
            )
            return (
                f"{problem}{cands}\n"
                "Role: aggregator. Decide the final answer from the candidates and put it in \\boxed{}."
            )
        raise RuntimeError(f"no observation in phase {phase!r}")

    def state_text(self) -> str:
        lines = [
            f"Problem: {self.task.problem}",
            f"Workflow: {self.workflow}; phase: {self._phase or 'done'}",
        ]
        for h in self._history:
            for agent, text in h["outputs"].items():
                lines.append(f"[{h['phase']}] {agent}: {_cut(text, 400)}")
        return "\n".join(lines)

    @property
    def answer(self) -> str:
        """The current task's reference answer (what an oracle agent knows)."""
        return self.task.answer


def _cut(text: str, limit: int = CANDIDATE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"
