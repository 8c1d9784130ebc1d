"""srpo's envs as a verifiers environment: taskset id ``srpo-verifiers`` (verifiers 0.4, ``verifiers.v1``).

verifiers (Prime Intellect) resolves a taskset id to an importable module exporting one ``Taskset`` and,
for a multi-agent env, one ``Env`` subclass; this module is that plugin. Every registered srpo env plays
through it, the math-verification workflows (solver-verifier, proposers-aggregator, routed) and the
multi-turn search team alike::

    vf-eval srpo-verifiers --env.taskset.env MathVerify-SolverVerifier-v0 --env.taskset.num-tasks 8 \\
        --model M --client.base-url http://HOST/v1 --no-push
    vf-validate srpo-verifiers --taskset.env ProcArith-v0 --taskset.num-tasks 8

What maps to what (docs/verifiers.md):

* **Task** = one srpo episode: ``env`` (a registered id), ``env_kwargs``, ``seed`` and ``task_index``
  (``reset(seed, options={"task_index": i})``), so task ``i`` is problem ``i`` of the env's dataset.
* **Seats** = srpo *roles*: ``solver``, ``verifier``, ``proposer``, ``aggregator``, ``router``,
  ``searcher``, each an ``AgentConfig`` (``--env.verifier.model X`` gives a role its own model; a
  seat the env does not use stays idle). Agents of one role (``proposer_0``, ``proposer_1``) share its
  seat. Every seat defaults to verifiers' tool-less ``null`` chat harness in the local ``subprocess``
  runtime.
* **One decision event** = one interaction per member of the active set, each a single turn whose user
  message is the member's observation and whose system prompt is srpo's role prompt
  (:mod:`agents.prompts`): the same two messages srpo's own policies send. A set of K members is K
  traces; verifiers runs them one at a time (``--env.max-concurrent-agents``).
* **Reward**: verifiers scores a trace once; srpo rewards an agent once, when the episode ends. Every
  trace of an agent therefore carries that agent's episode reward (team reward minus its format
  penalty), recorded as ``srpo_reward`` by the task's reward function, which *replays* the episode in a
  fresh srpo env from the outputs stored in the trace's state and checks the live env agreed. The
  per-event structure (which members acted together, the env's event type) is kept in metrics
  (``k``, ``correct``), in ``trace.info`` (``srpo_agent``, ``srpo_event``: which agent, which event) and
  in the trace's state, not in the reward.
* ``vf-validate``: the gold check plays srpo's scripted oracle team and passes when it earns the full
  reward; the no-op check scores an untouched trace (every member silent), which must not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.harnesses.null import NullHarnessConfig
from verifiers.v1.runtimes import SubprocessConfig

from agents.prompts import prompts_for_env
from agents.scripted import ScriptedTeam
from srpo_envs import make

__all__ = ["SrpoEnv", "SrpoTaskset"]

#: The roles of srpo's registered envs; each is a verifiers seat.
ROLES = ("solver", "verifier", "proposer", "aggregator", "router", "searcher")
#: An episode ends within this many events even when every member of a replay is silent.
_MAX_REPLAY_EVENTS = 256


class SrpoData(vf.TaskData):
    """One srpo episode: which env, built how, and which of its problems."""

    env: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    task_index: int = 0


class SrpoState(vf.State):
    """What a trace of an srpo episode carries for its scoring: whose it is and the whole episode."""

    agent: str = ""
    """The srpo agent (``proposer_1``) whose output this trace is; empty for an untouched trace."""
    event: int = -1
    """The index of the event this output belongs to."""
    episode: list[dict[str, Any]] = Field(default_factory=list)
    """Every event of the episode: ``{"members": [...], "outputs": {agent: text}}``, in order."""


def make_env(data: SrpoData) -> Any:
    """A fresh srpo env for the task, reset to its problem; ``(env, observations, infos)``."""
    env = make(data.env, **data.env_kwargs)
    obs, infos = env.reset(seed=data.seed, options={"task_index": data.task_index})
    return env, obs, infos


def replay(data: SrpoData, episode: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    """Play ``episode``'s outputs in a fresh env; every agent's summed reward and the env's outcome.

    An episode that stops early (an untouched trace) is finished with every active member silent."""
    env, _, _ = make_env(data)
    totals = dict.fromkeys(env.possible_agents, 0.0)
    for i, event in enumerate(episode):
        if tuple(event["members"]) != tuple(env.active_agents):
            raise ValueError(
                f"event {i} of the recorded episode has members {event['members']}, but the env's active set "
                f"is {list(env.active_agents)}: the recording is not of this task"
            )
        _, rewards, *_ = env.step(dict(event["outputs"]))
        for agent, value in rewards.items():
            totals[agent] += value
    for _ in range(_MAX_REPLAY_EVENTS):
        if not env.agents:
            break
        _, rewards, *_ = env.step(dict.fromkeys(env.active_agents, ""))
        for agent, value in rewards.items():
            totals[agent] += value
    return totals, env.outcome


class SrpoTask(vf.Task[SrpoData, SrpoState]):
    """An srpo episode as a verifiers task: scored by replaying it, validated by the oracle team."""

    @vf.reward
    async def srpo_reward(self, trace: vf.Trace) -> float:
        """The episode reward of the agent whose output this trace is (an untouched trace: the best any
        silent member earns)."""
        totals, _ = replay(self.data, trace.state.episode)
        agent = trace.state.agent
        return totals[agent] if agent else max(totals.values())

    async def validate(self, runtime: Any = None) -> bool | None:
        """The gold check: srpo's scripted oracle team earns the full reward on this problem."""
        env, obs, infos = make_env(self.data)
        search = "search" in str(env.unwrapped.metadata.get("name", ""))
        team = ScriptedTeam.search_oracle(env) if search else ScriptedTeam.oracle(env)
        while env.agents:
            obs, _, _, _, infos = env.step(team.act(obs, infos))
        return bool(env.outcome.get("correct"))


