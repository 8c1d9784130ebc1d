"""Per-iteration rollout diagnostics the trainer logs beside the update's: team sizes and grading health.

* :func:`k_stats` — the team size K of the rollout batch. ``rollout/mean_k`` and ``rollout/k_hist``
  count every event, but in the proposers-aggregator and routed workflows the route and aggregate
  events always have K = 1, so they dilute the number a user looks at ("how many proposers does the
  router pick?"). The multi-member view is logged beside them: ``rollout/mean_k_multi`` (mean K over
  events with K > 1; absent when there is none), ``rollout/multi_k_frac`` (the fraction of events
  with K > 1) and ``rollout/mean_k_by_type/<event type>`` (e.g. ``.../propose``: the mean team size
  of the proposer rounds, K = 1 choices of a router included).
* :class:`GradingMonitor` — the math grader's counters (:func:`srpo_envs.grading.grading_stats`:
  answers, timeouts, worker failures and starts) as per-iteration deltas under ``grading/...``. A
  failing grader raises :class:`srpo_envs.grading.GraderError`, but timeouts (an answer scored wrong
  after its time bound) and restarts are silent in the rewards: logged, a rising ``grading/timeouts``
  is visible in the training curves. The grader is process-wide, so only grading done in this
  process is counted (with Ray rollout workers the workers grade and their counters stay there).
  The deltas are of wall time, not of a batch: in an asynchronous run (``--max-staleness N``) the
  generator thread grades iterations ahead while the learner updates, so a record's ``grading/...``
  counts what was graded since the previous record, in either thread (its own evaluation included).
"""

from __future__ import annotations

from typing import Any

from learners.batching import EventTable
from srpo_envs import grading

__all__ = ["GradingMonitor", "k_stats"]


def k_stats(table: EventTable) -> dict[str, Any]:
    """Team-size statistics of a rollout batch's events (see the module docstring)."""
    ks = table.event_k.double()
    out: dict[str, Any] = {
        "rollout/mean_k": float(ks.mean()),
        "rollout/max_k": float(ks.max()),
        "rollout/k_hist": {str(k): n for k, n in table.k_histogram().items()},
    }
    multi = ks[ks > 1]
    out["rollout/multi_k_frac"] = float(multi.numel() / ks.numel())
    if multi.numel():
        out["rollout/mean_k_multi"] = float(multi.mean())
    by_type: dict[str, list[int]] = {}
    for row, k in zip(table.first_rows(), table.event_k.tolist(), strict=True):
        by_type.setdefault(row.event_type, []).append(int(k))
    for event_type, values in sorted(by_type.items()):
        out[f"rollout/mean_k_by_type/{event_type}"] = sum(values) / len(values)
    return out


class GradingMonitor:
    """Per-iteration deltas of the process-wide math grader's counters (``grading/...``).

    Nothing is reported until this process's grader has done something since the monitor was made
    (an env that never leaves the in-process exact-number comparison logs no ``grading/`` keys); from
    then on every iteration reports every counter, zeros included, so the curves have no holes.
    """

    def __init__(self) -> None:
        self._last = self._read()
        self._active = False

    @staticmethod
    def _read() -> dict[str, float]:
        return {k: float(v) for k, v in grading.grading_stats().items()}  # looked up at call time

    def delta(self) -> dict[str, float]:
        """The counters' change since the previous call (or since construction); ``{}`` while idle."""
        now = self._read()
        diff = {k: round(v - self._last.get(k, 0.0), 6) for k, v in now.items()}
        self._last = now
        self._active = self._active or any(v != 0 for v in diff.values())
        return diff if self._active else {}
