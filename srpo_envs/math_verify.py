"""Math verification env: three team workflows, each a different active-set pattern.

==============  ======================================================================================
Make            ``srpo_envs.make("MathVerify-v0", workflow=..., dataset=...)``; registered presets:
                ``MathVerify-SolverVerifier-v0``, ``MathVerify-Routed-v0``, ``ProcArith-v0``
                (``dataset="procedural"``, CPU scale)
Agents          proposers-aggregator: ``proposer_0..n-1``, ``aggregator``; solver-verifier:
                ``solver``, ``verifier``; routed: ``router``, the proposers, ``aggregator``
Spaces          observation and action: :class:`srpo_envs.spaces.UnicodeText` (any NUL-free string
                of at most ``max_obs_chars`` / ``max_action_chars``)
Event types     ``propose``, ``aggregate``; ``verify``, ``revise``; ``route``
Rewards         the team outcome at episode end (below), written to every event; minus
                ``format_penalty`` for an event holding an invalid output
Datasets        ``dataset=``: a bundled name (``math500``, ``gsm8k_test``, ...),
                ``procedural[-columns][:difficulty]``, ``reasoning-gym:<family>`` (graded by the
                family's own ``score_answer``; ``dataset_config=`` sets its generator), a local file
                or a hub id (:func:`srpo_envs.tasks.math_data.load_math`)
==============  ======================================================================================

* ``solver-verifier`` (division of labour): ``propose`` (solver, K=1) -> ``verify`` (verifier, K=1)
  -> on reject, ``revise`` (solver) -> ``verify`` ... for at most ``max_rounds`` revisions. The
  solver's latest answer is graded.
* ``proposers-aggregator`` (joint co-evolution): ``propose`` (all n proposers, one event, K=n)
  -> ``aggregate`` (aggregator, K=1), whose answer is graded.
* ``routed`` (mixed): ``route`` (router, K=1) chooses k in 1..n -> ``propose`` (the first k
  proposers, K=k) -> ``aggregate`` (K=1).

Answers are extracted from ``\\boxed{...}`` or ``<answer>...</answer>`` and graded with math-verify in
time-bounded workers (:mod:`srpo_envs.grading`); a reasoning-gym task is graded by its family's own
``score_answer`` (correct: a score of 1), with math-verify's verdict beside it in the outcome
(``reasoning_gym_score``, ``math_verify_correct``). The team reward is 1 for a correct final answer,
else 0, minus ``member_cost`` per proposer that acted (default 0: in the routed workflow a positive
cost is what gives the router a reason to pick fewer proposers); an event holding a malformed output
(no answer, unknown verdict, bad route) is flagged invalid and its reward is reduced by
``format_penalty``.

Texts that one agent reads from another (candidates for the aggregator, a solution for the verifier)
are cut to ``candidate_chars`` characters, or to ``candidate_tokens`` tokens of ``tokenizer`` when
given. Each cut is counted: events whose observations are built from such texts carry
``info["inputs"]`` / ``info["inputs_truncated"]``, so an eval reports the truncation rate.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from srpo_envs.base import EventParallelEnv, Parsed, Transition, parse_route
from srpo_envs.grading import MAX_ANSWER_CHARS, extract_answer, grade
from srpo_envs.tasks import reasoning_gym_data
from srpo_envs.tasks.math_data import MathTask, load_math

WORKFLOWS = ("solver-verifier", "proposers-aggregator", "routed")
_ACCEPT = {"accept", "accepted", "correct", "yes", "true"}
_REJECT = {"reject", "rejected", "incorrect", "wrong", "no", "false"}
#: Default cut of each candidate text shown to another agent (characters; ``candidate_chars=``).
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
        dataset_config: dict[str, Any] | None = None,
        difficulty: int | Sequence[int] = 2,
        max_operand: int = 30,
        n_proposers: int = 3,
        max_rounds: int = 2,
        default_route: int = 1,
        format_penalty: float = 0.1,
        member_cost: float = 0.0,
        candidate_chars: int | None = CANDIDATE_CHARS,
        candidate_tokens: int | None = None,
        tokenizer: str | None = None,
        max_steps: int = 32,
        max_action_chars: int = 8192,
        render_mode: str | None = None,
    ) -> None:
        if workflow not in WORKFLOWS:
            raise ValueError(f"workflow must be one of {WORKFLOWS}, got {workflow!r}")
        if n_proposers < 1 or max_rounds < 0:
            raise ValueError("need n_proposers >= 1 and max_rounds >= 0")
        if member_cost < 0:
            raise ValueError(f"member_cost must be >= 0, got {member_cost}")
        if dataset_config and not dataset.startswith(reasoning_gym_data.PREFIX):
            raise ValueError(f"dataset_config sets a reasoning-gym family's generator; {dataset!r} is not one")
        self.member_cost = float(member_cost)
        self._limit = InputLimit(candidate_chars, candidate_tokens, tokenizer)
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
            self.tasks = load_math(dataset, split=split, limit=dataset_size, dataset_config=dataset_config)
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
            return parse_route(text, self.n_proposers)
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
            # what the aggregator will read: count the candidates the input limit cuts
            info["inputs"] = len(outputs)
            info["inputs_truncated"] = sum(self._limit.exceeds(t) for t in outputs.values())
        elif phase == "aggregate":
            self._answer = parsed["aggregator"].value if parsed["aggregator"].valid else None
            info["answer"] = self._answer
            done = True
        elif phase in ("propose", "revise"):
            self._solution = outputs["solver"]
            self._answer = parsed["solver"].value if parsed["solver"].valid else None
            info["answer"] = self._answer
            self._phase = "verify"
            info["inputs"] = 1  # the verifier reads the solution
            info["inputs_truncated"] = int(self._limit.exceeds(self._solution))
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
                info["inputs"] = 2  # the solver reads its solution and the feedback
                info["inputs_truncated"] = sum(
                    self._limit.exceeds(t) for t in (self._solution, self._feedback)
                )
        return Transition(done=done, info=info)

    def _outcome(self) -> tuple[float, dict[str, Any]]:
        correct = grade(self._answer, self.task.answer) if self._answer is not None else False
        family_score = reasoning_gym_data.score_answer(self.task, self._answer)
        extra = {}
        if family_score is not None:  # the family's own grader decides; math-verify's verdict beside it
            extra = {"reasoning_gym_score": family_score, "math_verify_correct": bool(correct)}
            correct = family_score >= 1.0
        facts: dict[str, Any] = {"correct": bool(correct), "answer": self._answer, "gold": self.task.answer, **extra}
        if self.workflow == "routed":
            facts["team_size"] = self._team_size
        reward = 1.0 if correct else 0.0
        if self.member_cost and self.workflow != "solver-verifier":
            proposers = sum(len(h["outputs"]) for h in self._history if h["phase"] == "propose")
            facts["member_cost"] = self.member_cost * proposers
            reward -= facts["member_cost"]
        return reward, facts

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
                f"{problem}Your previous solution:\n{self._limit.cut(self._solution)}\n"
                f"Verifier feedback:\n{self._limit.cut(self._feedback)}\n"
                "Role: solver. Revise your solution and put the final answer in \\boxed{}."
            )
        if phase == "verify":
            return (
                f"{problem}Proposed solution:\n{self._limit.cut(self._solution)}\n"
                "Role: verifier. Check the solution. Reply \\boxed{accept} or \\boxed{reject} and say why."
            )
        if phase == "aggregate":
            cands = "\n".join(
                f"Candidate {i + 1}:\n{self._limit.cut(t)}" for i, t in enumerate(self._candidates.values())
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


class InputLimit:
    """How much of another agent's text an agent reads: ``chars`` characters, or ``tokens`` tokens.

    Token limits count with the policy's own tokenizer (``tokenizer``: a transformers name or path,
    loaded once, offline when it is a local directory), because "2,000 characters" is a different
    budget for every model; ``None`` for both means no cut. A cut text ends in ``" [...]"`` so the
    reader can tell it was cut.
    """

    def __init__(self, chars: int | None, tokens: int | None = None, tokenizer: str | None = None) -> None:
        if chars is not None and chars < 1:
            raise ValueError(f"candidate_chars must be >= 1 or None, got {chars}")
        if tokens is not None and tokens < 1:
            raise ValueError(f"candidate_tokens must be >= 1 or None, got {tokens}")
        if tokens is not None and tokenizer is None:
            raise ValueError("candidate_tokens needs tokenizer= (a transformers tokenizer name or path)")
        self.chars = None if tokens is not None else chars
        self.tokens = tokens
        self._tok: Any = None
        if tokens is not None:
            from pathlib import Path

            from transformers import AutoTokenizer

            local = Path(str(tokenizer)).expanduser().is_dir()
            self._tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=local)

    def exceeds(self, text: str) -> bool:
        """Whether ``text`` is longer than the limit (i.e. :meth:`cut` changes it)."""
        if self.tokens is not None:
            return len(self._tok.encode(text, add_special_tokens=False)) > self.tokens
        return self.chars is not None and len(text) > self.chars

    def cut(self, text: str) -> str:
        if not self.exceeds(text):
            return text
        if self.tokens is not None:
            ids = self._tok.encode(text, add_special_tokens=False)[: self.tokens]
            return self._tok.decode(ids) + " [...]"
        return _cut(text, int(self.chars))  # type: ignore[arg-type]
