"""One conformance check for every env: PettingZoo's API and seed tests, the event contract, adversarial text.

``check_env(make)`` is what the test suite runs on every registered env, and what an env author runs on
theirs (docs/adding-an-env.md)::

    from srpo_envs.conformance import check_env

    check_env(lambda: MyEnv())            # raises AssertionError naming the first broken rule

What it checks:

* PettingZoo's own ``parallel_api_test`` and ``parallel_seed_test`` (spaces, live agents, dict keys,
  the same seed giving the same episode);
* the trainer's contract: ``env.unwrapped.tasks`` is a non-empty sequence (tasks are drawn from it by
  index), ``role_of(agent)`` names a role for every possible agent (policies and prompts are per role),
  and ``state()`` is text (a centralised critic reads it);
* the event contract over ``steps`` steps of random ``Text`` samples and :data:`ADVERSARIAL` strings
  (empty, 1 MB, NUL bytes, lone surrogates, bytes, None, numbers): each step records exactly one event
  whose members are the active set as it stood before the step, ``k == len(members)``, one output per
  member, each output sanitised (no NUL, at most ``max_action_chars``), every member's info naming the
  event; when an episode ends every event carries its reward; no step raises or takes ``max_step_s``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Outputs an LLM (or an attacker) may send: each must be consumed as (flagged) text, never crash a step.
ADVERSARIAL: list[Any] = [
    "",
    "no answer at all",
    "x" * 1_000_000,
    "\x00\x00 \\boxed{1}\x00",
    "\\boxed{",
    "\\boxed{10**10**10}",
    "\\boxed{10^{10^{10}}}",
    "\ud800\udfff lone surrogates \\boxed{\ud800}",
    "".join(chr(random.Random(0).randint(32, 0x2FFF)) for _ in range(300)),
    "<answer>" * 1000,
    "\\boxed{accept}",
    "\\boxed{reject}",
    "\\boxed{2}",
    "\\boxed{99999999999999999999}",
    b"bytes \\boxed{1}",
    None,
    12345,
]


def check_api(make: Callable[[], Any], num_cycles: int = 300) -> None:
    """PettingZoo's ``parallel_api_test`` and ``parallel_seed_test``, and the trainer's contract."""
    from pettingzoo.test import parallel_api_test, parallel_seed_test

    env = make()
    parallel_api_test(env, num_cycles=num_cycles)
    parallel_seed_test(make)
    env = make()
    tasks = getattr(env.unwrapped, "tasks", None)
    assert isinstance(tasks, Sequence) and len(tasks) > 0, "env.unwrapped.tasks must be a non-empty sequence"
    for agent in env.possible_agents:
        role = env.role_of(agent)
        assert isinstance(role, str) and role, f"role_of({agent!r}) must name a role, got {role!r}"
    env.reset(seed=0)
    assert isinstance(env.state(), str), "state() must be text (what a centralised critic reads)"


def check_events(make: Callable[[], Any], steps: int = 2000, seed: int = 0, max_step_s: float = 3.0) -> None:
    """``steps`` steps of random and adversarial actions; the event contract after each (module docstring)."""
    env = make()
    rng = random.Random(seed)
    for agent in env.possible_agents:
        env.action_space(agent).seed(seed + 1)
    env.reset(seed=seed)
    slowest = 0.0
    for i in range(steps):
        if not env.agents:
            env.reset(seed=seed + i)
        active_before = tuple(env.active_agents)
        assert active_before, "a running episode must have a non-empty active set"
        n_before = len(env.events)
        actions = {
            a: (rng.choice(ADVERSARIAL) if rng.random() < 0.5 else env.action_space(a).sample()) for a in env.agents
        }
        start = time.monotonic()
        _, _, _, _, infos = env.step(actions)
        slowest = max(slowest, time.monotonic() - start)
        events = env.events
        assert len(events) == n_before + 1, "each step records exactly one event"
        event = events[-1]
        assert event.members == active_before, f"event members {event.members} != active set {active_before}"
        assert event.k == len(event.members)
        assert set(event.outputs) == set(active_before)
        for a in active_before:
            assert infos[a]["event_id"] == event.event_id
            assert len(event.outputs[a]) <= env.max_action_chars
            assert "\x00" not in event.outputs[a]
        if not env.agents:  # the episode ended: every event carries its (finite) reward
            assert all(e.reward is not None and math.isfinite(e.reward) for e in events), "rewards not written back"
    assert slowest < max_step_s, f"slowest step took {slowest:.2f}s"


def check_env(make: Callable[[], Any], steps: int = 2000, num_cycles: int = 300) -> None:
    """Everything above: :func:`check_api`, then :func:`check_events`."""
    check_api(make, num_cycles=num_cycles)
    check_events(make, steps=steps)


__all__ = ["ADVERSARIAL", "check_api", "check_env", "check_events"]
