"""Rollout collection: run B tasks x G samples, batch every round's generations, emit rows.

All envs of a collection advance in lock-step rounds. In each round every active agent of every
live env becomes one :class:`GenerationRequest`, and the whole round goes to the policy map in one
``generate`` call (the map batches per distinct policy), so the members of an event across all G
rollouts of a task are generated together. After the episodes end, the env's recorded events — with
their rewards written back — are joined with the generations into :class:`~agents.rows.Row` s.

Each request carries its own sampling seed derived from (collection seed, episode, step, agent), so
a collection is reproducible whatever the batch composition.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from agents.policy import Generation, GenerationRequest, PolicyMap, SamplingParams
from agents.prompts import RolePrompts, prompts_for_env
from agents.rows import Row


@dataclass
class EpisodeStats:
    """Per-episode facts for analysis and token-normalised metrics."""

    episode_id: str
    task_id: str
    group_id: str
    reward: float
    correct: bool
    turns: int
    team_tokens: int
    tool_calls: int
    ks: list[int]
    event_types: list[str]


@dataclass
class RolloutBatch:
    rows: list[Row]
    episodes: list[EpisodeStats]
    events: dict[str, list[Any]] = field(default_factory=dict)  # episode_id -> the env's events

    @property
    def accuracy(self) -> float:
        return sum(e.correct for e in self.episodes) / max(1, len(self.episodes))

    @property
    def mean_reward(self) -> float:
        return sum(e.reward for e in self.episodes) / max(1, len(self.episodes))


def merge_batches(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """Concatenate rollout batches in the given order (rows, episodes and events): the shares of
    several workers or ranks, or an iteration's several rollout batches."""
    events: dict[str, list[Any]] = {}
    for b in batches:
        events.update(b.events)
    return RolloutBatch(
        rows=list(itertools.chain.from_iterable(b.rows for b in batches)),
        episodes=list(itertools.chain.from_iterable(b.episodes for b in batches)),
        events=events,
    )


def _request_seed(seed: int, episode_id: str, step: int, agent: str) -> int:
    digest = hashlib.sha256(f"{seed}|{episode_id}|{step}|{agent}".encode()).hexdigest()
    return int(digest[:8], 16)


def _run_all(calls: Sequence[Callable[[], Any]], envs: Sequence[Any]) -> list[Any]:
    """Every env's reset or step, in order; at once on up to ``metadata["concurrent_envs"]`` threads when
    every env says its calls mostly wait on something else (``Verifiers-v0``: a harness process per model
    call), so that waits overlap. Results keep their order: what an episode does never depends on when."""
    limit = min((int(getattr(e, "metadata", {}).get("concurrent_envs", 1)) for e in envs), default=1)
    if limit <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(limit, len(calls)), thread_name_prefix="srpo-env") as pool:
        return list(pool.map(lambda call: call(), calls))


