"""A generator thread beside the learner: iteration ``t+1..t+N``'s rollouts while the learner updates on ``t``.

``--max-staleness N >= 1`` on one machine (:mod:`learners.staleness` holds the rule and the correction).
:class:`RolloutPipeline` runs a thread that generates the rollout batches of the coming iterations in
order, each with the weights the staleness bound assigns to it (:func:`learners.staleness.
generation_version`: iteration ``t``, 1-based, uses the weights after iteration ``max(0, t - 1 - N)``),
on its *own* copy of the policies, under ``torch.inference_mode``. The learner publishes a snapshot of
its weights after every update (:meth:`RolloutPipeline.publish`); the generator loads the snapshot its
next batch needs into its copy, so it never reads weights the learner is changing.

Why a fixed version per iteration and not "the newest weights when the batch starts" (AReaL's
workers take whatever is current): the batch is then a deterministic function of (seed, iteration,
version), independent of how fast either thread ran, so a run killed with SIGKILL resumes exactly:
in-flight batches are **discarded** and regenerated from the weight snapshots they would have used,
which the checkpoint carries (:meth:`RolloutPipeline.checkpoint_snapshots`: at most ``N`` weight sets
older than the checkpoint's own, only with ``N >= 1``). The same rule bounds the work ahead:
generating batch ``t`` needs the weights after iteration ``t - 1 - N``, so the generator is never more
than ``N + 1`` batches ahead of the learner (AReaL's ``running + accepted <= (N + v + 1) * B`` with a
batch as the unit, :func:`learners.staleness.rollout_capacity`), and at most ``N + 1`` snapshots are
held.

Threads: PyTorch's intra-op pool is per calling thread (OpenMP), so the generator sets its own thread
count (``gen_threads``, 1 on a 2-core machine: one core generates, one updates) and the learner's
thread keeps its own. Rows are whole-version: a weight update never lands in the middle of a rollout
(no in-flight weight updates, PipelineRL-style), so every row's ``policy_version`` is the version of
all its tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from learners.staleness import generation_version

__all__ = ["Produced", "RolloutPipeline"]

T = TypeVar("T")
#: a weight snapshot: whatever the ``load`` callback takes (the trainer's: ``(versions, model states)``)
Snapshot = Any


@dataclass
class Produced(Generic[T]):
    """One generated batch and how it was made."""

    iteration: int
    result: T
    weights_of: int  # the learner iteration whose weights generated it (its generation_version)
    gen_s: float  # seconds the generator spent on it
    wait_s: float = 0.0  # seconds the learner waited for it in take()


class RolloutPipeline(Generic[T]):
    """The generator thread and its hand-over with the learner (see the module docstring).

    Args:
        generate: ``generate(iteration) -> batch``; runs in the generator thread on the copy's weights.
        load: ``load(weights_of, snapshot)`` loads a snapshot into the generator's copy (generator thread).
        max_staleness: ``N >= 1``.
        first, last: the iterations to generate (1-based, inclusive; ``first = done + 1`` on resume).
        snapshots: ``{learner iteration: snapshot}`` available at the start: the current weights
            (key ``first - 1``) and, on resume, the older ones the checkpoint carried.
        gen_threads: torch intra-op threads of the generator thread (None: leave the default).
    """

    def __init__(
        self,
        generate: Callable[[int], T],
        load: Callable[[int, Snapshot], None],
        max_staleness: int,
        first: int,
        last: int,
        snapshots: dict[int, Snapshot],
        gen_threads: int | None = 1,
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"the rollout pipeline needs max_staleness >= 1, got {max_staleness}")
        self.n = max_staleness
        self.first, self.last = first, last
        missing = sorted(
            {generation_version(t, self.n) for t in range(first, min(last, first + self.n) + 1)}
            - set(snapshots)
        )
        if first <= last and missing:
            raise ValueError(
                f"resuming at iteration {first} with max_staleness {self.n} needs the weights after "
                f"iteration(s) {missing}, which were not given: an asynchronous run's checkpoint carries them; "
                "exported weights (bench compare --continue-from) or another run's checkpoint do not, so "
                "continue those with --max-staleness 0"
            )
        self._generate, self._load = generate, load
        self._snapshots = dict(snapshots)
        self._results: dict[int, Produced[T]] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._gen_threads = gen_threads
        self._thread = threading.Thread(target=self._run, name="srpo-rollout-generator", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ generator thread
    def _run(self) -> None:
        try:
            if self._gen_threads is not None:
                torch.set_num_threads(self._gen_threads)
            loaded: int | None = None
            for it in range(self.first, self.last + 1):
                need = generation_version(it, self.n)
                with self._cond:
                    self._cond.wait_for(lambda need=need: self._closed or need in self._snapshots)
                    if self._closed:
                        return
                    snap = self._snapshots[need]
                if loaded != need:
                    self._load(need, snap)
                    loaded = need
                t0 = time.perf_counter()
                with torch.inference_mode():
                    result = self._generate(it)
                produced = Produced(it, result, need, time.perf_counter() - t0)
                with self._cond:
                    self._results[it] = produced
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the learner, re-raised in take()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    # ------------------------------------------------------------------ learner side
    def take(self, iteration: int) -> Produced[T]:
        """Iteration ``iteration``'s batch (waits for it); a failure of the generator is re-raised here,
        as the exception the generator raised (its type decides the exit status)."""
        if not self.first <= iteration <= self.last:
            raise ValueError(f"iteration {iteration} is outside the pipeline's {self.first}..{self.last}")
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(
                lambda: iteration in self._results or self._error is not None or self._closed
            )
            if iteration not in self._results and self._error is None:  # closed: nothing will come
                raise RuntimeError(f"the rollout pipeline was closed before iteration {iteration}'s batch")
            if iteration not in self._results:
                # the generator's own exception, not a wrapper: srpo's exit status is chosen by its type
                # (an ExternalServiceError exits 5, a MemoryError 4; a RuntimeError would read as a bug, 70)
                err = self._error
                assert err is not None
                if "raised in the rollout generator thread" not in getattr(err, "__notes__", ()):
                    err.add_note("raised in the rollout generator thread")
                raise err
            produced = self._results.pop(iteration)
            # weights no batch after this one needs any more
            keep = generation_version(iteration + 1, self.n)
            for k in [k for k in self._snapshots if k < keep]:
                del self._snapshots[k]
        produced.wait_s = time.perf_counter() - t0
        return produced

    def publish(self, done: int, snapshot: Snapshot) -> None:
        """The learner's weights after iteration ``done`` (a copy it will not change)."""
        with self._cond:
            self._snapshots[done] = snapshot
            self._cond.notify_all()

    def checkpoint_snapshots(self, done: int) -> dict[int, Snapshot]:
        """The snapshots a run checkpointed after iteration ``done`` needs to regenerate its in-flight
        batches ``done + 1 .. done + N`` (the current weights, ``done``, are the checkpoint's own and are
        left out). Also past ``last``: ``--iterations`` may grow on resume (an extendable field), and the
        run then goes on with batches this pipeline would never have generated; the take() cleanup keeps
        every one of these snapshots, so the final checkpoint can carry them too."""
        need = {generation_version(t, self.n) for t in range(done + 1, done + self.n + 1)}
        need.discard(done)
        with self._cond:
            return {k: self._snapshots[k] for k in sorted(need)}

    def close(self) -> None:
        """Stop the generator (an in-progress batch finishes first) and drop what it produced."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._results.clear()
        self._snapshots.clear()
