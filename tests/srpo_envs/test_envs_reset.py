"""``reset`` is all or nothing: a failed reset leaves the env as it was, and bad options are clear errors."""

from __future__ import annotations

import pytest

import srpo_envs

ENV_IDS = [
    "MathVerify-SolverVerifier-v0",
    "ProcArith-v0",
    pytest.param("MultiTurnSearch-v0", marks=pytest.mark.search),
]
BAD_OPTIONS = [
    {"task_id": "no-such-task"},
    {"task": "a string, not a task"},
    {"task": 42},
    {"task_index": "first"},
]


@pytest.fixture(scope="module")
def envs():
    made: dict[str, object] = {}

    def get(env_id: str):
        if env_id not in made:
            made[env_id] = srpo_envs.make(env_id)
        return made[env_id]

    yield get
    for env in made.values():
        env.close()


def _snapshot(env) -> tuple:
    return (
        list(env.agents),
        env.active_agents,
        env.task_id,
        env.episode_id,
        [e.event_id for e in env.events],
        env.render(),
        env.state(),
        env.outcome,
        env.np_random.bit_generator.state,
    )


@pytest.mark.parametrize("bad", BAD_OPTIONS, ids=["unknown-task-id", "task-str", "task-int", "index-str"])
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_failed_reset_leaves_the_episode_in_progress_untouched(envs, env_id: str, bad: dict) -> None:
    """Regression: the base class cleared the log, agents and counters before the task lookup failed."""
    env = envs(env_id)
    env.reset(seed=3)
    env.step({a: "\\boxed{1} <search>capital</search>" for a in env.active_agents})
    assert env.agents, "the first event should not end these episodes"
    before = _snapshot(env)
    with pytest.raises((ValueError, TypeError)):
        env.reset(seed=9, options=bad)
    assert _snapshot(env) == before
    env.step({a: "\\boxed{2} <answer>x</answer>" for a in env.active_agents})  # it still steps on
    assert len(env.events) == 2


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_task_option_of_the_wrong_type_is_a_clear_error(envs, env_id: str) -> None:
    """Regression: ``{"task": "str"}`` raised AttributeError ('str' object has no attribute 'id')."""
    env = envs(env_id)
    with pytest.raises(TypeError, match=r'options\["task"\] must be a \w+Task, got str.*task_id'):
        env.reset(options={"task": "str"})
    with pytest.raises(TypeError, match="options must be a dict or None, got str"):
        env.reset(options="task")
    task = env.tasks[1]
    env.reset(options={"task": task})
    assert env.task_id == task.id


def test_a_failed_reset_draws_nothing_from_the_rng() -> None:
    a, b = srpo_envs.make("ProcArith-v0"), srpo_envs.make("ProcArith-v0")
    a.reset(seed=5)
    b.reset(seed=5)
    with pytest.raises(ValueError):
        a.reset(options={"task_id": "no-such-task"})
    a.reset()
    b.reset()
    assert (a.task_id, a.episode_id) == (b.task_id, b.episode_id)
