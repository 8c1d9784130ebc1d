"""Scripted agents: oracle, noisy oracle, random and fixed-string teams.

They have the interface every srpo team has — ``act(observations, infos) -> {agent: text}`` for the
agents whose ``infos[agent]["active"]`` is true — so envs, rollouts and benchmarks are testable
without a model. The oracle reads the reference answer from the env it plays in (it is an oracle).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from srpo_envs.base import parse_route
from srpo_envs.grading import extract_answer, grade
from srpo_envs.qa_metrics import exact_match, normalize_answer
from srpo_envs.search import oracle_query

Behaviour = Callable[[str, str, Mapping[str, Any]], str]


class ScriptedTeam:
    """A team whose every role is a function ``(agent, observation, info) -> text``."""

    def __init__(self, behaviours: Mapping[str, Behaviour], default: Behaviour | None = None) -> None:
        self.behaviours = dict(behaviours)
        self.default = default

    def act(self, observations: Mapping[str, str], infos: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Actions for the active agents (inactive ones send nothing: the env ignores them anyway)."""
        actions = {}
        for agent, obs in observations.items():
            info = infos.get(agent, {})
            if not info.get("active", False):
                continue
            role = info.get("role", agent)
            fn = self.behaviours.get(role, self.default)
            if fn is None:
                raise KeyError(f"no scripted behaviour for role {role!r}")
            actions[agent] = fn(agent, obs, info)
        return actions

    def play(
        self, env: Any, seed: int, task_index: int
    ) -> Iterator[tuple[dict[str, str], dict[str, dict[str, Any]], dict[str, str]]]:
        """Play one episode; yields ``(observations, infos, actions)`` at each step, before stepping.

        While the caller handles a yield, ``env`` still shows the pre-step state (its task, its active
        set), so teachers' outputs can be filtered or recorded against what the agents saw.
        """
        obs, infos = env.reset(seed=seed, options={"task_index": task_index})
        while env.agents:
            actions = self.act(obs, infos)
            yield obs, infos, actions
            obs, _, _, _, infos = env.step(actions)

    # ------------------------------------------------------------------ factories
    @classmethod
    def oracle(cls, env: Any, route: int = 1) -> ScriptedTeam:
        """Knows the answer: always correct, verifies truthfully, routes ``route`` proposers."""
        return cls.noisy_oracle(env, p_correct=1.0, route=route)

    @classmethod
    def noisy_oracle(
        cls, env: Any, p_correct: float = 0.5, route: int | None = None, seed: int = 0
    ) -> ScriptedTeam:
        """Proposers right with probability ``p_correct``; aggregator takes the majority; verifier is truthful."""
        rng = random.Random(seed)

        def solve(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            task = env.unwrapped.task
            if rng.random() < p_correct:
                solution = task.meta.get("solution") if isinstance(task.meta, dict) else None
                return solution or f"The answer is \\boxed{{{task.answer}}}."
            return f"The answer is \\boxed{{{_wrong_answer(task.answer, rng)}}}."

        def aggregate(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            answers = [a for a in (extract_answer(c) for c in _candidates(obs)) if a is not None]
            if not answers:
                return "No candidate gave an answer. \\boxed{0}"
            best, votes = Counter(answers).most_common(1)[0]
            return f"{votes} of {len(answers)} candidates say {best}. \\boxed{{{best}}}"

        def verify(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            proposed = obs.split("Proposed solution:\n", 1)[-1]
            answer = extract_answer(proposed.rsplit("\nRole: verifier", 1)[0])
            if answer is not None and grade(answer, env.unwrapped.task.answer):
                return f"The answer {answer} is correct. \\boxed{{accept}}"
            return f"The answer {answer} is wrong. \\boxed{{reject}}"

        def route_fn(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            k = route if route is not None else rng.randint(1, env.unwrapped.n_proposers)
            return f"Use {k} proposers. \\boxed{{{k}}}"

        return cls(
            {
                "proposer": solve,
                "solver": solve,
                "aggregator": aggregate,
                "verifier": verify,
                "router": route_fn,
            }
        )

    @classmethod
    def search_oracle(cls, env: Any, route: int | None = None) -> ScriptedTeam:
        """Oracle searchers (query the gold passages' titles) and an evidence-reading aggregator.

        The aggregator answers a gold answer only if it appears in the retrieved text, so the team's
        EM measures what the searchers found, not what the oracle knows.
        """

        def search(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            index = int(agent.rpartition("_")[2]) if agent[-1].isdigit() else 0
            return f"<search>{oracle_query(env.unwrapped, index)}</search>"

        def aggregate(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            gold = _gold_in_evidence(env.unwrapped.task.answers, obs)
            if gold is not None:
                return f"<answer>{gold}</answer>"
            if "Answer now" in obs:
                return "<answer>unknown</answer>"
            return "<search>more evidence</search>"

        def route_fn(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            return f"\\boxed{{{route or env.unwrapped.n_searchers}}}"

        return cls({"searcher": search, "aggregator": aggregate, "router": route_fn})

    @classmethod
    def search_teacher(
        cls, env: Any, p_correct: float = 0.7, seed: int = 0, copy_spacing: bool = False
    ) -> ScriptedTeam:
        """A searcher/aggregator team that only uses what it has read: the teacher for search SFT.

        Unlike :meth:`search_oracle` (which queries every gold title at once, bridge entities of
        2-hop questions included), each action here is learnable from the observation alone:

        * a searcher copies the aggregator's request (``Aggregator asks: X``) when there is one, else
          queries the first gold title that appears in its observation and has not been retrieved
          (the question's subject, then a bridge entity named in a retrieved passage); with
          probability ``1 - p_correct`` it queries a wrong name instead (so aggregators also see
          states without the evidence);
        * the aggregator answers with the gold answer when it appears in the retrieved text; otherwise,
          before the last turn, it asks for the next needed title seen in the text; on the last
          turn it guesses a name from the text;
        * a router (routed workflow) sends 1..n_searchers searchers, uniformly at random.

        ``copy_spacing`` writes ``<search> X</search>`` and ``<answer> X</answer>``: a name then
        tokenizes as it does in the passages and questions it is copied from (byte-level BPE otherwise
        merges ``>`` with its first letters: ``>T raik or grad`` against `` Traik or grad``), so copying
        it is repeating tokens, not translating them. The env strips the space.

        :func:`search_teacher_correct` tells which of its outputs are worth imitating.
        """
        rng = random.Random(seed)
        base = env.unwrapped
        pad = " " if copy_spacing else ""

        def subject() -> str:
            return (base.gold_titles or [base.task.question])[0]

        def needed(obs: str) -> str | None:
            retrieved = {base.passage_title(pid) for pid in base.retrieved_ids}
            for title in base.gold_titles:
                if title not in retrieved and title in obs:
                    return title
            return None

        def wrong_name(obs: str) -> str:
            names = [t for t in re.findall(r"^\(([^)]+)\)", obs, re.MULTILINE) if t not in base.gold_titles]
            words = [w for w in re.findall(r"[A-Z][a-z]+", obs.split("Role:")[0]) if w not in ("Question",)]
            return rng.choice(names or words or ["unknown"])

        def search(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            asked = re.search(r"^Aggregator asks: (.+)$", obs, re.MULTILINE)
            target = asked.group(1).strip() if asked else needed(obs) or subject()
            if rng.random() >= p_correct:
                target = wrong_name(obs)
            return f"<search>{pad}{target}</search>"

        def aggregate(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            gold = _gold_in_evidence(base.task.answers, obs)
            if gold is not None:
                return f"<answer>{pad}{gold}</answer>"
            if "Answer now" not in obs:
                return f"<search>{pad}{needed(obs) or subject()}</search>"
            return f"<answer>{pad}{wrong_name(obs)}</answer>"

        def route_fn(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            # routed workflow: a team size drawn uniformly, so a routed warm start writes every route
            # and RL, not the teacher, learns which questions deserve more searchers
            return f"\\boxed{{{rng.randint(1, base.n_searchers)}}}"

        return cls({"searcher": search, "aggregator": aggregate, "router": route_fn})

    @classmethod
    def search_random(cls, env: Any, seed: int = 0) -> ScriptedTeam:
        """Searchers send random words from the question shuffled with noise; the aggregator guesses."""
        rng = random.Random(seed)
        vocab = ["river", "film", "born", "city", "album", "war", "king", "team", "island", "novel"]

        def search(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            return f"<search>{' '.join(rng.sample(vocab, 2))}</search>"

        def aggregate(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            return f"<answer>{rng.choice(vocab)}</answer>"

        def route_fn(agent: str, obs: str, info: Mapping[str, Any]) -> str:
            return f"\\boxed{{{rng.randint(1, env.unwrapped.n_searchers)}}}"

        return cls({"searcher": search, "aggregator": aggregate, "router": route_fn})

    @classmethod
    def random(cls, env: Any, seed: int = 0) -> ScriptedTeam:
        """Random ``Text`` samples from each agent's action space (≈0% accuracy)."""
        for i, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(seed + i)
        return cls({}, default=lambda agent, obs, info: env.action_space(agent).sample())

    @classmethod
    def fixed(cls, text: str | Mapping[str, str]) -> ScriptedTeam:
        """Every role (or each role of a mapping) always says the same text."""
        if isinstance(text, str):
            return cls({}, default=lambda agent, obs, info: text)
        return cls({role: (lambda agent, obs, info, t=t: t) for role, t in text.items()})


def _candidates(obs: str) -> list[str]:
    parts = re.split(r"\nCandidate \d+:\n", obs)
    if len(parts) <= 1:
        return []
    parts[-1] = parts[-1].rsplit("\nRole: aggregator", 1)[0]
    return parts[1:]


def _gold_in_evidence(answers: Sequence[str], obs: str) -> str | None:
    """The first gold answer that appears (SQuAD-normalised, as whole words) in the retrieved text."""

    evidence = f" {normalize_answer(obs.split('<information>', 1)[-1])} "
    for gold in answers:
        norm = normalize_answer(gold)
        if norm and f" {norm} " in evidence:
            return gold
    return None


def _wrong_answer(answer: str, rng: random.Random) -> str:
    try:
        return str(int(answer) + rng.choice([-3, -2, -1, 1, 2, 3, 10]))
    except ValueError:
        return f"{answer} + {rng.randint(1, 9)}"


def search_teacher_correct(env: Any, role: str, text: str) -> bool:
    """Whether a :meth:`ScriptedTeam.search_teacher` output (about to be stepped) is worth imitating.

    Searcher queries and aggregator search requests must name a gold passage's title; aggregator
    answers must match a gold answer (SQuAD exact match); a router's route must be one the env accepts.
    """

    base = env.unwrapped
    if role == "router":
        return parse_route(text, base.n_searchers).valid
    answer = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if answer is not None:
        return role == "aggregator" and bool(exact_match(answer.group(1), list(base.task.answers)))
    query = re.search(r"<search>(.*?)</search>", text, re.DOTALL)
    return query is not None and query.group(1).strip() in base.gold_titles
