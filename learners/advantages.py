"""Advantage estimators: group-relative (SRPO events, GRPO outputs) and GAE (MAPPO critic).

Pure functions of rewards / values (or of :class:`agents.rows.Row` lists, from which they only read
ids and rewards), registered by name in :data:`ADVANTAGE_ESTIMATORS` so a trainer picks one from its
config.

Group-relative normalisation, the decisions (shared by SRPO and GRPO here):

* **Population std** (``unbiased=False``) by default. SRPO groups vary in size (a step may exist in
  only some of the G rollouts), and with the population std every group's advantages have unit RMS
  whatever its size, so events of small groups are not systematically down-weighted; a group of two
  gives exactly ``+-1``. verl/TRL use the sample std (``torch.std``); pass ``unbiased=True`` to match
  them (it needs groups of >= 2, which singleton handling guarantees).
* **Singleton groups** (one comparable event/output) carry no relative signal: advantage ``0`` by
  default (``singleton="zero"``); ``"raw"`` keeps the raw reward (no baseline), ``"error"`` raises.
* **Zero-variance groups** (all rewards equal, detected exactly via ``max == min``) get advantage
  ``0``: nothing to prefer, and ``(R - mean) / (0 + eps)`` would otherwise amplify rounding noise.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from agents.rows import Row

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "event_advantages_from_rows",
    "event_group_key",
    "gae",
    "group_relative_event_advantages",
    "grpo_output_advantages",
    "register_advantage_estimator",
]

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Any]] = {}
"""Estimator name -> function. Inputs differ by family (rows for the group-relative ones, tensors for
GAE), as in verl's registry; the name tells the trainer which call to make."""

SINGLETON_POLICIES = ("zero", "raw", "error")


def register_advantage_estimator(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an advantage estimator under ``name`` (decorator)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


@register_advantage_estimator("group_relative")
def group_relative_event_advantages(
    rewards: Tensor | Sequence[float],
    group_keys: Sequence[Hashable],
    eps: float = 1e-6,
    singleton: str = "zero",
    unbiased: bool = False,
) -> Tensor:
    """``(R_e - mean_g) / (std_g + eps)`` over groups of comparable items (vectorised with scatter).

    Args:
        rewards: ``[E]`` one reward per item (event or output).
        group_keys: ``E`` hashable keys; items with equal keys are compared.
        eps: added to the std.
        singleton: ``"zero"`` | ``"raw"`` | ``"error"`` for groups of one (see module docstring).
        unbiased: sample std (``True``) instead of population std (``False``, default).

    Returns:
        ``[E]`` advantages in ``rewards``' floating dtype (float32 for non-float input).
    """
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.to(torch.float32)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D [E], got shape {tuple(r.shape)}")
    if len(group_keys) != r.shape[0]:
        raise ValueError(f"{len(group_keys)} group keys for {r.shape[0]} rewards")
    if singleton not in SINGLETON_POLICIES:
        raise ValueError(f"unknown singleton policy {singleton!r}; use one of {SINGLETON_POLICIES}")
    if r.shape[0] == 0:
        return r.clone()
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite")

    ids: dict[Hashable, int] = {}
    gid = torch.tensor([ids.setdefault(k, len(ids)) for k in group_keys], dtype=torch.long, device=r.device)
    n_groups = len(ids)
    counts = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gid, torch.ones_like(r))
    mean = torch.zeros_like(counts).index_add_(0, gid, r) / counts
    centred = r - mean[gid]
    sq = torch.zeros_like(counts).index_add_(0, gid, centred.square())
    dof = (counts - 1.0).clamp_min(1.0) if unbiased else counts
    std = (sq / dof).sqrt()
    gmax = torch.full_like(counts, -torch.inf).scatter_reduce_(0, gid, r, reduce="amax")
    gmin = torch.full_like(counts, torch.inf).scatter_reduce_(0, gid, r, reduce="amin")

    adv = centred / (std[gid] + eps)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    adv = torch.where((gmax == gmin)[gid], zero, adv)
    is_single = (counts == 1)[gid]
    if singleton == "error" and bool(is_single.any()):
        raise ValueError(f"{int(is_single.sum())} singleton group(s) and singleton='error'")
    return torch.where(is_single, r if singleton == "raw" else zero, adv)


def event_group_key(row: Row) -> tuple[str, str, str, int]:
    """Events are comparable iff same task group and same ``(task_id, event_type, step)``."""
    return (row.group_id, *row.comparable_key)