class SrpoTasksetConfig(vf.TasksetConfig):
    """Which srpo env, and how many of its problems, the taskset yields."""

    env: str = "MathVerify-SolverVerifier-v0"
    """A registered srpo env id (``srpo envs`` lists them)."""
    env_kwargs: dict[str, Any] = Field(default_factory=lambda: {"split": "test"})
    """Keyword arguments for the env (``split``, ``dataset``, ``n_proposers``...)."""
    num_tasks: int = Field(64, ge=1)
    """Problems 0..num_tasks-1 of the env's dataset, one task each."""
    seed: int = 0
    """The env seed of task i is seed + i."""


class SrpoTaskset(vf.Taskset[SrpoTask, SrpoTasksetConfig]):
    """Tasks ``0..num_tasks-1``: problem i of the env's dataset, seeded ``seed + i``."""

    def load(self) -> Iterator[SrpoTask]:
        c = self.config
        for i in range(c.num_tasks):
            data = SrpoData(
                name=f"{c.env}#{i}", prompt=None, env=c.env, env_kwargs=dict(c.env_kwargs), seed=c.seed + i,
                task_index=i,
            )
            yield SrpoTask(data, c.task)


def _seat() -> vf.AgentConfig:
    return vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=SubprocessConfig())


class SrpoEnvConfig(vf.EnvConfig):
    """One seat per srpo role; a seat the env does not use stays idle."""

    solver: vf.AgentConfig = _seat()
    verifier: vf.AgentConfig = _seat()
    proposer: vf.AgentConfig = _seat()
    aggregator: vf.AgentConfig = _seat()
    router: vf.AgentConfig = _seat()
    searcher: vf.AgentConfig = _seat()


class SrpoEnv(vf.Env[SrpoEnvConfig]):
    """Plays one srpo episode: each event's members answer their observations, the env steps, and every
    trace is scored with its agent's episode reward once the episode ends."""

    async def run(self, task: SrpoTask, agents: vf.Agents) -> None:
        env, obs, _ = make_env(task.data)
        prompts = prompts_for_env(env)
        quiet = task.defer_scoring()  # a trace is scored once the episode's rewards exist
        played: list[tuple[str, int, vf.Trace]] = []
        episode: list[dict[str, Any]] = []
        totals = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            members = env.active_agents
            answers = await asyncio.gather(
                *(self._ask(agents, quiet, env.role_of(a), prompts.system(env.role_of(a)), obs[a]) for a in members)
            )
            outputs = {a: text for a, (text, _) in zip(members, answers, strict=True)}
            played += [(a, len(episode), trace) for a, (_, trace) in zip(members, answers, strict=True)]
            episode.append({"members": list(members), "outputs": outputs})
            obs, rewards, *_ = env.step(outputs)
            for agent, value in rewards.items():
                totals[agent] += value
        correct = float(bool(env.outcome.get("correct")))
        for agent, index, trace in played:
            trace.state.agent, trace.state.event, trace.state.episode = agent, index, episode
            await task.score(trace)
            scored = trace.rewards["srpo_reward"]
            if scored is None or abs(scored.score - totals[agent]) > 1e-9:
                raise RuntimeError(
                    f"the replayed reward of {agent} ({scored and scored.score}) differs from the live env's "
                    f"({totals[agent]}): the env is not deterministic in its outputs"
                )
            trace.info.update(srpo_agent=agent, srpo_event=index)  # traces.jsonl leaves the state out
            trace.record_metric("correct", correct)
            trace.record_metric("k", float(len(episode[index]["members"])))

    @staticmethod
    async def _ask(
        agents: vf.Agents, task: SrpoTask, role: str, system: str, observation: str
    ) -> tuple[str, vf.Trace]:
        """One member's output: a single turn of its role's seat, srpo's role prompt as the system prompt."""
        seat = getattr(agents, role)
        async with seat.interaction(task.with_data(system_prompt=system or None)) as interaction:
            segment = await interaction.turn(observation)
        return segment.last_reply, interaction.trace
