"""An iteration's rollouts: ``tasks_per_iter`` training tasks x ``group_size`` episodes, and with
``filter_groups`` DAPO's dynamic sampling (:mod:`learners.dynamic_sampling`): groups whose rewards are
all equal are dropped and further tasks of the iteration's pool rolled out until ``tasks_per_iter``
groups with a signal remain or ``max_gen_batches`` batches were generated.

:class:`RolloutPhase` receives the ``[rollout]`` section and the run's seed alone; where the episodes
are generated (this process, Ray workers, vLLM, a server; one batch on every rank) is the
:class:`Collect` port's business (:meth:`learners.scale.ScaleOut.collect`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from agents.rollout import RolloutBatch, merge_batches
from learners.dynamic_sampling import FilterStats, informative_groups, select_groups
from learners.seeds import iteration_seed

__all__ = ["Collect", "RolloutPhase"]


class Collect(Protocol):
    """Rolls out ``group_size`` episodes of each task with one seed; the same batch on every rank."""

    def collect(self, collector: Any, tasks: Sequence[int], group_size: int, seed: int) -> RolloutBatch: ...


class RolloutPhase:
    """The rollouts of iteration ``it`` (:meth:`run`) from ``collector`` over ``n_tasks`` training tasks.

    ``rollout``: the ``[rollout]`` section (``tasks_per_iter``, ``group_size``, ``filter_groups``,
    ``filter_signal``, ``max_gen_batches``); ``seed``: the run's.
    """

    def __init__(self, scale: Collect, collector: Any, n_tasks: int, rollout: Any, seed: int) -> None:
        self.scale, self.collector, self.n_tasks = scale, collector, n_tasks
        self.rollout, self.seed = rollout, seed

    def _pool(self, it: int) -> np.ndarray:
        """Iteration ``it``'s tasks: ``tasks_per_iter`` of them, or with ``filter_groups`` the pool its
        batches of ``tasks_per_iter`` are drawn from in order (without replacement)."""
        rollout, rng = self.rollout, np.random.default_rng(iteration_seed(self.seed, it, 0))
        if not rollout.filter_groups:
            return rng.choice(self.n_tasks, size=min(rollout.tasks_per_iter, self.n_tasks), replace=False)
        return rng.permutation(self.n_tasks)[: rollout.tasks_per_iter * rollout.max_gen_batches]

    def first_collect(self, it: int) -> tuple[int, int]:
        """``(task, seed)`` of iteration ``it``'s first episode: where a served model's probe looks."""
        return min(int(t) for t in self._pool(it)[: self.rollout.tasks_per_iter]), iteration_seed(self.seed, it, 99)

    def run(self, it: int) -> tuple[RolloutBatch, RolloutBatch, FilterStats | None]:
        """Iteration ``it``'s rollouts: (every episode generated, the batch the update trains on, what
        dynamic sampling did). Without ``filter_groups`` both batches are the one collected batch; with
        it, batches of ``tasks_per_iter`` further tasks of the iteration's pool (drawn without
        replacement) are rolled out until ``tasks_per_iter`` informative groups are kept or
        ``max_gen_batches`` batches were generated."""
        rollout, seed = self.rollout, self.seed
        pool = self._pool(it)
        if not rollout.filter_groups:
            batch = self.scale.collect(
                self.collector,
                sorted(int(t) for t in pool),
                rollout.group_size,
                iteration_seed(seed, it, 99),
            )
            return batch, batch, None
        generated: list[RolloutBatch] = []
        kept: list[RolloutBatch] = []
        filtered = FilterStats()
        for b in range(rollout.max_gen_batches):
            tasks = pool[b * rollout.tasks_per_iter : (b + 1) * rollout.tasks_per_iter]
            if len(tasks) == 0 or filtered.groups_kept >= rollout.tasks_per_iter:
                break
            batch = self.scale.collect(
                self.collector,
                sorted(int(t) for t in tasks),
                rollout.group_size,
                iteration_seed(seed, it, 99 + b),
            )
            generated.append(batch)
            groups = informative_groups(batch, rollout.filter_signal)[: rollout.tasks_per_iter - filtered.groups_kept]
            kept.append(select_groups(batch, groups))
            filtered.gen_batches += 1
            filtered.groups_generated += len({r.group_id for r in batch.rows})
            filtered.groups_kept += len(groups)
        return merge_batches(generated), merge_batches(kept), filtered
