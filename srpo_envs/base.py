"""``EventParallelEnv``: a PettingZoo ParallelEnv whose every step is one recorded decision event.

Subclasses are small state machines. They say who acts next (:meth:`_active`), what kind of event
that is (:meth:`_event_type`), what each active agent sees (:meth:`_observe`), how consumed outputs
change the state (:meth:`_transition`) and how the episode is scored (:meth:`_outcome`). This base
class owns everything that must be identical across envs: action validation and sanitisation,
the active set, event recording with a stable ``pre_state_id``, reward write-back, PettingZoo's
live-agent bookkeeping, and the transcript.

PettingZoo semantics are kept: ``agents`` are the agents live in the episode; roles that take turns
stay live between their turns and simply are not in ``active_agents``. Everyone terminates together
when the episode ends.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from srpo_envs.events import Event, EventLog, stable_hash
from srpo_envs.grading import extract_answer
from srpo_envs.spaces import TextSpaces

#: Longest action text consumed; longer outputs are truncated and flagged (a 1 MB string must not
#: blow up observations, grading time or memory).
DEFAULT_MAX_ACTION_CHARS = 8192
#: Longest observation an env emits (problem + all candidates); longer ones are cut in the middle.
DEFAULT_MAX_OBS_CHARS = 65536


@dataclass
class Parsed:
    """What an env understood from one agent's output."""

    valid: bool
    value: Any = None
    reason: str = ""


_FIRST_INT = re.compile(r"-?\d+")


def parse_route(text: str, n: int) -> Parsed:
    """A router's output: how many team members (1..``n``) the next event should have.

    The one format every routed env accepts: the first integer inside the final answer
    (:func:`srpo_envs.grading.extract_answer`: the last ``\\boxed{...}``, else the last
    ``<answer>...</answer>``), e.g. ``\\boxed{2}`` or ``<answer>2</answer>``. Anything else (no
    answer, no integer, more than six digits, outside ``1..n``) is invalid, and the env falls back to
    its ``default_route``.
    """
    answer = extract_answer(text)
    m = _FIRST_INT.search(answer) if answer is not None else None
    if m is None or len(m.group()) > 6 or not 1 <= int(m.group()) <= n:
        return Parsed(False, None, f"route must be \\boxed{{k}} with k an integer in 1..{n}")
    return Parsed(True, int(m.group()))


@dataclass
class Transition:
    """Result of consuming one event's outputs."""

    done: bool
    info: dict[str, Any] = field(default_factory=dict)


def sanitize_text(action: Any, max_chars: int) -> tuple[str, dict[str, Any]]:
    """Turn any action into consumable text; report what had to be fixed.

    Never raises: non-strings are coerced (bytes decoded, other objects rejected to ``""``), NUL bytes
    and lone surrogates are removed, and the text is cut to ``max_chars``.
    """
    flags: dict[str, Any] = {}
    if isinstance(action, bytes | bytearray):
        action = bytes(action).decode("utf-8", errors="replace")
        flags["coerced"] = "bytes"
    elif isinstance(action, np.str_):
        action = str(action)
    elif not isinstance(action, str):
        flags["coerced"] = type(action).__name__
        action = ""
    if "\x00" in action:
        action = action.replace("\x00", "")
        flags["nul_removed"] = True
    if len(action) > max_chars:
        flags["truncated_from"] = len(action)
        action = action[:max_chars]
    try:
        action.encode("utf-8")
    except UnicodeEncodeError:
        action = action.encode("utf-8", errors="replace").decode("utf-8")
        flags["surrogates_replaced"] = True
    return action, flags


def clip_middle(text: str, max_chars: int) -> str:
    """Cut ``text`` to ``max_chars`` keeping its head and tail (the question and the latest turn)."""
    if len(text) <= max_chars:
        return text
    marker = "\n[... truncated ...]\n"
    keep = max(0, max_chars - len(marker))
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]


