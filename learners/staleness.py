"""Asynchronous RL with a staleness bound: admission control and the decoupled off-policy correction.

With ``--max-staleness N >= 1`` rollouts for iterations ``t+1..t+N`` are generated while the learner
updates on ``t`` (AReaL, arXiv 2505.24298; verl's one-step off-policy; prime-rl's
``max_async_level``; TRL's ``max_staleness``). Rows are then up to ``N`` policy versions behind the
weights they are trained on. This module holds the pure parts, each testable without a model:

**Admission control** (:func:`generation_version`, :func:`rollout_capacity`, :func:`admit_rows`).
AReaL's rule: a new rollout may start only while ``running + accepted <= (N + v + 1) * B`` (``v``
the learner's current version, counted from 0, ``B`` the rollouts one update consumes; AReaL writes
it ``(N + step) * B`` with the 1-based step ``v + 1``), so no rollout that starts is more than ``N``
versions behind when its batch is trained on. With a batch per iteration as the unit (``B = 1``)
iteration ``t``'s rollouts (1-based, trained on at version ``t - 1``) may use version
``max(0, t - 1 - N)`` at the oldest: :func:`generation_version`. Rows from elsewhere (Ray workers,
a served engine that lags) are checked again when they are trained on: a row more than ``N`` versions
behind is dropped and counted (``rollout/stale_dropped``), and an event that lost a member is dropped
whole (``rollout/refused_events``, the synchronous loop's count of the same thing), because SRPO's set
ratio needs every member of an event (the batching drops incomplete events for the same reason).

**The decoupled objective** (AReaL's decoupled PPO, :func:`decoupled_correction`). Two policies play
two roles: the *behaviour* policy ``mu`` (the version that sampled the row; its log-probs are the
row's ``behaviour_logprobs``) and the *proximal* policy ``pi_prox`` (the learner's weights before this
iteration's first optimizer step, recomputed on the rows: today's ``pi_old`` recompute). The clip is
around ``pi_prox`` (the loss's ``old_logprobs`` are ``pi_prox``) and the importance weight
``pi_prox / mu``, detached and capped at ``C`` (``--tis-cap``), corrects for sampling from ``mu``:

* token-level losses (GRPO, PPO/MAPPO): per token ``w_t = min(exp(log pi_prox_t - log mu_t), C)``,
  multiplying the token's clipped surrogate (``LossConfig.token_weights``);
* sequence level (SRPO's ``k1``): per row ``min(exp(sum_t m_t (log pi_prox_t - log mu_t)), C)``; GSPO's
  ``sequence-mean``: the same per-token mean, on its length-normalised ratio's scale;
* SRPO's event (set) ratio, whose members may come from *different* versions ``mu_j``: per member
  ``l_j = sum_t m_jt (log pi_prox_jt - log mu_jt)`` against its own behaviour policy, and one event
  weight on the ``c(K)`` scale of SRPO's clipped ratio ``rho_e = exp(sum_j (lp_j - prox_j) / c(K))``:
  ``w_e = min(exp(sum_j l_j / c(K_e)), C)`` (``c = sqrt(K)`` for the default norm). ``w_e`` is the
  importance ratio of the event's joint behaviour (the product of its members' policies, whichever
  version each came from) on the scale SRPO's clip uses, so that a member one version behind moves
  the weight as much as it would move ``rho_e``, for every K. It reaches every token of the event and
  scales the event's gradient (:func:`learners.losses.srpo_loss`'s ``token_weights``).

With ``mu = pi_prox`` (a synchronous row) every weight is exactly 1 and the loss is today's.
The plain PPO clip on stale rows (clip around ``mu``, no weight) is the ablation the correction is
measured against (``--staleness-correction none``).

Logged: ``rollout/staleness`` (histogram of versions behind, one entry per row),
``rollout/staleness_mean``, ``rollout/tis_ess`` (the weights' normalised effective sample size),
``rollout/tis_weight_mean``, ``rollout/tis_capped_frac`` and ``rollout/mismatch_kl`` (k3 estimate of
``KL(mu || pi_prox)`` per loss token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from agents.rows import Row
from learners.offpolicy import mismatch_metrics, refuse_stale_events, tis_weights_and_stats

__all__ = [
    "STALENESS_CORRECTIONS",
    "Admission",
    "admit_rows",
    "decoupled_correction",
    "generation_version",
    "rollout_capacity",
    "staleness_histogram",
]

STALENESS_CORRECTIONS = ("decoupled", "none")
"""``decoupled``: AReaL's objective (clip around ``pi_prox``, capped weight ``pi_prox / mu``);
``none``: the plain PPO clip around the behaviour policy (the ablation)."""


def _check_staleness(max_staleness: int) -> None:
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")


def generation_version(iteration: int, max_staleness: int) -> int:
    """The policy version iteration ``iteration``'s rollouts (1-based) are generated with:
    ``max(0, iteration - 1 - N)``. ``N = 0`` is the synchronous loop (version ``iteration - 1``, the
    weights the update starts from). A deterministic function of the iteration, so a resumed run
    regenerates exactly what an uninterrupted one generated."""
    _check_staleness(max_staleness)
    if iteration < 1:
        raise ValueError(f"iterations are counted from 1, got {iteration}")
    return max(0, iteration - 1 - max_staleness)


def rollout_capacity(version: int, max_staleness: int, batch_size: int, running: int, accepted: int) -> int:
    """How many more rollouts may start now under AReaL's rule ``running + accepted <= (N + v + 1) * B``.

    ``version``: the learner's current policy version ``v`` (0 before the first update); ``running``:
    rollouts started and not finished; ``accepted``: rollouts finished since the start (consumed or
    waiting). Never negative. With ``B = 1`` and a whole batch as the unit, rollout batch ``t``
    (1-based) may start once ``t <= N + v + 1``, i.e. at version ``t - 1 - N``.
    """
    _check_staleness(max_staleness)
    if batch_size < 1 or version < 0 or running < 0 or accepted < 0:
        raise ValueError(
            f"need batch_size >= 1 and version, running, accepted >= 0; got {batch_size}, {version}, "
            f"{running}, {accepted}"
        )
    return max(0, (max_staleness + version + 1) * batch_size - running - accepted)


def _lag(row: Row, current_version: Callable[[Row], int]) -> int:
    lag = int(current_version(row)) - int(row.policy_version)
    if lag < 0:
        raise ValueError(
            f"row {row.event_id}/{row.agent} has policy_version {row.policy_version}, newer than the "
            f"learner's {current_version(row)} (weights went backwards: a bug, not staleness)"
        )
    return lag


def staleness_histogram(rows: Sequence[Row], current_version: Callable[[Row], int]) -> dict[str, int]:
    """``{versions behind: rows}`` (keys as strings, sorted), logged as ``rollout/staleness``."""
    hist: dict[int, int] = {}
    for r in rows:
        lag = _lag(r, current_version)
        hist[lag] = hist.get(lag, 0) + 1
    return {str(k): hist[k] for k in sorted(hist)}


@dataclass
class Admission:
    """What :func:`admit_rows` kept and why it dropped the rest."""

    rows: list[Row]
    stale_dropped: int = 0  # rows more than N versions behind
    events_dropped: int = 0  # events dropped whole (a stale member, or a member missing after that)
    histogram: dict[str, int] = field(default_factory=dict)  # versions behind of the *offered* rows

    def stats(self) -> dict[str, object]:
        """``rollout/staleness`` (histogram), ``rollout/staleness_mean`` and ``rollout/staleness_max``
        of the rows offered, and the rows dropped for staleness (``rollout/stale_dropped``). The events
        dropped whole are ``rollout/refused_events``, as in the synchronous loop (``learners.scale``)."""
        n = sum(self.histogram.values())
        mean = sum(int(k) * v for k, v in self.histogram.items()) / n if n else 0.0
        return {
            "rollout/staleness": dict(self.histogram),
            "rollout/staleness_mean": float(mean),
            "rollout/staleness_max": float(max((int(k) for k in self.histogram), default=0)),
            "rollout/stale_dropped": float(self.stale_dropped),
        }


def admit_rows(rows: Sequence[Row], current_version: Callable[[Row], int], max_staleness: int) -> Admission:
    """Drop the rows more than ``max_staleness`` versions behind ``current_version(row)`` (the
    learner's version of the policy that serves the row's role), then every event that lost a member
    (event-atomic: SRPO's ratio is over all members). Kept rows stay in input order; a row newer than
    the learner is an error."""
    _check_staleness(max_staleness)
    hist = staleness_histogram(rows, current_version)  # raises on a row newer than the learner
    # the synchronous loop's event-atomic refusal, at N instead of 0
    kept, events_dropped = refuse_stale_events(rows, current_version, max_lag=max_staleness)
    stale = sum(n for lag, n in hist.items() if int(lag) > max_staleness)
    return Admission(kept, stale, events_dropped, hist)


def decoupled_correction(
    prox_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str,
    cap: float,
    event_index: Tensor | None = None,
    norm: str = "sqrt",
) -> tuple[Tensor, dict[str, float]]:
    """``[R, T]`` detached importance weights ``pi_prox / mu`` of the decoupled objective, and their stats.

    Args:
        prox_logprobs: ``[R, T]`` log-probs of the rows' tokens under the proximal policy (the
            learner's weights before this iteration's first step; the loss's ``old_logprobs``).
        behaviour_logprobs: ``[R, T]`` under each row's behaviour policy (the version that sampled
            it; rows of one event may come from different versions).
        mask: ``[R, T]`` loss mask.
        level: ``token`` | ``sequence`` | ``sequence-mean`` | ``event`` (the loss's ratio level; see the
            module docstring).
        cap: ``C`` > 0, the truncation of every weight.
        event_index: ``[R]`` row -> event, for ``level="event"``.
        norm: SRPO's ``c(K)`` (a name in :data:`learners.losses.EVENT_NORMS`) for the event level.

    Returns ``(weights, stats)``: weights on loss tokens (0 elsewhere), a row's or event's weight
    repeated on its tokens, for ``LossConfig.token_weights``; stats ``rollout/tis_ess``,
    ``rollout/tis_weight_mean``, ``rollout/tis_capped_frac`` (over loss tokens at token level, over
    rows otherwise) and ``rollout/mismatch_kl`` (k3 ``KL(mu || pi_prox)`` per loss token).
    """
    weights, stats = tis_weights_and_stats(
        prox_logprobs, behaviour_logprobs, mask, level=level, cap=cap, event_index=event_index, norm=norm
    )
    stats["rollout/mismatch_kl"] = mismatch_metrics(prox_logprobs, behaviour_logprobs, mask)["rollout/kl"]
    return weights, stats
