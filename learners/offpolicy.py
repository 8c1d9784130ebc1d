"""Rollout/training policy mismatch: staleness checks, truncated importance sampling, mismatch metrics.

When rollouts come from another engine than the learner's forward (vLLM, bf16 kernels, another
process), the behaviour log-probs a row carries are not the learner's log-probs of the same tokens
under the same weights, and a row may even come from older weights. Three standard remedies live here
as pure functions:

* :func:`refuse_stale_events`: every row records the ``policy_version`` that produced it; rows whose
  version lags the learner's by more than ``max_lag`` are refused (never silently trained on), whole
  events at a time (SRPO's ratio needs all members of an event).
* :func:`tis_weights`: truncated importance sampling (Yao et al., "Your efficient RL framework secretly
  brings you off-policy RL training", 2025; verl's ``rollout_is``). The PPO ratio is taken against the
  learner's own recompute ``pi_old`` of the rollout tokens, and each token's loss is weighted by
  ``min(pi_old / pi_rollout, cap)`` (detached): token level, sequence level (the product over a row's
  tokens), or event level for SRPO (the product over all members' tokens of an event, the set
  version).
* :func:`mismatch_metrics`: mean ``|log pi_old - log pi_rollout|`` and a KL(rollout || train) estimate
  (k3) over loss tokens, logged every iteration as ``rollout/logprob_abs_diff`` and ``rollout/kl``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from agents.rows import Row

__all__ = ["TIS_LEVELS", "mismatch_metrics", "refuse_stale_events", "tis_row_weights", "tis_weights"]

TIS_LEVELS = ("token", "sequence", "event")


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
) -> Tensor:
    """``[R, T]`` truncated importance weights ``min(pi_train / pi_rollout, cap)``, detached.

    Args:
        train_logprobs: ``[R, T]`` the learner's log-probs of the rollout tokens under the weights
            that generated them (``pi_old``; computed before the update, no gradient).
        rollout_logprobs: ``[R, T]`` the rollout engine's log-probs of the same tokens.
        mask: ``[R, T]`` loss mask (padding and env text 0).
        level: ``token`` (per token), ``sequence`` (one weight per row: the product over its tokens) or
            ``event`` (one weight per event: the product over all its members' tokens; needs
            ``event_index``).
        cap: the truncation ``C`` (> 0).
        event_index: ``[R]`` row -> event, for ``level="event"``.

    Masked positions get weight 0 (they are out of the loss anyway).
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
        train_logprobs, rollout_logprobs, mask, level=level, cap=cap, event_index=event_index
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
) -> Tensor:
    """``[R]`` one truncated weight per row: ``sequence`` (the row's own product of token ratios) or
    ``event`` (the product over every member of the row's event, shared by its rows).

    Why per row: a constant positive weight ``w`` on a clipped surrogate equals the surrogate with
    the advantage scaled by ``w`` (``min(rho A, clip(rho) A) w = min(rho wA, clip(rho) wA)``), so a
    trainer applies these weights to the advantages and every registered loss stays untouched.
    """
    if level not in ("sequence", "event"):
        raise ValueError(f"per-row weights need level 'sequence' or 'event', got {level!r}")
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_ratio = _masked_log_ratio(train_logprobs, rollout_logprobs, mask)
    per_row = log_ratio.sum(-1)
    if level == "event":
        if event_index is None or tuple(event_index.shape) != (log_ratio.shape[0],):
            raise ValueError("level='event' needs event_index of shape [R]")
        n_events = int(event_index.max()) + 1 if event_index.numel() else 0
        per_event = torch.zeros(n_events, dtype=per_row.dtype).index_add_(0, event_index, per_row)
        per_row = per_event[event_index]
    log_cap = torch.log(torch.tensor(cap, dtype=per_row.dtype))
    return torch.exp(torch.minimum(per_row, log_cap))


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