class EventParallelEnv(TextSpaces, ParallelEnv, ABC):
    """Base class of srpo's text envs; see the module docstring for the contract."""

    metadata: dict[str, Any] = {
        "name": "srpo_event_env",
        "render_modes": ["ansi", "human"],
        "is_parallelizable": True,
    }
    #: The team reward of your own: ``reward_fn(outcome, env) -> float`` is called once when an episode
    #: ends, with the env's outcome facts (``correct``, ``answer``, ... and ``env_reward``, the env's own
    #: team reward) and the env (``env.task``, ``env.events``); its value replaces the team reward
    #: (format penalties still apply). ``None``: the env's own reward. ``Trainer(cfg, reward=...)`` sets it
    #: on the training envs; the outcome's ``correct`` (what accuracy counts) stays the env's.
    reward_fn: Callable[[dict[str, Any], Any], float] | None = None

    def __init__(
        self,
        possible_agents: list[str],
        *,
        max_steps: int = 64,
        format_penalty: float = 0.1,
        max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
        max_obs_chars: int = DEFAULT_MAX_OBS_CHARS,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.possible_agents = list(possible_agents)
        self.agents: list[str] = []
        self.max_steps = int(max_steps)
        self.format_penalty = float(format_penalty)
        self.max_action_chars = int(max_action_chars)
        self.max_obs_chars = int(max_obs_chars)
        self.render_mode = render_mode
        self.np_random, _ = seeding.np_random(None)
        self._log = EventLog()
        self._transcript: list[str] = []
        self._active_set: tuple[str, ...] = ()
        self._step_count = 0
        self._invalid_counts: dict[str, int] = {}
        self.episode_id = ""
        self.task_id = ""
        self._last_outcome: dict[str, Any] = {}

    # ------------------------------------------------------------------ hooks for subclasses
    @abstractmethod
    def _reset_episode(self, options: dict[str, Any]) -> None:
        """Pick the task (with ``self.np_random`` unless ``options`` name one) and reset the state."""
        ...

    @abstractmethod
    def _active(self) -> tuple[str, ...]:
        """The agents whose outputs the next transition consumes (a non-empty tuple while running)."""
        ...

    @abstractmethod
    def _event_type(self) -> str: ...

    @abstractmethod
    def _observe(self, agent: str) -> str:
        """Prompt text for an active agent."""
        ...

    @abstractmethod
    def _parse(self, agent: str, text: str) -> Parsed: ...

    @abstractmethod
    def _transition(self, outputs: dict[str, str], parsed: dict[str, Parsed]) -> Transition: ...

    @abstractmethod
    def _shared_state(self) -> dict[str, Any]:
        """JSON-serialisable shared state; hashed into ``pre_state_id`` and rendered by :meth:`state`."""
        ...

    @abstractmethod
    def _outcome(self) -> tuple[float, dict[str, Any]]:
        """Team outcome reward of the finished episode and facts about it (``correct``...)."""
        ...

    @abstractmethod
    def state_text(self) -> str:
        """The shared state as text: what a centralised critic reads."""
        ...

    # ------------------------------------------------------------------ public API
    @property
    def active_agents(self) -> tuple[str, ...]:
        """The active set of the next event (empty once the episode is over)."""
        return self._active_set

    @property
    def events(self) -> list[Event]:
        """The current episode's events, in order."""
        return self._log.to_list()

    @property
    def outcome(self) -> dict[str, Any]:
        """Facts about the last finished episode (``reward``, ``correct``...); empty while running."""
        return dict(self._last_outcome)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode. All or nothing: if it raises (an unknown ``task_id``, a task of the
        wrong type, a failing subclass hook) the env is left exactly as it was, RNG included, so
        the episode in progress can still be stepped and a retry draws what it would have."""
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        saved, saved_rng = dict(self.__dict__), self.np_random.bit_generator.state
        try:
            return self._reset(seed, dict(options or {}))
        except BaseException:
            self.__dict__.clear()  # shallow restore: reset hooks assign fresh objects, never mutate old ones
            self.__dict__.update(saved)
            self.np_random.bit_generator.state = saved_rng  # undo draws made before the failure
            raise

    def _reset(self, seed: int | None, options: dict[str, Any]):
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.agents = list(self.possible_agents)
        self._log = EventLog()
        self._transcript = []
        self._step_count = 0
        self._invalid_counts = {a: 0 for a in self.possible_agents}
        self._last_outcome = {}
        self._reset_episode(options)
        self.episode_id = str(options.get("episode_id") or f"ep-{int(self.np_random.integers(2**62)):016x}")
        self._active_set = tuple(self._active())
        self._transcript.append(f"# episode {self.episode_id} task {self.task_id}")
        observations = {a: self._observation_for(a) for a in self.agents}
        infos = {a: self._info_for(a, None) for a in self.agents}
        return observations, infos

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise ValueError("step() called on a finished episode; call reset() first")
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict agent -> text, got {type(actions).__name__}")
        unknown = [a for a in actions if a not in self.agents]
        if unknown:
            raise ValueError(
                f"actions for agents that are not live: {unknown}; live agents are {self.agents}"
            )
        missing = [a for a in self._active_set if a not in actions]
        if missing:
            raise ValueError(
                f"missing actions for active agents {missing}; the active set is {list(self._active_set)}"
            )

        members = self._active_set
        pre_state_id = stable_hash(self._shared_state())
        event_type = self._event_type()
        outputs: dict[str, str] = {}
        parsed: dict[str, Parsed] = {}
        flags: dict[str, dict[str, Any]] = {}
        for agent in members:
            text, f = sanitize_text(actions[agent], self.max_action_chars)
            outputs[agent] = text
            p = self._safe_parse(agent, text)
            if f.get("coerced") and f["coerced"] != "bytes":
                p = Parsed(False, None, f"action of type {f['coerced']} is not text")
            parsed[agent] = p
            if f:
                flags[agent] = f
            if not p.valid:
                self._invalid_counts[agent] += 1

        transition = self._transition(outputs, parsed)
        step_index = self._step_count
        self._step_count += 1
        info = dict(transition.info)
        if flags:
            info["sanitized"] = flags
        invalid = {a: p.reason for a, p in parsed.items() if not p.valid}
        if invalid:
            info["invalid"] = invalid
        event = Event(
            event_id=f"{self.episode_id}/{step_index}",
            episode_id=self.episode_id,
            step=step_index,
            pre_state_id=pre_state_id,
            event_type=event_type,
            members=members,
            outputs=outputs,
            valid={a: p.valid for a, p in parsed.items()},
            task_id=self.task_id,
            info=info,
        )
        self._log.append(event)
        self._transcript.append(self._format_event(event))

        truncated = not transition.done and self._step_count >= self.max_steps
        done = transition.done or truncated
        rewards = {a: 0.0 for a in self.agents}
        if done:
            team, facts = self._outcome()
            if self.reward_fn is not None:
                facts = {**facts, "env_reward": team}
                team = self._own_reward(facts)
            self._log.finalize([team - (self.format_penalty if not e.all_valid else 0.0) for e in self._log])
            for a in self.agents:
                rewards[a] = team - (self.format_penalty if self._invalid_counts.get(a) else 0.0)
            self._last_outcome = {"reward": team, "truncated": truncated, **facts}
            self._transcript.append(
                f"# outcome reward={team:.3f} " + " ".join(f"{k}={v}" for k, v in facts.items())
            )
            self._active_set = ()
        else:
            self._active_set = tuple(self._active())

        observations = {a: self._observation_for(a) for a in self.agents}
        terminations = {a: bool(done and not truncated) for a in self.agents}
        truncations = {a: bool(truncated) for a in self.agents}
        infos = {a: self._info_for(a, event if a in members else None) for a in self.agents}
        if done:
            for a in self.agents:
                infos[a]["outcome"] = dict(self._last_outcome)
            self.agents = []
        if self.render_mode == "human":
            print(self._transcript[-1])
        return observations, rewards, terminations, truncations, infos

    def _own_reward(self, facts: dict[str, Any]) -> float:
        """:attr:`reward_fn`'s team reward for this episode: a finite number (a bool counts as 0/1), else
        a ``ValueError`` that names the function (a NaN reward must not reach an advantage)."""
        fn = self.reward_fn
        value = fn(dict(facts), self)  # type: ignore[misc]
        name = getattr(fn, "__qualname__", repr(fn))
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value):
            raise ValueError(f"reward_fn {name} returned {value!r}; it must return a finite number")
        return float(value)

    def state(self) -> str:
        return self.state_text()

    def render(self) -> str | None:
        text = "\n".join(self._transcript)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ helpers
    def _pick_task(self, tasks: list[Any], options: dict[str, Any]) -> Any:
        """The episode's task: ``options["task"]``, ``["task_id"]``, ``["task_index"]`` (mod len), else
        a uniform draw with the env's seeded ``np_random`` (so ``reset(seed=s)`` is reproducible)."""
        if "task" in options:
            task, kind = options["task"], type(tasks[0])
            if not isinstance(task, kind):
                raise TypeError(
                    f'options["task"] must be a {kind.__name__}, got {type(task).__name__} {task!r:.60}; '
                    'to choose a task by its id pass options={"task_id": ...}'
                )
            return task
        if "task_id" in options:
            for task in tasks:
                if task.id == options["task_id"]:
                    return task
            raise ValueError(f"task_id {options['task_id']!r} is not in this env's dataset")
        if "task_index" in options:
            return tasks[int(options["task_index"]) % len(tasks)]
        return tasks[int(self.np_random.integers(len(tasks)))]

    def _safe_parse(self, agent: str, text: str) -> Parsed:
        """Parsing is user-extensible; a parser bug must flag the output, not crash the episode."""
        try:
            return self._parse(agent, text)
        except Exception as exc:  # noqa: BLE001 - any parser failure means "malformed output"
            return Parsed(False, None, f"parse error: {type(exc).__name__}")

    def _observation_for(self, agent: str) -> str:
        if agent in self._active_set:
            return clip_middle(self._observe(agent), self.max_obs_chars)
        who = ", ".join(self._active_set) or "nobody"
        return f"[{agent}] waiting: this turn the active agents are {who}."

    def _info_for(self, agent: str, event: Event | None) -> dict[str, Any]:
        info: dict[str, Any] = {"active": agent in self._active_set, "role": self.role_of(agent)}
        if info["active"]:
            info["event_type"] = self._event_type()
        if event is not None:
            info["event_id"] = event.event_id
            info["valid"] = event.valid[agent]
        return info

    def role_of(self, agent: str) -> str:
        """Role name of an agent (``proposer_2`` -> ``proposer``): the key for role prompts and policies."""
        head, _, tail = agent.rpartition("_")
        return head if tail.isdigit() else agent

    def _format_event(self, event: Event) -> str:
        lines = [
            f"## step {event.step} [{event.event_type}] K={event.k} state={event.pre_state_id}"
        ]
        for m in event.members:
            mark = "" if event.valid[m] else "  (invalid)"
            text = event.outputs[m]
            if len(text) > 400:
                text = text[:400] + f"... [{len(text)} chars]"
            lines.append(f"- {m}{mark}: {text}")
        return "\n".join(lines)
