"""Pure tensor math of the policy / value losses (SRPO, GRPO, GSPO, PPO/MAPPO), registered by name.

Modelled on verl's ``trainer/ppo/core_algos.py``: every function here is a pure function of tensors,
with no model, optimiser or data-loading code, so that trainers only *wire* them and the maths can be
tested (and grad-checked) in isolation. Registries let a config pick a variant by name, and the
trainer reads nothing else: :data:`POLICY_LOSSES` (one signature for every algorithm,
:data:`PolicyLossFn`: tensors plus the per-row advantages and ``event_index``, and a
:class:`LossConfig`), :data:`EVENT_NORMS` (SRPO's ``c(K)``, including the ``k1`` ablation) and
:data:`AGG_MODES` (token aggregation). A new loss is one :func:`register_policy_loss`; an unknown
name raises with the known ones.

**Exact normalisers for gradient accumulation.** Every registered loss declares the unit its mean
is over (events, members, rows or tokens, :data:`DENOMINATOR_UNITS`). The trainer counts that unit
over the whole minibatch (:func:`loss_denominator`) and passes it as ``LossConfig.denominator`` to
each micro-batch's call, so the micro-batch losses (and gradients) sum exactly to the minibatch's.

Conventions shared by every function:

* Token tensors are ``[R, T]``: one row per consumed output (a :class:`agents.rows.Row`), ``T`` the
  padded response width. ``mask`` is 1 for tokens the policy generated and 0 for environment-inserted
  text and padding (bool, integer or float masks are all accepted; a float mask acts as a weight).
  Masked-out positions are excluded with ``torch.where``, so they may hold *any* value, even
  ``nan``/``inf``, without affecting the loss or its gradient.
* Log-ratios are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp`` (as verl does):
  a policy that has drifted far from the behaviour policy then yields a large but finite ratio instead
  of ``inf``/``nan``; the gradient of a clamped ratio is zero, which is what clipping would do anyway.
* Every loss returns ``(loss, stats)`` where ``loss`` is a 0-dim tensor to ``backward()`` and
  ``stats`` a ``dict[str, float]`` of detached diagnostics for logging.
* Everything is dtype-preserving (float32 and float64 are tested; bf16 logits should be upcast by the
  caller, see :func:`logprobs_from_logits`) and contains no Python loop over rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from srpo_common import plugins

__all__ = [
    "AGG_MODES",
    "AGG_UNITS",
    "DENOMINATOR_UNITS",
    "EVENT_NORMS",
    "LossConfig",
    "PolicyLoss",
    "get_policy_loss",
    "gspo_loss",
    "loss_denominator",
    "members_as_events",
    "register_policy_loss",
    "LOG_RATIO_CLAMP",
    "POLICY_LOSSES",
    "RATIO_LEVELS",
    "aggregate",
    "entropy_from_logits",
    "grpo_loss",
    "kl_k3",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "ppo_policy_loss",
    "register_agg_mode",
    "register_event_norm",
    "srpo_loss",
    "value_loss",
]

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to ``[-20, 20]`` before ``exp`` (verl uses the same bound)."""

Stats = dict[str, float]

DENOMINATOR_UNITS = ("events", "members", "rows", "tokens")
"""What a loss averages over: events, members (every row), rows with at least one loss token, loss
tokens. Gradient accumulation divides every micro-batch's sum by the *whole minibatch's* count."""
RATIO_LEVELS = ("token", "sequence", "sequence-mean", "event")
"""Where a loss's importance ratio lives: per token (GRPO/PPO), per sequence (GSPO) or per event (SRPO)."""


# --------------------------------------------------------------------------------------------------
# masked reductions
# --------------------------------------------------------------------------------------------------


def _weights(mask: Tensor, like: Tensor) -> Tensor:
    """A mask as weights in ``like``'s dtype (bool/int masks become 0/1)."""
    return mask.to(dtype=like.dtype, device=like.device)


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * mask)`` that ignores whatever ``x`` holds where ``mask == 0`` (even nan/inf)."""
    w = _weights(mask, x)
    xw = torch.where(w != 0, x * w, torch.zeros((), dtype=x.dtype, device=x.device))
    return xw.sum() if dim is None else xw.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Weighted mean of ``x`` under ``mask``; 0 (not nan) where the mask is empty.

    Why not ``mask.sum().clamp_min(1)``: a float mask may carry fractional weights, so the empty case
    is guarded with the smallest positive normal instead, which turns ``0 / 0`` into ``0``.
    """
    w = _weights(mask, x)
    num = masked_sum(x, w, dim)
    den = w.sum() if dim is None else w.sum(dim)
    return num / den.clamp_min(torch.finfo(x.dtype).tiny)


def _check_token_inputs(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> None:
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [R, T], got shape {tuple(logprobs.shape)}")
    if old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"shape mismatch: logprobs {tuple(logprobs.shape)}, old_logprobs "
            f"{tuple(old_logprobs.shape)}, mask {tuple(mask.shape)} must all be [R, T]"
        )
    if not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be floating point, got {logprobs.dtype}")
    if logprobs.shape[0] == 0:
        raise ValueError("empty batch: no rows")


