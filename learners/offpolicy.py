"""Rollout/training policy mismatch: staleness checks, truncated importance sampling, mismatch metrics.

When rollouts come from another engine than the learner's forward (vLLM, bf16 kernels, another
process), the behaviour log-probs a row carries are not the learner's log-probs of the same tokens
under the same weights, and a row may even come from older weights. Three standard remedies live here
as pure functions:

* :func:`refuse_stale_events`: every row records the ``policy_version`` that produced it; rows whose
  version lags the learner's by more than ``max_lag`` are refused (never silently trained on), whole
  events at a time (SRPO's ratio needs all members of an event).
* :func:`tis_weights`: truncated importance sampling (Yao et al., "Your efficient RL framework secretly
  brings you off-policy RL training", 2025; verl's ``rollout_is`` with ``rollout_is_threshold``). The
  PPO ratio is taken against the learner's own recompute ``pi_old`` of the rollout tokens, and each
  token's loss is weighted by ``min(pi_old / pi_rollout, cap)`` (detached): token level (verl's
  default, and ours for per-token losses), sequence level (the product over a row's tokens), or event
  level for SRPO (the set version: the behaviour ratio of the whole event on the scale of SRPO's
  clipped ratio, see :func:`tis_row_weights`). The weights reach the loss as per-token weights
  (``LossConfig.token_weights``), so each row keeps its own weight in every loss.
* :func:`tis_stats`: the weights' mean, the fraction the cap truncated and their effective sample
  size, logged as ``rollout/tis_weight_mean``, ``rollout/tis_capped_frac`` and ``rollout/tis_ess``.
* :func:`mismatch_metrics`: mean ``|log pi_old - log pi_rollout|`` and a KL(rollout || train) estimate
  (k3) over loss tokens, logged every iteration as ``rollout/logprob_abs_diff`` and ``rollout/kl``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from agents.rows import Row
from learners.losses import EVENT_NORMS, members_as_events

__all__ = [
    "TIS_LEVELS",
    "mismatch_metrics",
    "refuse_stale_events",
    "tis_row_weights",
    "tis_stats",
    "tis_weights",
    "tis_weights_and_stats",
]

TIS_LEVELS = ("token", "sequence", "sequence-mean", "event")


def refuse_stale_events(
    rows: Sequence[Row], current_version: Callable[[Row], int], max_lag: int = 0
) -> tuple[list[Row], int]:
    """Drop every event that holds a row more than ``max_lag`` versions behind its policy.

    ``current_version(row)`` is the learner's version of the policy that serves the row's role. A row
    *newer* than the learner is an error (weights went backwards: a bug, not staleness).

    Returns:
        ``(kept_rows, refused_events)``; kept rows stay in input order.
    """
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")
    stale: set[str] = set()
    for r in rows:
        lag = current_version(r) - r.policy_version
        if lag < 0:
            raise ValueError(
                f"row {r.event_id}/{r.agent} has policy_version {r.policy_version}, newer than the "
                f"learner's {current_version(r)}"
            )
        if lag > max_lag:
            stale.add(r.event_id)
    return [r for r in rows if r.event_id not in stale], len(stale)


def _masked_log_ratio(train_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    w = mask.to(train_logprobs.dtype)
    diff = (train_logprobs - rollout_logprobs.to(train_logprobs.dtype)).detach()
    return torch.where(w != 0, diff, torch.zeros_like(diff))


def tis_weights(
    train_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    cap: float = 2.0,
    event_index: Tensor | None = None,
    norm: str = "sum",
) -> Tensor:
    """``[R, T]`` truncated importance weights ``min(pi_train / pi_rollout, cap)``, detached.

    Args:
        train_logprobs: ``[R, T]`` the learner's log-probs of the rollout tokens under the weights
            that generated them (``pi_old``; computed before the update, no gradient).
        rollout_logprobs: ``[R, T]`` the rollout engine's log-probs of the same tokens.
        mask: ``[R, T]`` loss mask (padding and env text 0).
        level: ``token`` (per token), ``sequence`` (one weight per row: the product over its tokens),
            ``sequence-mean`` (one weight per row: the per-token geometric mean, GSPO's ratio scale) or
            ``event`` (one weight per event, on all its rows' tokens; needs ``event_index``; see
            :func:`tis_row_weights` for its scale ``norm``).
        cap: the truncation ``C`` (> 0).
        event_index: ``[R]`` row -> event, for ``level="event"``.
        norm: the event level's ``c(K)`` (a name in :data:`learners.losses.EVENT_NORMS`).

    Masked positions get weight 0 (they are out of the loss anyway); a row or event weight is repeated
    on every loss token of its rows, so per-token losses apply it to the row's own tokens.
    """
    if level not in TIS_LEVELS:
        raise ValueError(f"level must be one of {TIS_LEVELS}, got {level!r}")
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if train_logprobs.shape != rollout_logprobs.shape or train_logprobs.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {tuple(train_logprobs.shape)}, {tuple(rollout_logprobs.shape)}, {tuple(mask.shape)}"
        )
    log_ratio = _masked_log_ratio(train_logprobs, rollout_logprobs, mask)
    on = (mask != 0).to(log_ratio.dtype)
    if level == "token":
        log_cap = torch.log(torch.tensor(cap, dtype=log_ratio.dtype))
        # clamp in log space: exp of a huge ratio must not overflow before the cap applies
        return torch.exp(torch.minimum(log_ratio, log_cap)) * on
    per_row = tis_row_weights(
        train_logprobs, rollout_logprobs, mask, level=level, cap=cap, event_index=event_index, norm=norm
    )
    return per_row[:, None] * on


def tis_row_weights(
    train_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "sequence",
    cap: float = 2.0,
    event_index: Tensor | None = None,
    norm: str = "sum",
) -> Tensor:
    """``[R]`` one truncated weight per row: ``sequence`` (the row's own product of token ratios),
    ``sequence-mean`` (their geometric mean per loss token) or ``event`` (one weight per event, shared
    by its rows).

    ``sequence-mean`` is GSPO's scale: its ratio is ``exp(mean_t log r_t)``, length-normalised so that
    one clip range (3e-4) means the same for every length; the raw product would weight a 500-token
    answer by ``e^{500 x mismatch}`` (capped, or crushed below 1) for a per-token mismatch its own
    ratio calls tiny, the same scale error as an unnormalised event weight for SRPO (below).

    The event weight is the event's behaviour ratio on the *same scale as SRPO's clipped ratio*:
    ``w_e = min(exp(sum_{j in e} log w_j / c(K_e)), cap)`` with ``log w_j`` row ``j``'s summed token
    log-ratio ``log pi_train - log pi_rollout``, ``K_e`` the event's rows and ``c`` the loss's event
    norm (``norm``: ``sqrt`` -> ``sqrt(K)``, ``mean`` -> ``K``, ``sum`` -> 1, the exact joint ratio).
    Why that scale: SRPO clips ``rho_e = exp(sum_j l_j / c(K_e))``, a ratio shrunk by ``c(K)`` so that
    one clip range means the same for every K; the unnormalised product would grow with K (a 1%
    per-member mismatch is ``e^{0.01 K}``), and large events would hit the cap (or, below 1, be
    down-weighted) for a mismatch that SRPO's own ratio calls small. With ``k1`` (every member its own
    event) the event weight is the row's sequence weight. The cap applies after the normalisation.

    These weights reach the loss as per-token weights (:func:`tis_weights` repeats them on the rows'
    loss tokens): a constant positive weight on a clipped surrogate scales it, and for an event loss
    only per-token weights keep each member's own weight (per-row advantages are reduced to one per
    event).
    """
    if level not in ("sequence", "sequence-mean", "event"):
        raise ValueError(f"per-row weights need level 'sequence', 'sequence-mean' or 'event', got {level!r}")
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if norm not in EVENT_NORMS:
        raise ValueError(f"norm must be one of {sorted(EVENT_NORMS)}, got {norm!r}")
    log_ratio = _masked_log_ratio(train_logprobs, rollout_logprobs, mask)
    per_row = log_ratio.sum(-1)
    if level == "sequence-mean":  # a row without loss tokens has log ratio 0: weight 1
        per_row = per_row / (mask != 0).sum(-1).clamp_min(1).to(per_row.dtype)
    if level == "event" and not members_as_events(norm):
        if event_index is None or tuple(event_index.shape) != (log_ratio.shape[0],):
            raise ValueError("level='event' needs event_index of shape [R]")
        n_events = int(event_index.max()) + 1 if event_index.numel() else 0
        per_event = torch.zeros(n_events, dtype=per_row.dtype).index_add_(0, event_index, per_row)
        k = torch.zeros(n_events, dtype=per_row.dtype).index_add_(0, event_index, torch.ones_like(per_row))
        per_event = per_event / EVENT_NORMS[norm](k.clamp_min(1.0))
        per_row = per_event[event_index]
    log_cap = torch.log(torch.tensor(cap, dtype=per_row.dtype))
    return torch.exp(torch.minimum(per_row, log_cap))


def tis_stats(weights: Tensor, cap: float) -> dict[str, float]:
    """Diagnostics of truncated weights (one per row, or one per loss token at token level).

    ``rollout/tis_weight_mean``; ``rollout/tis_capped_frac``, the fraction the cap truncated (verl's
    ``rollout_is_ratio_fraction_high``; ``exp(log C)`` may round just below ``C``, so the comparison
    has a relative tolerance); ``rollout/tis_ess``, the effective sample size fraction
    ``(sum w)^2 / (n sum w^2)`` in ``(0, 1]`` (verl's ``rollout_is_eff_sample_size``: 1 when every
    weight is equal, small when a few weights carry the batch).
    """
    if not weights.numel():
        return {"rollout/tis_weight_mean": 1.0, "rollout/tis_capped_frac": 0.0, "rollout/tis_ess": 1.0}
    w = weights.double()
    sq = float(w.square().sum())
    return {
        "rollout/tis_weight_mean": float(w.mean()),
        "rollout/tis_capped_frac": float((w >= cap * (1 - 1e-9)).double().mean()),
        "rollout/tis_ess": float(w.sum()) ** 2 / (w.numel() * sq) if sq > 0 else 0.0,
    }


def tis_weights_and_stats(
    train_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str,
    cap: float,
    event_index: Tensor | None = None,
    norm: str = "sum",
) -> tuple[Tensor, dict[str, float]]:
    """:func:`tis_weights` and their :func:`tis_stats` in one call (arguments as there).

    The stats are over loss tokens at token level and over the rows' (or events') own weights
    otherwise, so a long row does not count once per token. Both TIS against a rollout engine
    (``learners.scale``) and the decoupled objective of asynchronous runs (``learners.staleness``)
    weigh and report through this one function.
    """
    weights = tis_weights(
        train_logprobs, rollout_logprobs, mask, level=level, cap=cap, event_index=event_index, norm=norm
    )
    if level == "token":
        values = weights[mask != 0]
    else:
        values = tis_row_weights(
            train_logprobs, rollout_logprobs, mask, level=level, cap=cap, event_index=event_index, norm=norm
        )
    return weights, tis_stats(values, cap)


def mismatch_metrics(train_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean ``|log pi_train - log pi_rollout|`` and the k3 estimate of KL(rollout || train) per token.

    k3 (Schulman): with ``r = pi_train / pi_rollout`` on tokens sampled from the rollout policy,
    ``E[(r - 1) - log r] = KL(rollout || train)``, and every term is >= 0.
    """
    log_ratio = _masked_log_ratio(train_logprobs, rollout_logprobs, mask).double()
    on = (mask != 0).double()
    n = on.sum().clamp_min(1.0)
    k3 = (torch.exp(log_ratio.clamp(-20, 20)) - 1.0 - log_ratio) * on
    return {
        "rollout/logprob_abs_diff": float((log_ratio.abs() * on).sum() / n),
        "rollout/kl": float(k3.sum() / n),
        "rollout/logprob_max_abs_diff": float((log_ratio.abs() * on).max()) if on.any() else 0.0,
    }
