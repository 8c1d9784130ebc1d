"""The generator thread's hand-over (learners.async_rollout.RolloutPipeline) with stand-in work.

The generator's batches here are tuples naming what made them, so every test checks *which* weights
generated which iteration, not timing (speed lives in benchmarks/perf/bench_async.py).
"""

from __future__ import annotations

import threading

import pytest

from learners.async_rollout import RolloutPipeline
from learners.staleness import generation_version


class _Copy:
    """The generator's 'model copy': remembers the snapshot it was loaded with."""

    def __init__(self) -> None:
        self.weights: str | None = None
        self.loads: list[int] = []
        self.generated: list[int] = []  # iterations, in generation order
        self.lock = threading.Lock()

    def load(self, done: int, snap: str) -> None:
        assert snap == f"w{done}"
        self.weights = snap
        self.loads.append(done)

    def generate(self, it: int) -> tuple[int, str | None]:
        with self.lock:
            self.generated.append(it)
        return it, self.weights


def _run(n: int, first: int, last: int, snapshots: dict[int, str]) -> tuple[_Copy, list, list[int]]:
    copy = _Copy()
    pipe = RolloutPipeline(copy.generate, copy.load, n, first, last, snapshots, gen_threads=None)
    got, ahead = [], []
    try:
        for it in range(first, last + 1):
            p = pipe.take(it)
            got.append((p.iteration, p.result, p.weights_of))
            with copy.lock:
                ahead.append(max(copy.generated) - (it - 1))  # generated beyond what was consumed
            pipe.publish(it, f"w{it}")
    finally:
        pipe.close()
    return copy, got, ahead


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_iteration_is_generated_with_the_weights_the_bound_assigns(n: int) -> None:
    copy, got, ahead = _run(n, 1, 9, {0: "w0"})
    for it, (i, (gen_it, weights), weights_of) in zip(range(1, 10), got, strict=True):
        v = generation_version(it, n)
        assert i == gen_it == it and weights_of == v and weights == f"w{v}"
        assert (it - 1) - v <= n  # trained at the weights after iteration it - 1
    assert copy.generated == list(range(1, 10))  # in order, each once
    assert max(ahead) <= n + 1  # never further ahead than the rule allows


def _carried_at_five(last: int) -> dict[int, str]:
    """The snapshots an N = 2 pipeline of iterations 1..``last`` checkpoints after iteration 5."""
    copy = _Copy()
    pipe = RolloutPipeline(copy.generate, copy.load, 2, 1, last, {0: "w0"}, gen_threads=None)
    try:
        for it in range(1, 6):
            pipe.take(it)
            pipe.publish(it, f"w{it}")
        return pipe.checkpoint_snapshots(5)
    finally:
        pipe.close()


def test_resume_regenerates_in_flight_batches_from_the_checkpointed_snapshots() -> None:
    """Killed after iteration 5 with N = 2: batches 6 and 7 were in flight (weights after 3 and 4);
    the resumed pipeline gets those snapshots from the checkpoint and makes the same batches."""
    _, full, _ = _run(2, 1, 9, {0: "w0"})
    carried = _carried_at_five(last=9)
    assert carried == {3: "w3", 4: "w4"}  # generation_version(6, 2) = 3, (7, 2) = 4; 5 is the checkpoint's
    _, resumed, _ = _run(2, 6, 9, {**carried, 5: "w5"})
    assert resumed == full[5:]


def test_the_last_checkpoint_carries_what_a_longer_resumed_run_needs() -> None:
    """--iterations is extendable on resume: a run of 5 iterations checkpointed at its end, resumed to 9,
    must make the batches an uninterrupted 9-iteration run made (its checkpoint carries weights 3, 4)."""
    _, full, _ = _run(2, 1, 9, {0: "w0"})
    carried = _carried_at_five(last=5)
    assert carried == {3: "w3", 4: "w4"}
    _, resumed, _ = _run(2, 6, 9, {**carried, 5: "w5"})
    assert resumed == full[5:]


def test_resume_without_the_needed_snapshots_is_refused() -> None:
    with pytest.raises(ValueError, match=r"weights after iteration\(s\) \[3, 4\]"):
        RolloutPipeline(lambda it: it, lambda d, s: None, 2, 6, 9, {5: "w5"}, gen_threads=None)
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        RolloutPipeline(lambda it: it, lambda d, s: None, 0, 1, 9, {0: "w0"}, gen_threads=None)


def test_a_generator_failure_is_raised_in_the_learner() -> None:
    def generate(it: int) -> int:
        if it == 3:
            raise KeyError("env broke")
        return it

    pipe = RolloutPipeline(generate, lambda d, s: None, 1, 1, 5, {0: "w0"}, gen_threads=None)
    try:
        for it in (1, 2):
            assert pipe.take(it).result == it
            pipe.publish(it, f"w{it}")
        # the generator's own exception type (srpo_cli maps types to exit statuses), not a RuntimeError
        with pytest.raises(KeyError, match="env broke") as info:
            pipe.take(3)
        assert "raised in the rollout generator thread" in info.value.__notes__
    finally:
        pipe.close()


def test_close_stops_a_generator_waiting_for_weights() -> None:
    pipe = RolloutPipeline(lambda it: it, lambda d, s: None, 1, 1, 5, {0: "w0"}, gen_threads=None)
    assert pipe.take(1).result == 1
    pipe.close()  # the generator waits for the weights after iteration 1 (batch 3): must not hang
    assert not pipe._thread.is_alive()


def test_take_after_close_raises_instead_of_waiting_forever() -> None:
    pipe = RolloutPipeline(lambda it: it, lambda d, s: None, 1, 1, 5, {0: "w0"}, gen_threads=None)
    assert pipe.take(1).result == 1
    pipe.close()  # batch 3 needs the weights after iteration 1, which nobody will publish now
    done: list[BaseException] = []
    thread = threading.Thread(target=lambda: _take_into(pipe, 3, done), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "take() after close() waited forever"
    assert len(done) == 1 and isinstance(done[0], RuntimeError) and "closed" in str(done[0])


def _take_into(pipe: RolloutPipeline, iteration: int, out: list[BaseException]) -> None:
    try:
        pipe.take(iteration)
    except BaseException as exc:  # noqa: BLE001 (the test inspects whatever take raised)
        out.append(exc)