def _masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token ``logprobs - old_logprobs``, 0 where masked out (so padding can hold anything)."""
    diff = logprobs - old_logprobs.to(dtype=logprobs.dtype).detach()
    keep = _weights(mask, logprobs) != 0
    return torch.where(keep, diff, torch.zeros((), dtype=diff.dtype, device=diff.device))


def _checked_token_weights(token_weights: Tensor, logprobs: Tensor) -> Tensor:
    """Per-token loss weights as a detached tensor in ``logprobs``' dtype/device (shape-checked)."""
    if token_weights.shape != logprobs.shape:
        raise ValueError(
            f"token_weights {tuple(token_weights.shape)} must match logprobs {tuple(logprobs.shape)}"
        )
    return token_weights.detach().to(dtype=logprobs.dtype, device=logprobs.device)


def _clip_bounds(clip_eps: float, clip_eps_high: float | None) -> tuple[float, float]:
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if clip_eps < 0 or high < 0:
        raise ValueError(f"clip eps must be >= 0, got low={clip_eps}, high={high}")
    return 1.0 - clip_eps, 1.0 + high


# --------------------------------------------------------------------------------------------------
# token-loss aggregation (GRPO / PPO)
# --------------------------------------------------------------------------------------------------

AggFn = Callable[[Tensor, Tensor, "int | None", "float | None"], Tensor]
AGG_MODES: dict[str, AggFn] = {}
"""``loss_agg_mode`` name -> ``fn(loss_mat [R, T], mask [R, T], norm_len, denominator) -> scalar``."""
AGG_UNITS: dict[str, str] = {}
"""``loss_agg_mode`` name -> the unit its mean is over (``tokens`` or ``rows``, see
:func:`loss_denominator`)."""


def register_agg_mode(name: str, unit: str = "tokens") -> Callable[[AggFn], AggFn]:
    """Register a token-loss aggregation under ``name`` whose mean is over ``unit`` (decorator)."""
    if unit not in DENOMINATOR_UNITS:
        raise ValueError(f"unit must be one of {DENOMINATOR_UNITS}, got {unit!r}")

    def deco(fn: AggFn) -> AggFn:
        AGG_MODES[name] = fn
        AGG_UNITS[name] = unit
        return fn

    return deco


def loss_denominator(unit: str, mask: Tensor, event_index: Tensor | None = None) -> float:
    """The count a loss with ``unit`` averages over, for the rows ``mask`` (``[R, T]``) and
    ``event_index`` (``[R]``, needed for ``events``): pass it as ``denominator`` to every
    micro-batch's loss so their sum equals the loss of the whole batch."""
    w = mask.to(torch.float64)
    if unit == "tokens":
        return float(w.sum())
    if unit == "rows":
        return float((w.sum(-1) != 0).sum())
    if unit == "members":
        return float(mask.shape[0])
    if unit == "events":
        if event_index is None:
            raise ValueError("the events denominator needs event_index")
        return float(torch.unique(event_index).numel())
    raise ValueError(f"unknown denominator unit {unit!r}; known: {DENOMINATOR_UNITS}")


def _check_denominator(denominator: float | None) -> None:
    if denominator is not None and not denominator > 0:
        raise ValueError(f"denominator must be positive, got {denominator}")


def _seq_mean(per_seq: Tensor, mask: Tensor, denominator: float | None = None) -> Tensor:
    """Mean over the rows that have at least one loss token (or their sum / ``denominator``).

    A fully-masked row (e.g. a response made only of environment text) carries no policy signal; we
    leave it out rather than let it dilute the mean.
    """
    has_tokens = _weights(mask, per_seq).sum(-1) != 0
    if denominator is not None:
        return masked_sum(per_seq, has_tokens) / denominator
    return masked_mean(per_seq, has_tokens)


@register_agg_mode("token-mean", unit="tokens")
def _agg_token_mean(
    loss_mat: Tensor, mask: Tensor, norm_len: int | None = None, denominator: float | None = None
) -> Tensor:
    """Mean over all loss tokens of the batch (DAPO / verl default): long outputs weigh more."""
    if denominator is not None:
        return masked_sum(loss_mat, mask) / denominator
    return masked_mean(loss_mat, mask)


@register_agg_mode("seq-mean-token-mean", unit="rows")
def _agg_seq_mean_token_mean(
    loss_mat: Tensor, mask: Tensor, norm_len: int | None = None, denominator: float | None = None
) -> Tensor:
    """Mean over tokens of each row, then mean over rows (original GRPO)."""
    return _seq_mean(masked_mean(loss_mat, mask, dim=-1), mask, denominator)


@register_agg_mode("seq-mean-token-sum", unit="rows")
def _agg_seq_mean_token_sum(
    loss_mat: Tensor, mask: Tensor, norm_len: int | None = None, denominator: float | None = None
) -> Tensor:
    """Sum over tokens of each row, then mean over rows."""
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1), mask, denominator)


