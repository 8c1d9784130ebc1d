"""Ray rollout workers: identical rows with 1 and 2 workers (and in-process), weight broadcast."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import srpo_envs
from agents.policy import PolicyMap, SamplingParams
from agents.ray_rollout import HFPolicyFactory, merge_batches, split_tasks
from agents.rollout import RolloutCollector

ray = pytest.importorskip("ray")

ENV_ID, ENV_KWARGS = "ProcArith-v0", {"workflow": "proposers-aggregator"}


#: picklable by value-free reference: Ray workers cannot import this test module
_env = functools.partial(srpo_envs.make, ENV_ID, **ENV_KWARGS)


@pytest.fixture(scope="module")
def ray_runtime():
    """One small local Ray for the whole module (starting Ray costs seconds)."""
    started = not ray.is_initialized()
    if started:
        from agents.ray_rollout import ensure_ray

        ensure_ray(num_cpus=2)
    yield ray
    if started:
        from agents.ray_rollout import shutdown_ray

        shutdown_ray()


def test_split_tasks_contiguous_and_balanced() -> None:
    assert split_tasks([3, 1, 4, 1, 5], 2) == [[3, 1, 4], [1, 5]]
    assert split_tasks([7], 3) == [[7]]
    assert sum(split_tasks(list(range(10)), 4), []) == list(range(10))
    with pytest.raises(ValueError):
        split_tasks([1], 0)


ROLES = ("aggregator", "proposer")
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=8)
#: Behaviour log-probs of the same token under a different batch composition (a worker sees only its
#: share of the round's requests) differ by float32 reduction-order round-off (measured 5e-7); every
#: discrete field must be identical.
LOGPROB_TOL = 1e-5


def _discrete(row) -> dict:
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row) if f.name != "behaviour_logprobs"}


def assert_same_rows(got, want) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert _discrete(a) == _discrete(b)
        assert len(a.behaviour_logprobs) == len(b.behaviour_logprobs)
        diffs = [abs(x - y) for x, y in zip(a.behaviour_logprobs, b.behaviour_logprobs, strict=True)]
        assert max(diffs, default=0.0) <= LOGPROB_TOL


@pytest.fixture(scope="module")
def pools(ray_runtime, tiny_model_dir):
    from agents.ray_rollout import RolloutWorkerPool

    factory = HFPolicyFactory(str(tiny_model_dir), ROLES)
    # 3 actors on the module's 2 logical CPUs: half a CPU each (Ray would wait for a free CPU forever)
    made = {n: RolloutWorkerPool(factory, n, num_cpus=0.5) for n in (1, 2)}
    yield factory, made
    for pool in made.values():
        pool.shutdown()


@pytest.mark.slow
def test_one_and_two_workers_give_identical_rows(pools) -> None:
    factory, made = pools
    tasks, group, seed = [0, 3, 5], 2, 11
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' setting: the same float reduction order as the 1-worker run
    try:
        local = RolloutCollector(_env, factory(), SAMPLING).collect(tasks, group, seed)
    finally:
        torch.set_num_threads(torch_threads)
    one = made[1].collector(_env, SAMPLING).collect(tasks, group, seed)
    two = made[2].collector(_env, SAMPLING).collect(tasks, group, seed)
    assert one.rows == local.rows  # same process layout: bit-identical
    assert_same_rows(two.rows, one.rows)
    assert [e.episode_id for e in two.episodes] == [e.episode_id for e in local.episodes]
    assert list(two.events) == list(local.events)


@pytest.mark.slow
def test_weight_broadcast_sets_weights_and_versions(pools) -> None:
    from agents.ray_rollout import model_states

    factory, made = pools
    pool = made[2]
    learner = factory()
    with torch.no_grad():
        for p in learner.policies[0].model.parameters():
            p.mul_(0.5)
    learner.policies[0].policy_version = 3
    collector = pool.collector(_env, SAMPLING)
    before = collector.collect([1, 2], 1, seed=5)
    pool.load_weights(model_states(learner), [p.policy_version for p in learner.policies])
    assert pool.versions() == [[3], [3]]
    after = collector.collect([1, 2], 1, seed=5)
    expected = RolloutCollector(_env, learner, SAMPLING).collect([1, 2], 1, seed=5)
    assert all(r.policy_version == 0 for r in before.rows)
    assert all(r.policy_version == 3 for r in after.rows)
    assert_same_rows(after.rows, expected.rows)  # the workers now sample from the learner's weights
    assert [r.response_ids for r in after.rows] != [r.response_ids for r in before.rows]


def test_merge_batches_keeps_order() -> None:
    from tests.agents.test_rollout import EchoPolicy  # the scripted double of the rollout tests

    c = RolloutCollector(_env, PolicyMap.shared(EchoPolicy()))
    a, b = c.collect([0], 1, seed=1), c.collect([1], 1, seed=1)
    merged = merge_batches([a, b])
    assert merged.rows == a.rows + b.rows
    assert [e.episode_id for e in merged.episodes] == ["s1-t0-g0", "s1-t1-g0"]


def _slow_env(delay: float):
    """The test env whose reset takes ``delay`` s, so that a collection lasts long enough to be killed
    in the middle of (the episodes themselves are unchanged)."""
    import time

    env = srpo_envs.make(ENV_ID, **ENV_KWARGS)
    reset = env.reset

    def slow_reset(*args, **kwargs):
        time.sleep(delay)
        return reset(*args, **kwargs)

    env.reset = slow_reset
    return env


@pytest.mark.slow
def test_a_worker_killed_mid_collect_is_replaced_and_its_share_rerun(ray_runtime, tiny_model_dir) -> None:
    """SIGKILL one worker's process while it collects: the pool brings it back (Ray's max_restarts),
    re-sends its env and the learner's latest weights (version 3, not the checkpoint's), re-runs its
    share, and the iteration's rows are exactly those of a collection without the kill."""
    import os
    import signal
    import threading
    import time

    from agents.ray_rollout import RolloutWorkerPool, model_states

    ray.cloudpickle.register_pickle_by_value(__import__(__name__))  # the slow env factory below
    factory = HFPolicyFactory(str(tiny_model_dir), ROLES)
    pool = RolloutWorkerPool(factory, 2, num_cpus=0.25, call_timeout_s=120, start_timeout_s=120)
    try:
        learner = factory()
        with torch.no_grad():
            for p in learner.policies[0].model.parameters():
                p.mul_(0.5)
        pool.load_weights(model_states(learner), [3])
        collector = pool.collector(functools.partial(_slow_env, 0.25), SAMPLING)
        tasks, group, seed = [0, 1, 2, 3, 4, 5], 2, 7
        clean = collector.collect(tasks, group, seed)
        assert pool.recoveries == 0 and all(r.policy_version == 3 for r in clean.rows)
        pids = pool.pids()
        out: dict = {}
        worker = threading.Thread(target=lambda: out.setdefault("batch", collector.collect(tasks, group, seed)))
        start = time.monotonic()
        worker.start()
        time.sleep(1.0)  # each share is 6 episodes x >= 0.25 s of resets: the second worker is mid-collect
        os.kill(pids[1], signal.SIGKILL)
        worker.join(timeout=300)
        assert not worker.is_alive()
        assert time.monotonic() - start > 1.0
        assert pool.recoveries == 1
        new_pids = pool.pids()
        assert new_pids[0] == pids[0] and new_pids[1] != pids[1]  # a new process for the killed worker
        assert pool.versions() == [[3], [3]]  # the weights were re-sent to it
        assert out["batch"].rows == clean.rows  # bit-identical: same seeds, same share, same weights
        assert [e.episode_id for e in out["batch"].episodes] == [e.episode_id for e in clean.episodes]
    finally:
        pool.shutdown()


def test_pool_rejects_bad_limits(ray_runtime) -> None:
    from agents.ray_rollout import RolloutWorkerPool

    with pytest.raises(ValueError, match="timeouts must be > 0"):
        RolloutWorkerPool(HFPolicyFactory("unused", ROLES), 1, call_timeout_s=0)