@register_advantage_estimator("srpo_event")
def event_advantages_from_rows(
    rows: Sequence[Row],
    eps: float = 1e-6,
    singleton: str = "zero",
    unbiased: bool = False,
) -> tuple[list[str], Tensor]:
    """Per-event group-relative advantages for SRPO.

    One entry per distinct ``event_id`` (in order of first appearance); the event's reward is
    ``Row.reward`` and its group :func:`event_group_key`. All rows are used, complete events or not:
    an event's reward is known even if some of its rows were lost, so it remains a valid baseline
    (filter with :func:`learners.batching.complete_events` first to exclude such events).

    Returns:
        ``(event_ids, advantages[E])`` float32. Map them to a minibatch with
        :meth:`learners.batching.MiniBatch.event_values`.

    Raises:
        ValueError: rows of one event disagree on reward or comparable key.
    """
    first: dict[str, Row] = {}
    for row in rows:
        seen = first.setdefault(row.event_id, row)
        if seen is row:
            continue
        if seen.reward != row.reward or event_group_key(seen) != event_group_key(row):
            raise ValueError(
                f"rows of event {row.event_id!r} disagree: reward {seen.reward} vs {row.reward}, "
                f"key {event_group_key(seen)} vs {event_group_key(row)}"
            )
    event_ids = list(first)
    rewards = torch.tensor([first[e].reward for e in event_ids], dtype=torch.float32)
    keys = [event_group_key(first[e]) for e in event_ids]
    return event_ids, group_relative_event_advantages(rewards, keys, eps, singleton, unbiased)


@register_advantage_estimator("grpo")
def grpo_output_advantages(
    rows: Sequence[Row],
    eps: float = 1e-6,
    singleton: str = "zero",
    unbiased: bool = False,
    reward_field: str = "outcome_reward",
) -> Tensor:
    """Per-output GRPO advantages: the team outcome normalised per ``(task group, role)``.

    Normalisation is over *episodes*, not rows: each rollout of the group in which the role acted
    contributes its outcome once, and every row of that role in that episode gets the episode's
    advantage. (Normalising over rows would let a rollout that called the role more often weigh more
    in the baseline.)

    Returns:
        ``[R]`` float32 advantages aligned with ``rows``.

    Raises:
        ValueError: two rows of the same (group, role, episode) carry different rewards.
    """
    slot: dict[tuple[str, str, str], int] = {}
    rewards: list[float] = []
    keys: list[tuple[str, str]] = []
    row_slot: list[int] = []
    for row in rows:
        key = (row.group_id, row.role, row.episode_id)
        value = float(getattr(row, reward_field))
        j = slot.get(key)
        if j is None:
            j = slot[key] = len(rewards)
            rewards.append(value)
            keys.append((row.group_id, row.role))
        elif rewards[j] != value:
            raise ValueError(
                f"rows of episode {row.episode_id!r} role {row.role!r} disagree on {reward_field}"
            )
        row_slot.append(j)
    if not rows:
        return torch.zeros(0, dtype=torch.float32)
    adv = group_relative_event_advantages(
        torch.tensor(rewards, dtype=torch.float32), keys, eps, singleton, unbiased
    )
    return adv[torch.tensor(row_slot, dtype=torch.long)]


@register_advantage_estimator("gae")
def gae(
    rewards: Tensor,
    values: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    dones: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over an episode's events (MAPPO with a centralised critic).

    Args:
        rewards: ``[..., T]`` per-event rewards (leading dims are batch, e.g. several episodes).
        values: ``[..., T + 1]`` (last entry bootstraps the state after the last event) or ``[..., T]``
            (the episode ended: bootstrap value 0).
        gamma, lam: discount and GAE lambda.
        dones: optional ``[..., T]``; ``dones[t] = 1`` means an episode ended *after* event ``t``, so
            ``V[t + 1]`` is not bootstrapped and the trace is cut (concatenated episodes).

    Returns:
        ``(advantages, returns)``, both ``[..., T]``, ``returns = advantages + values[..., :T]``
        (the critic's regression target). No gradient flows (values are detached).
    """
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.to(torch.float32)
    v = torch.as_tensor(values).detach().to(dtype=r.dtype, device=r.device)
    T = r.shape[-1]
    if v.shape[:-1] != r.shape[:-1] or v.shape[-1] not in (T, T + 1):
        raise ValueError(
            f"values must be [..., T] or [..., T+1] for rewards {tuple(r.shape)}, got {tuple(v.shape)}"
        )
    if v.shape[-1] == T:
        v = torch.cat([v, torch.zeros_like(v[..., :1])], dim=-1)
    if dones is None:
        nonterminal = torch.ones_like(r)
    else:
        if dones.shape != r.shape:
            raise ValueError(f"dones {tuple(dones.shape)} must match rewards {tuple(r.shape)}")
        nonterminal = 1.0 - dones.to(dtype=r.dtype, device=r.device)
    with torch.no_grad():
        deltas = r + gamma * v[..., 1:] * nonterminal - v[..., :-1]
        adv = torch.empty_like(r)
        last = torch.zeros_like(r[..., 0])
        for t in range(T - 1, -1, -1):
            last = deltas[..., t] + gamma * lam * nonterminal[..., t] * last
            adv[..., t] = last
        returns = adv + v[..., :-1]
    return adv, returns
