"""The divergence guard: stop a run whose update blew up, before its weights are checkpointed or exported.

Non-finite steps are skipped and counted by the trainer itself (``max_nonfinite_steps``); this guard
catches the *finite* collapse that counter cannot see: a learning rate that moves the policy so far in one
step that the next minibatch's importance ratios are astronomical (``actor/approx_kl`` 8e9 at lr 1000) and
held-out accuracy falls to zero, while every weight stays finite and the run would otherwise exit 0 and
export the wreck. It reads only what the trainer already logs per iteration (the record written to
``metrics.jsonl``), so it costs nothing, and raises :class:`DivergenceError`, a
:class:`learners.state_check.NonFiniteError`: the ``srpo`` boundary prints its one line and exits 3, as for
persistent non-finite steps.

The default thresholds sit well above what healthy runs log, at ``srpo train``'s defaults for the
shipped models and at every bench preset (``python -m benchmarks.perf.guard_margins`` prints the margins;
docs/results/defaults.md has the calibration: healthy approx-KL at most 0.053 against the threshold 1.0, mean
|log-ratio| 0.196 against 2.0, and no healthy held-out evaluation below its start), and below what a
far off-policy or blown-up update logs (approx-KL 1.6-5.4 at lr 3e-4 with two epochs on a tiny model, 8e12
at lr 1000); each is a ``TrainConfig`` field (``--guard-...``), ``inf`` turns one off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from learners.state_check import NonFiniteError

#: Guarded per-iteration metric -> (the ``TrainConfig`` field holding its threshold, what it measures).
#: Each is compared by absolute value (a loss diverges in either direction).
GUARD_METRICS: dict[str, tuple[str, str]] = {
    "actor/approx_kl": ("guard_max_approx_kl", "approx-KL of the update"),
    "actor/mean_abs_log_ratio": ("guard_max_log_ratio", "mean |log-ratio|"),
    "actor/loss": ("guard_max_loss", "|policy loss|"),
    "actor/grad_norm": ("guard_max_grad_norm", "gradient norm before clipping"),
}
#: Held-out samples iteration 0 must have solved before an accuracy drop counts: with fewer, a healthy
#: policy's sampling noise alone can read as a collapse (10 expected, at most 1 seen: p ~ 5e-4).
MIN_START_SOLVED = 10
#: How far (in standard errors of the difference of two proportions over ``eval_samples`` each) held-out
#: accuracy must fall below the start before the drop counts: a healthy run's evaluation noise never
#: reaches it (one-sided p ~ 1e-3), a collapse does at once (0.578 -> 0.141 on 64 samples: z = 5.1).
MIN_DROP_Z = 3.0


def significant_drop(start: float, now: float, samples: int) -> bool:
    """Whether ``now`` is below ``start`` by at least :data:`MIN_DROP_Z` standard errors (pooled two-proportion
    z over ``samples`` held-out samples each)."""
    if samples <= 0:
        return False
    pooled = (start + now) / 2.0
    se = math.sqrt(max(pooled * (1.0 - pooled), 1e-12) * 2.0 / samples)
    return (start - now) / se >= MIN_DROP_Z


class DivergenceError(NonFiniteError):
    """A finite but exploded update (or a held-out accuracy collapse): the run stops with exit 3."""


@dataclass(frozen=True)
class GuardLimits:
    """The thresholds of one run (from its ``TrainConfig``'s ``guard_*`` fields)."""

    thresholds: Mapping[str, float]  # metric key -> the largest healthy |value|
    eval_drop: float  # stop when held-out accuracy falls by more than this fraction of iteration 0's

    @classmethod
    def from_config(cls, cfg: Any) -> GuardLimits:
        return cls(
            thresholds={key: float(getattr(cfg, name)) for key, (name, _) in GUARD_METRICS.items()},
            eval_drop=float(cfg.guard_eval_drop),
        )


def validate(cfg: Any) -> None:
    """``ValueError`` for thresholds that would trip on every run or never mean anything."""
    for name, _ in GUARD_METRICS.values():
        value = getattr(cfg, name)
        if not value > 0:  # NaN too
            raise ValueError(f"{name} must be > 0 (inf: off), got {value}")
    if not 0.0 < cfg.guard_eval_drop <= 1.0:
        raise ValueError(f"guard_eval_drop must be in (0, 1] (1: off), got {cfg.guard_eval_drop}")


def start_accuracy(history: list[Mapping[str, Any]]) -> float | None:
    """Iteration 0's held-out accuracy in a run's metrics history (None when it was not evaluated)."""
    for record in history:
        if record.get("iteration") == 0 and isinstance(record.get("eval_accuracy"), int | float):
            return float(record["eval_accuracy"])
    return None


def violations(
    record: Mapping[str, Any],
    limits: GuardLimits,
    start: float | None = None,
    eval_samples: int = 0,
) -> list[str]:
    """What in this iteration's ``record`` is past its threshold, one phrase each (empty: healthy).

    Non-finite values are the non-finite-step counter's business (a skipped step logs a NaN mean), so
    only finite ones are compared here. ``start``/``eval_samples``: iteration 0's held-out accuracy and
    how many samples it was measured on.
    """
    out = []
    for key, limit in limits.thresholds.items():
        value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(value) and abs(value) > limit:
            out.append(f"{key} {value:.3g} > {limit:.3g} (--{GUARD_METRICS[key][0].replace('_', '-')})")
    acc = record.get("eval_accuracy")
    if (
        isinstance(acc, int | float)
        and start is not None
        and record.get("iteration", 0) != 0
        and start * eval_samples >= MIN_START_SOLVED
        and acc < (1.0 - limits.eval_drop) * start
        and significant_drop(start, float(acc), eval_samples)
    ):
        out.append(
            f"held-out accuracy {start:.3f} -> {acc:.3f}, down more than {limits.eval_drop:.0%} "
            "(--guard-eval-drop)"
        )
    return out


def check(
    record: Mapping[str, Any],
    limits: GuardLimits,
    *,
    start: float | None,
    eval_samples: int,
    where: str,
) -> None:
    """Raise :class:`DivergenceError` (one line) when ``record`` violates ``limits``; ``where`` says what
    was kept (the last checkpoint) and is appended to the message."""
    found = violations(record, limits, start, eval_samples)
    if found:
        raise DivergenceError(
            f"training diverged at iteration {record.get('iteration')}: {'; '.join(found)}; stopped before "
            f"checkpointing or exporting these weights; {where} (lower --lr?)"
        )