@register_agg_mode("seq-mean-token-sum-norm", unit="rows")
def _agg_seq_mean_token_sum_norm(
    loss_mat: Tensor, mask: Tensor, norm_len: int | None = None, denominator: float | None = None
) -> Tensor:
    """Dr.GRPO: sum over tokens / a *constant* length, then mean over rows.

    ``norm_len`` must be the generation budget (max new tokens) so the normaliser does not depend on
    the batch (the trainer passes ``max_new_tokens``); without it the padded width ``T`` of
    ``loss_mat`` is used, which changes with the batch.
    """
    denom = loss_mat.shape[-1] if norm_len is None else norm_len
    if denom <= 0:
        raise ValueError(f"norm_len must be positive, got {denom}")
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1) / denom, mask, denominator)


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    norm_len: int | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce a ``[R, T]`` per-token loss to a scalar with the aggregation mode ``mode``.

    Modes (:data:`AGG_MODES`): ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
    ``seq-mean-token-sum-norm`` (Dr.GRPO, uses ``norm_len``). ``seq-mean-*`` modes average over rows
    with at least one loss token. ``denominator`` replaces this call's own count of the mode's unit
    (:data:`AGG_UNITS`) — the whole minibatch's count when accumulating micro-batches.
    """
    if loss_mat.shape != mask.shape or loss_mat.ndim != 2:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be [R, T]")
    _check_denominator(denominator)
    try:
        fn = AGG_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {sorted(AGG_MODES)}") from None
    return fn(loss_mat, mask, norm_len, denominator)


# --------------------------------------------------------------------------------------------------
# SRPO: event-level ratio
# --------------------------------------------------------------------------------------------------

NormFn = Callable[[Tensor], Tensor]
EVENT_NORMS: dict[str, NormFn] = {}
"""Event log-ratio normaliser name -> ``c(K)`` (K: float tensor of event cardinalities). A norm
registered with ``members_as_events=True`` (``k1``) treats every member as its own event."""


def register_event_norm(name: str, members_as_events: bool = False) -> Callable[[NormFn], NormFn]:
    """Register ``c(K)`` for :func:`srpo_loss` under ``name`` (decorator).

    ``members_as_events=True``: the loss splits every event into K one-member events (each with the
    event's advantage) before applying ``c``; the mean is then over members, not events.
    """

    def deco(fn: NormFn) -> NormFn:
        fn.members_as_events = members_as_events  # type: ignore[attr-defined]
        EVENT_NORMS[name] = fn
        return fn

    return deco


def members_as_events(norm: str) -> bool:
    """Whether the event norm ``norm`` treats every member as its own event (``k1``)."""
    return bool(getattr(_event_norm(norm), "members_as_events", False))


def _event_norm(norm: str) -> NormFn:
    try:
        return EVENT_NORMS[norm]
    except KeyError:
        raise ValueError(f"unknown event norm {norm!r}; known: {sorted(EVENT_NORMS)}") from None


@register_event_norm("sqrt")
def _norm_sqrt(k: Tensor) -> Tensor:
    """``c = sqrt(K)``: if member log-ratios are ~iid, ``L_e`` keeps their scale for every K, so one
    ``clip_eps`` means the same trust region for single- and many-agent events."""
    return k.sqrt()


@register_event_norm("sum")
def _norm_sum(k: Tensor) -> Tensor:
    """``c = 1``: the exact joint ratio of the K consumed outputs (product of member ratios)."""
    return torch.ones_like(k)


@register_event_norm("mean")
def _norm_mean(k: Tensor) -> Tensor:
    """``c = K``: geometric mean of the member ratios (the most permissive for large K)."""
    return k


@register_event_norm("k1", members_as_events=True)
def _norm_k1(k: Tensor) -> Tensor:
    """K=1 ablation: every member its own event (a response-level update with the event's
    advantage); ``c = 1`` on the resulting one-member events."""
    return torch.ones_like(k)


def srpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    event_index: Tensor,
    advantages: Tensor,
    clip_eps: float = 0.2,
    norm: str = "sqrt",
    num_events: int | float | None = None,
    clip_eps_high: float | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """SRPO event-level clipped surrogate.

    Args:
        logprobs: ``[R, T]`` current-policy log-probs of the response tokens (carries the gradient).
        old_logprobs: ``[R, T]`` behaviour log-probs (``Row.behaviour_logprobs``); detached.
        mask: ``[R, T]`` loss mask (``Row.response_mask`` padded with 0).
        event_index: ``LongTensor[R]`` mapping each row to its event ``0..E-1`` (minibatch-local).
        advantages: ``[E]`` one advantage per event; detached.
        clip_eps: PPO clip range on the *event* ratio (lower side, and upper unless ``clip_eps_high``).
        norm: name in :data:`EVENT_NORMS` (``sqrt`` | ``sum`` | ``mean`` | ``k1``: every member its
            own event, the mean then over members).
        num_events: denominator of the event mean; defaults to ``E``. When one optimiser step is
            accumulated over several minibatches, pass the step's total event count so the sum of the
            minibatch losses equals the full-batch loss.
        clip_eps_high: optional asymmetric upper clip (DAPO "clip-higher").
        token_weights: optional ``[R, T]`` detached per-token weights ``w`` (truncated importance
            sampling between the rollout and the training policy: one weight per token, per row, or
            one per event repeated on its rows' tokens). They weight each member token's share of the
            event's gradient and leave the ratio's *value* alone, in the stop-gradient form
            ``L_e = sg[L_e] + sum_{j in e} sum_t w_jt (lp_jt - sg[lp_jt]) / c(K_e)`` (GSPO's, see
            :func:`gspo_loss`): the clip decides on the same ``rho_e``, and the unclipped gradient
            becomes ``A_e rho_e / c(K_e) sum_j sum_t w_jt grad lp_jt``, so a row weighted 2.0 pulls
            twice as hard as one weighted 0.5 *inside* one event, and an event-level weight ``w_e``
            on all of an event's tokens scales that event's gradient by ``w_e``. ``w = 1`` is
            exactly the unweighted loss; the loss value is the unweighted one.

    Maths: member log-ratio ``l_j = sum_t mask * (logprobs - old_logprobs)``; event log-ratio
    ``L_e = sum_{j in e} l_j / c(K_e)`` with ``K_e`` the number of rows of event ``e``;
    ``rho_e = exp(clamp(L_e, -20, 20))``; loss ``= -1/num_events * sum_e min(rho_e A_e,
    clip(rho_e, 1-eps, 1+eps) A_e)``.

    Stats: ``clip_frac`` (fraction of events whose clipped term is the active, strictly smaller one,
    i.e. whose gradient is cut), ``mean_abs_log_ratio`` (mean ``|L_e|``), ``approx_kl`` (mean over
    events of ``0.5 * L_e**2``, the k2 estimator on the *normalised* event log-ratio; it is the
    quantity the clip acts on, so it is the one worth watching), ``mean_k``, ``max_k``,
    ``num_events`` (``E``).

    Raises:
        ValueError: unknown ``norm``, shape/dtype mismatch, an event index outside ``0..E-1``, or an
            event with no rows.
    """
    _check_token_inputs(logprobs, old_logprobs, mask)
    norm_fn = _event_norm(norm)
    num_rows = logprobs.shape[0]
    if event_index.ndim != 1 or event_index.shape[0] != num_rows:
        raise ValueError(f"event_index must be [R={num_rows}], got shape {tuple(event_index.shape)}")
    if event_index.is_floating_point() or event_index.is_complex() or event_index.dtype == torch.bool:
        raise ValueError(f"event_index must be an integer tensor, got {event_index.dtype}")
    if advantages.ndim != 1 or advantages.shape[0] == 0:
        raise ValueError(f"advantages must be a non-empty [E] tensor, got shape {tuple(advantages.shape)}")
    if getattr(norm_fn, "members_as_events", False):
        if int(event_index.min()) < 0 or int(event_index.max()) >= advantages.shape[0]:
            raise ValueError(f"event_index holds values outside 0..{advantages.shape[0] - 1}")
        advantages = advantages[event_index.to(device=advantages.device, dtype=torch.long)]
        event_index = torch.arange(num_rows, device=event_index.device)
    if num_events is not None and num_events <= 0:
        raise ValueError(f"num_events must be positive, got {num_events}")
    n_ev = advantages.shape[0]
    dtype, device = logprobs.dtype, logprobs.device
    idx = event_index.to(device=device, dtype=torch.long)

    # K_e by scatter; one host sync validates the index range and that no event is empty.
    # K_e by scatter. Out-of-range indices are routed to an extra slot n_ev, so nothing below can
    # fault on a bad index; validity is checked in the *same* host sync that reads the stats, so
    # SRPO costs one sync per call, like grpo_loss.
    safe = torch.where((idx >= 0) & (idx < n_ev), idx, n_ev)
    k_all = torch.zeros(n_ev + 1, dtype=dtype, device=device)
    k_all.index_add_(0, safe, torch.ones(num_rows, dtype=dtype, device=device))
    k = k_all[:n_ev]

    member = _masked_log_ratio(logprobs, old_logprobs, mask).sum(-1)  # l_j, [R]
    if token_weights is not None:  # same value, each token's gradient times its weight
        w = _checked_token_weights(token_weights, logprobs)
        zero_valued = _masked_log_ratio(logprobs, logprobs.detach(), mask)  # value 0, gradient grad lp
        member = member.detach() + masked_sum(zero_valued * w, mask, dim=-1)
    summed = torch.zeros(n_ev + 1, dtype=dtype, device=device).index_add(0, safe, member)[:n_ev]
    log_ratio = summed / norm_fn(k.clamp_min(1.0))  # L_e, [E] (clamp: empty events raise below)
    rho = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))

    lo, hi = _clip_bounds(clip_eps, clip_eps_high)
    adv = advantages.detach().to(dtype=dtype, device=device)
    surr = rho * adv
    surr_clipped = rho.clamp(lo, hi) * adv
    objective = torch.minimum(surr, surr_clipped)
    denom = float(n_ev if num_events is None else num_events)
    loss = -objective.sum() / denom

    with torch.no_grad():
        vals = torch.stack(
            [
                (surr_clipped < surr).to(dtype).mean(),
                log_ratio.abs().mean(),
                (0.5 * log_ratio.square()).mean(),
                k.mean(),
                k.max(),
                k_all[n_ev],
                (k == 0).sum().to(dtype),
            ]
        ).tolist()
    if vals[5] > 0:
        raise ValueError(f"event_index holds {int(vals[5])} value(s) outside 0..{n_ev - 1}")
    if vals[6] > 0:
        raise ValueError(f"{int(vals[6])} of {n_ev} events have no rows (every event needs >= 1 row)")
    stats: Stats = {
        "clip_frac": vals[0],
        "mean_abs_log_ratio": vals[1],
        "approx_kl": vals[2],
        "mean_k": vals[3],
        "max_k": vals[4],
        "num_events": float(n_ev),
    }
    return loss, stats


# --------------------------------------------------------------------------------------------------
# GRPO / PPO token-level and sequence-level surrogates
# --------------------------------------------------------------------------------------------------


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    clip_eps: float = 0.2,
    agg: str = "token-mean",
    clip_eps_high: float | None = None,
    norm_len: int | None = None,
    denominator: float | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """Token-level PPO-clip surrogate with per-output (GRPO) or per-token advantages.

    Args:
        logprobs, old_logprobs, mask: ``[R, T]`` as in :func:`srpo_loss`.
        advantages: ``[R]`` (one per output, broadcast over its tokens: GRPO) or ``[R, T]`` (per token,
            e.g. GAE for PPO/MAPPO); detached.
        clip_eps / clip_eps_high: clip range ``[1 - clip_eps, 1 + (clip_eps_high or clip_eps)]``.
        agg: token aggregation, a name in :data:`AGG_MODES` (see :func:`aggregate`).
        norm_len: the constant length of ``seq-mean-token-sum-norm`` (Dr.GRPO).
        denominator: see :func:`aggregate` (gradient accumulation).
        token_weights: optional ``[R, T]`` detached per-token weights ``w_t`` on the clipped surrogate
            (token-level truncated importance sampling between the rollout and the training policy,
            as verl/OpenRLHF apply it: the clipped per-token loss times ``w_t``, then ``aggregate``;
            the normaliser is unchanged, so ``w = 1`` is exactly the unweighted loss).

    Per token: ``r = exp(clamp(lp - old, -20, 20))``, loss ``= max(-A r, -A clip(r))`` (times
    ``w_t``); then ``aggregate``. Stats: ``clip_frac`` (token fraction where the clipped term is active),
    ``approx_kl`` (token mean of ``0.5 * (lp - old)**2``, k2), ``mean_abs_log_ratio``,
    ``num_tokens``.
    """
    _check_token_inputs(logprobs, old_logprobs, mask)
    dtype, device = logprobs.dtype, logprobs.device
    adv = advantages.detach().to(dtype=dtype, device=device)
    if adv.shape == logprobs.shape[:1]:
        adv = adv.unsqueeze(-1)
    elif adv.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [R] or [R, T] = {tuple(logprobs.shape)}, got {tuple(advantages.shape)}"
        )
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    lo, hi = _clip_bounds(clip_eps, clip_eps_high)
    pg = -adv * ratio
    pg_clipped = -adv * ratio.clamp(lo, hi)
    loss_mat = torch.maximum(pg, pg_clipped)
    if token_weights is not None:
        loss_mat = loss_mat * _checked_token_weights(token_weights, logprobs)
    loss = aggregate(loss_mat, mask, agg, norm_len, denominator)
    with torch.no_grad():
        vals = torch.stack(
            [
                masked_mean((pg_clipped > pg).to(dtype), mask),
                masked_mean(0.5 * log_ratio.square(), mask),
                masked_mean(log_ratio.abs(), mask),
                _weights(mask, logprobs).sum(),
            ]
        ).tolist()
    stats: Stats = {
        "clip_frac": vals[0],
        "approx_kl": vals[1],
        "mean_abs_log_ratio": vals[2],
        "num_tokens": vals[3],
    }
    return loss, stats


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    clip_eps: float = 0.2,
    level: str = "token",
    agg: str = "token-mean",
    clip_eps_high: float | None = None,
) -> tuple[Tensor, Stats]:
    """PPO clip for MAPPO-style per-agent updates.

    ``level="token"``: token-level ratio (exactly :func:`grpo_loss`; ``advantages`` ``[R]`` or
    ``[R, T]``). ``level="sequence"``: one ratio per output, ``exp(sum_t mask (lp - old))``, with
    per-output advantages ``[R]``; loss is the mean over rows (``agg`` is ignored). The sequence level
    is what SRPO reduces to when every event has ``K = 1``.
    """
    if level == "token":
        return grpo_loss(logprobs, old_logprobs, mask, advantages, clip_eps, agg, clip_eps_high)
    if level != "sequence":
        raise ValueError(f"unknown PPO level {level!r}; use 'token' or 'sequence'")
    _check_token_inputs(logprobs, old_logprobs, mask)
    dtype = logprobs.dtype
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"sequence-level advantages must be [R], got {tuple(advantages.shape)}")
    adv = advantages.detach().to(dtype=dtype, device=logprobs.device)
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask).sum(-1)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    lo, hi = _clip_bounds(clip_eps, clip_eps_high)
    pg = -adv * ratio
    pg_clipped = -adv * ratio.clamp(lo, hi)
    loss = torch.maximum(pg, pg_clipped).mean()
    with torch.no_grad():
        vals = torch.stack(
            [(pg_clipped > pg).to(dtype).mean(), (0.5 * log_ratio.square()).mean(), log_ratio.abs().mean()]
        ).tolist()
    return loss, {"clip_frac": vals[0], "approx_kl": vals[1], "mean_abs_log_ratio": vals[2]}


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    clip_eps: float | None = 0.2,
    mask: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """PPO clipped value loss: ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)``.

    Any shape (``[E]`` per event for a centralised critic, ``[R, T]`` per token); ``mask`` (same shape)
    selects the entries averaged. ``clip_eps=None`` disables clipping (plain 0.5 MSE).
    Stats: ``vf_clip_frac`` (fraction where the clipped error is the larger one), ``vf_mse``.
    """
    if values.shape != old_values.shape or values.shape != returns.shape:
        raise ValueError(
            f"shape mismatch: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, "
            f"returns {tuple(returns.shape)}"
        )
    if mask is None:
        mask = torch.ones_like(values)
    elif mask.shape != values.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must match values {tuple(values.shape)}")
    ret = returns.detach().to(values.dtype)
    err = (values - ret).square()
    if clip_eps is None:
        err_clipped = err
    else:
        old = old_values.detach().to(values.dtype)
        v_clipped = old + (values - old).clamp(-clip_eps, clip_eps)
        err_clipped = (v_clipped - ret).square()
    loss = 0.5 * masked_mean(torch.maximum(err, err_clipped), mask)
    with torch.no_grad():
        vals = torch.stack(
            [masked_mean((err_clipped > err).to(values.dtype), mask), masked_mean(err, mask)]
        ).tolist()
    return loss, {"vf_clip_frac": vals[0], "vf_mse": vals[1]}


# --------------------------------------------------------------------------------------------------
# KL, entropy, log-probs
# --------------------------------------------------------------------------------------------------


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, clamp: float = 10.0) -> Tensor:
    """Per-token k3 estimator of ``KL(pi || ref)`` on samples from ``pi``: ``e^d - d - 1``,
    ``d = ref - lp``.

    Non-negative and unbiased with low variance (Schulman's "approximating KL"). ``d`` is clamped to
    ``[-20, 20]`` before ``exp`` and the result to ``[0, clamp]`` (verl's ``low_var_kl``) so a few
    far-off tokens cannot dominate the penalty. Mask/aggregate the ``[R, T]`` result yourself.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"shape mismatch: {tuple(logprobs.shape)} vs {tuple(ref_logprobs.shape)}")
    d = (ref_logprobs.detach().to(logprobs.dtype) - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1).clamp(0.0, clamp)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` over the last dim: ``logsumexp(z) - sum(softmax(z) * z)``.

    Half-precision logits are upcast to float32 (the subtraction cancels badly in bf16).
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[labels]`` without materialising the full log-softmax.

    ``logits`` ``[..., V]``, ``labels`` ``[...]`` -> ``[...]``. Half precision is upcast to float32.
    ``temperature`` must match the sampler's so the result is comparable to behaviour log-probs.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature != 1.0:
        z = z / temperature
    picked = z.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


# --------------------------------------------------------------------------------------------------
# GSPO: sequence-level, length-normalised ratio
# --------------------------------------------------------------------------------------------------


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    denominator: float | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization") sequence-level surrogate.

    ``s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|) = exp(1/|y_i| sum_t mask (lp - old))``: the
    geometric mean of the token ratios of output ``i``, so one clip range means the same for short and
    long outputs; clipping acts on the whole sequence:
    ``loss = -1/G sum_i min(s_i A_i, clip(s_i, 1-eps, 1+eps) A_i)`` over rows with at least one loss
    token (``denominator`` replaces that count when accumulating). The paper's clip range is far
    smaller than PPO's (3e-4 / 4e-4) because ``log s_i`` is a per-token average.

    ``token_weights`` (``[R, T]``, detached; token-level truncated importance sampling) weight each
    token's share of the sequence gradient: ``log s_i`` keeps its value (so clipping decides on the
    same ratio) but its gradient becomes ``1/|y_i| sum_t w_t grad log pi(y_t)`` (the stop-gradient
    form ``sg[log s_i] + 1/|y_i| sum_t w_t (lp_t - sg[lp_t])``, which is what verl's per-token GSPO
    loss times the IS weight differentiates to). ``w = 1`` is exactly the unweighted loss.

    Stats: ``clip_frac`` (rows whose clipped term is active), ``mean_abs_log_ratio`` (mean
    ``|log s_i|``), ``approx_kl`` (mean ``0.5 log(s_i)^2``).
    """
    _check_token_inputs(logprobs, old_logprobs, mask)
    _check_denominator(denominator)
    dtype = logprobs.dtype
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"GSPO advantages must be [R], got {tuple(advantages.shape)}")
    adv = advantages.detach().to(dtype=dtype, device=logprobs.device)
    lengths = _weights(mask, logprobs).sum(-1)
    has_tokens = lengths != 0
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask).sum(-1) / lengths.clamp_min(1.0)
    if token_weights is not None:
        w = _checked_token_weights(token_weights, logprobs)
        zero_valued = _masked_log_ratio(logprobs, logprobs.detach(), mask)  # value 0, gradient grad lp
        log_ratio = log_ratio.detach() + masked_sum(zero_valued * w, mask, dim=-1) / lengths.clamp_min(1.0)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    lo, hi = _clip_bounds(clip_eps, clip_eps_high)
    pg = -adv * ratio
    pg_clipped = -adv * ratio.clamp(lo, hi)
    per_seq = torch.maximum(pg, pg_clipped)
    if denominator is None:
        loss = masked_mean(per_seq, has_tokens)
    else:
        loss = masked_sum(per_seq, has_tokens) / denominator
    with torch.no_grad():
        vals = torch.stack(
            [
                masked_mean((pg_clipped > pg).to(dtype), has_tokens),
                masked_mean(0.5 * log_ratio.square(), has_tokens),
                masked_mean(log_ratio.abs(), has_tokens),
            ]
        ).tolist()
    return loss, {"clip_frac": vals[0], "approx_kl": vals[1], "mean_abs_log_ratio": vals[2]}


# --------------------------------------------------------------------------------------------------
# the policy-loss registry: one signature for every algorithm
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossConfig:
    """The knobs every registered policy loss receives (each reads what its definition needs).

    ``denominator``: the exact count of the loss's unit (:data:`DENOMINATOR_UNITS`) over the whole
    minibatch when it is accumulated over micro-batches; None = this call's own count.

    ``token_weights``: optional ``[R, T]`` per-token weights on the surrogate, aligned with the call's
    ``logprobs``: truncated importance sampling (:func:`learners.offpolicy.tis_weights`) at token,
    sequence or event level, a per-row or per-event weight repeated on its tokens, so that every row
    gets its *own* weight in every loss (an event loss such as SRPO reduces per-row advantages to one
    per event, so a weight folded into the advantages would reach one member only). Why a config
    field and not a sixth argument: every registered loss keeps one signature, and only losses
    registered with ``token_weights=True`` accept it (:class:`PolicyLoss` refuses it for the others
    rather than silently ignoring it).
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    norm: str = "sqrt"
    agg: str = "token-mean"
    norm_len: int | None = None
    denominator: float | None = None
    token_weights: Tensor | None = field(default=None, compare=False, repr=False)


PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, LossConfig], tuple[Tensor, Stats]]
"""``fn(logprobs [R, T], old_logprobs [R, T], mask [R, T], advantages [R], event_index [R], cfg)``
-> ``(loss, stats)``. ``advantages`` is per row (rows of an event share their event's advantage);
``event_index`` maps rows to micro-batch-local events ``0..E-1``."""


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss, the unit its mean is over (a function of the config, since an
    aggregation mode or an event norm can change it), whether it accepts per-token weights
    (``LossConfig.token_weights``) and the level its importance ratio lives at (``token``,
    ``sequence`` or ``event``; also a function of the config): the default level of truncated
    importance sampling (``--tis auto``), as in verl, where a per-token loss takes per-token weights."""

    name: str
    fn: PolicyLossFn
    unit: Callable[[LossConfig], str]
    token_weights: bool = False
    ratio_level: Callable[[LossConfig], str] = lambda cfg: "token"

    def __call__(self, *args: Tensor | LossConfig) -> tuple[Tensor, Stats]:
        cfg = args[-1]
        if isinstance(cfg, LossConfig) and cfg.token_weights is not None and not self.token_weights:
            raise ValueError(
                f"policy loss {self.name!r} does not take per-token weights (token-level truncated "
                "importance sampling); use sequence- or event-level weights (--tis sequence|event)"
            )
        return self.fn(*args)  # type: ignore[arg-type]


POLICY_LOSSES: dict[str, PolicyLoss] = {}
plugins.watch("policy loss", POLICY_LOSSES)  # type: ignore[arg-type]  # a plugin may add, not replace
"""Policy-loss name -> :class:`PolicyLoss`; trainers look the configured loss up here."""


def register_policy_loss(
    name: str,
    unit: str | Callable[[LossConfig], str] = "tokens",
    token_weights: bool = False,
    ratio_level: str | Callable[[LossConfig], str] = "token",
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss with the uniform signature :data:`PolicyLossFn` (decorator).

    ``unit``: what the loss averages over (one of :data:`DENOMINATOR_UNITS`), or a function of the
    :class:`LossConfig` returning it; the trainer computes the whole minibatch's count from it and
    passes it as ``cfg.denominator`` so micro-batch gradients sum to the big-batch gradient.
    ``token_weights``: the loss applies ``cfg.token_weights`` (per-token truncated importance
    weights); losses that do not are refused them rather than silently ignoring them.
    ``ratio_level``: ``token``, ``sequence`` or ``event`` (:data:`RATIO_LEVELS`), or a function of the
    config returning one: where the loss's importance ratio lives (the ``--tis auto`` level).
    """
    if isinstance(unit, str):
        if unit not in DENOMINATOR_UNITS:
            raise ValueError(f"unit must be one of {DENOMINATOR_UNITS}, got {unit!r}")
        fixed = unit
        unit = lambda cfg: fixed  # noqa: E731
    if isinstance(ratio_level, str):
        if ratio_level not in RATIO_LEVELS:
            raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
        level = ratio_level
        ratio_level = lambda cfg: level  # noqa: E731

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = PolicyLoss(name, fn, unit, token_weights, ratio_level)
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as ``name``; an unknown name raises with the known ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}") from None


def _event_advantages(advantages: Tensor, event_index: Tensor) -> Tensor:
    """``[E]`` per-event advantages from per-row ones (rows of an event share the value).

    Rows of one event that disagree are an error, not a silent pick of one of them: a per-row weight
    folded into the advantages would otherwise reach one member and be applied to all (per-row
    weights belong in ``LossConfig.token_weights``)."""
    n = int(event_index.max()) + 1
    idx = event_index.to(advantages.device)
    per_event = torch.zeros(n, dtype=advantages.dtype, device=advantages.device).index_copy(0, idx, advantages)
    if not torch.equal(per_event[idx], advantages):
        raise ValueError(
            "rows of one event carry different advantages; SRPO has one advantage per event (per-row "
            "weights go in LossConfig.token_weights)"
        )
    return per_event


def _srpo_ratio_level(cfg: LossConfig) -> str:
    return "sequence" if members_as_events(cfg.norm) else "event"


@register_policy_loss(
    "srpo",
    unit=lambda cfg: "members" if members_as_events(cfg.norm) else "events",
    token_weights=True,
    ratio_level=_srpo_ratio_level,
)
def _srpo_policy_loss(
    logprobs: Tensor, old: Tensor, mask: Tensor, advantages: Tensor, event_index: Tensor, cfg: LossConfig
) -> tuple[Tensor, Stats]:
    """SRPO's event-level clipped surrogate (:func:`srpo_loss`)."""
    return srpo_loss(
        logprobs,
        old,
        mask,
        event_index,
        _event_advantages(advantages, event_index),
        clip_eps=cfg.clip_eps,
        norm=cfg.norm,
        num_events=cfg.denominator,
        clip_eps_high=cfg.clip_eps_high,
        token_weights=cfg.token_weights,
    )


@register_policy_loss("grpo", unit=lambda cfg: AGG_UNITS.get(cfg.agg, "tokens"), token_weights=True)
def _grpo_policy_loss(
    logprobs: Tensor, old: Tensor, mask: Tensor, advantages: Tensor, event_index: Tensor, cfg: LossConfig
) -> tuple[Tensor, Stats]:
    """Token-level PPO clip with per-output advantages (:func:`grpo_loss`); also MAPPO's actor loss."""
    return grpo_loss(
        logprobs,
        old,
        mask,
        advantages,
        clip_eps=cfg.clip_eps,
        agg=cfg.agg,
        clip_eps_high=cfg.clip_eps_high,
        norm_len=cfg.norm_len,
        denominator=cfg.denominator,
        token_weights=cfg.token_weights,
    )


@register_policy_loss("ppo", unit=lambda cfg: AGG_UNITS.get(cfg.agg, "tokens"), token_weights=True)
def _ppo_policy_loss(
    logprobs: Tensor, old: Tensor, mask: Tensor, advantages: Tensor, event_index: Tensor, cfg: LossConfig
) -> tuple[Tensor, Stats]:
    """PPO's token-level clip (MAPPO's per-agent actor update): the same maths as ``grpo``."""
    return _grpo_policy_loss(logprobs, old, mask, advantages, event_index, cfg)


@register_policy_loss("gspo", unit="rows", token_weights=True, ratio_level="sequence-mean")
def _gspo_policy_loss(
    logprobs: Tensor, old: Tensor, mask: Tensor, advantages: Tensor, event_index: Tensor, cfg: LossConfig
) -> tuple[Tensor, Stats]:
    """GSPO's sequence-level, length-normalised clipped surrogate (:func:`gspo_loss`)."""
    return gspo_loss(
        logprobs,
        old,
        mask,
        advantages,
        cfg.clip_eps,
        cfg.clip_eps_high,
        denominator=cfg.denominator,
        token_weights=cfg.token_weights,
    )