class RolloutCollector:
    """Runs an env with a role -> policy map and turns the episodes into learner rows.

    Args:
        env_fn: builds one env (called once per parallel rollout and kept for reuse).
        policies: role -> policy routing.
        sampling: sampling params for all roles, or a role -> params mapping.
        prompts: role prompts (defaults to the table of the env's domain).
    """

    def __init__(
        self,
        env_fn: Callable[[], Any],
        policies: PolicyMap,
        sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
        prompts: RolePrompts | None = None,
    ) -> None:
        self.env_fn = env_fn
        self.policies = policies
        self.sampling = sampling or SamplingParams()
        self._envs: list[Any] = []
        self.prompts = prompts or prompts_for_env(self._env_pool(1)[0])

    def _env_pool(self, n: int) -> list[Any]:
        while len(self._envs) < n:
            self._envs.append(self.env_fn())
        return self._envs[:n]

    def _sampling_for(self, role: str) -> SamplingParams:
        if isinstance(self.sampling, SamplingParams):
            return self.sampling
        return self.sampling.get(role, self.sampling.get("default", SamplingParams()))

    def collect(self, task_indices: Sequence[int], group_size: int = 1, seed: int = 0) -> RolloutBatch:
        """Roll out ``group_size`` episodes of each task index; returns rows and episode stats."""
        if group_size < 1 or not task_indices:
            raise ValueError("need at least one task and group_size >= 1")
        plan = [(t, g) for t in task_indices for g in range(group_size)]
        envs = self._env_pool(len(plan))
        obs: list[dict[str, str]] = []
        infos: list[dict[str, dict[str, Any]]] = []
        group_ids: list[str] = []
        resets: list[Callable[[], Any]] = []
        for (task, g), env in zip(plan, envs, strict=True):
            group_id = f"s{seed}-t{task}"
            episode_id = f"{group_id}-g{g}"
            reset_seed = _request_seed(seed, episode_id, -1, "reset")
            options = {"task_index": task, "episode_id": episode_id}
            resets.append(lambda env=env, s=reset_seed, o=options: env.reset(seed=s, options=o))
            group_ids.append(group_id)
        for o, inf in _run_all(resets, envs):
            obs.append(o)
            infos.append(inf)
        # (env index, step) -> {agent: (generation, state_text)}
        consumed: dict[tuple[int, int], dict[str, tuple[Generation, str]]] = {}
        while True:
            live = [i for i, env in enumerate(envs) if env.agents]
            if not live:
                break
            requests: list[GenerationRequest] = []
            owners: list[tuple[int, str]] = []
            for i in live:
                env = envs[i]
                step = len(env.events)
                for agent in env.active_agents:
                    role = infos[i][agent]["role"]
                    sampling = self._sampling_for(role)
                    sampling = replace(sampling, seed=_request_seed(seed, env.episode_id, step, agent))
                    requests.append(
                        GenerationRequest(agent, role, self.prompts.messages(role, obs[i][agent]), sampling)
                    )
                    owners.append((i, agent))
            generations = self.policies.generate(requests)
            actions: dict[int, dict[str, str]] = {i: {} for i in live}
            for (i, agent), gen in zip(owners, generations, strict=True):
                actions[i][agent] = gen.text
                consumed.setdefault((i, len(envs[i].events)), {})[agent] = (gen, envs[i].state())
            steps = [lambda env=envs[i], a=actions[i]: env.step(a) for i in live]
            for i, (o, _, _, _, inf) in zip(live, _run_all(steps, [envs[i] for i in live]), strict=True):
                obs[i], infos[i] = o, inf
        return self._to_batch(envs, plan, group_ids, consumed)

    def _to_batch(
        self,
        envs: list[Any],
        plan: list[tuple[int, int]],
        group_ids: list[str],
        consumed: dict[tuple[int, int], dict[str, tuple[Generation, str]]],
    ) -> RolloutBatch:
        rows: list[Row] = []
        episodes: list[EpisodeStats] = []
        events_by_episode: dict[str, list[Any]] = {}
        for i, env in enumerate(envs[: len(plan)]):
            outcome = env.outcome
            # The env records each event's reward as the team outcome minus that event's penalty; the
            # row carries both terms so learners never re-derive one from the other.
            team = float(outcome.get("reward", 0.0))
            team_tokens = 0
            events = env.events
            events_by_episode[env.episode_id] = events
            for event in events:
                gens = consumed[(i, event.step)]
                for m, agent in enumerate(event.members):
                    gen, state_text = gens[agent]
                    team_tokens += len(gen.token_ids)
                    rows.append(
                        Row(
                            event_id=event.event_id,
                            episode_id=event.episode_id,
                            pre_state_id=event.pre_state_id,
                            event_type=event.event_type,
                            step=event.step,
                            agent=agent,
                            role=env.role_of(agent),
                            member_index=m,
                            k=event.k,
                            prompt_ids=list(gen.prompt_ids),
                            response_ids=list(gen.token_ids),
                            response_mask=[1] * len(gen.token_ids),
                            behaviour_logprobs=[float(x) for x in gen.logprobs],
                            policy_version=gen.policy_version,
                            task_id=event.task_id,
                            group_id=group_ids[i],
                            reward=float(event.reward),
                            outcome_reward=team,
                            penalty=team - float(event.reward),
                            # the env's own charge, part of ``team`` unless a reward_fn replaced it
                            member_cost=0.0 if "env_reward" in outcome else float(outcome.get("member_cost", 0.0)),
                            correct=bool(outcome.get("correct", False)),
                            state_text=state_text,
                            response_text=event.outputs[agent],
                            meta={
                                "valid": bool(event.valid[agent]),
                                "finish_reason": gen.finish_reason,
                                **({"evaluation_only": gen.evaluation_only} if gen.evaluation_only else {}),
                            },
                        )
                    )
            episodes.append(
                EpisodeStats(
                    episode_id=env.episode_id,
                    task_id=env.task_id,
                    group_id=group_ids[i],
                    reward=float(outcome.get("reward", 0.0)),
                    correct=bool(outcome.get("correct", False)),
                    turns=len(events),
                    team_tokens=team_tokens,
                    tool_calls=sum(int(e.info.get("tool_calls", 0)) for e in events),
                    ks=[e.k for e in events],
                    event_types=[e.event_type for e in events],
                )
            )
        return RolloutBatch(rows=rows, episodes=episodes, events=events_by_episode)
