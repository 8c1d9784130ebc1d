"""Advantage estimators, registered by name: each a pure function of an :class:`EventTable`.

An estimator takes the batch's :class:`learners.batching.EventTable` (tensors plus indices: row ->
event, event -> comparable group, event -> episode, row -> role, the per-event reward terms), an
:class:`AdvantageConfig` and, for critic-based estimators, the critic's ``[E]`` values, and returns
one advantage per row (rows of one event share it) plus optional critic targets. The trainer looks
the configured name up in :data:`ADV_ESTIMATORS` and never branches on the algorithm; a new
estimator is one :func:`register_adv_estimator` away.

**One reward definition.** The env gives every event a penalty (an invalid output's format penalty)
and the episode a team outcome. Every estimator reads those two terms and nothing else:

* event-level estimators (SRPO, AT-GRPO) use the event's reward ``outcome - penalty_e``
  (:attr:`agents.rows.Row.reward`);
* output-level estimators (GRPO, Dr.GRPO, GSPO, RLOO, Dr. MAS) use the episode's return
  ``outcome - sum_e penalty_e`` (:meth:`EventTable.episode_return`), so an invalid output costs
  its episode's outputs as it costs SRPO's event;
* GAE (MAPPO) uses per-step rewards ``-penalty_e`` plus the outcome at the last step, which sum to
  the same return.

Group-relative normalisation, the decisions:

* **Population std** (``unbiased=False``) by default. SRPO groups vary in size (a step may exist in
  only some of the G rollouts), and with the population std every group's advantages have unit RMS
  whatever its size, so events of small groups are not systematically down-weighted; a group of two
  gives exactly ``+-1``. verl/TRL use the sample std (``torch.std``); pass ``unbiased=True`` to match
  them (it needs groups of >= 2, which singleton handling guarantees).
* **Singleton groups** (one comparable event/output) carry no relative signal: advantage ``0`` by
  default (``singleton="zero"``); ``"raw"`` keeps the raw reward (no baseline), ``"error"`` raises.
  How often it happens is logged (``actor/singleton_group_frac``).
* **Zero-variance groups** (all rewards equal, detected exactly via ``max == min``) get advantage
  ``0``: nothing to prefer, and ``(R - mean) / (0 + eps)`` would otherwise amplify rounding noise.
  The fraction of zero advantages is logged (``actor/zero_adv_frac``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agents.rows import Row
from learners.batching import EventTable, build_event_table
from srpo_common import plugins

__all__ = [
    "ADV_ESTIMATORS",
    "ADV_SCALES",
    "AdvantageConfig",
    "AdvantageResult",
    "event_advantages_from_rows",
    "gae",
    "get_adv_estimator",
    "group_relative_event_advantages",
    "register_adv_estimator",
    "MEMBER_COST_ADVANTAGES",
    "member_cost_advantages",
]

SINGLETON_POLICIES = ("zero", "raw", "error")
ADV_SCALES = ("std", "none")


@dataclass(frozen=True)
class AdvantageConfig:
    """Knobs every estimator may read (one config for all; each reads what its definition needs)."""

    eps: float = 1e-6
    singleton: str = "zero"
    unbiased: bool = False
    #: ``std`` (GRPO) or ``none`` (Dr.GRPO: centre only)
    scale: str = "std"
    gamma: float = 1.0
    gae_lambda: float = 0.95


@dataclass
class AdvantageResult:
    """``advantages``: ``float64[R]`` per row of the table; ``returns``: ``float64[E]`` critic targets
    (critic-based estimators only); ``stats``: diagnostics (``actor/zero_adv_frac``...)."""

    advantages: Tensor
    returns: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)


AdvEstimator = Callable[[EventTable, AdvantageConfig, "Tensor | None"], AdvantageResult]
ADV_ESTIMATORS: dict[str, AdvEstimator] = {}
plugins.watch("advantage estimator", ADV_ESTIMATORS)  # type: ignore[arg-type]  # a plugin may add, not replace
"""Estimator name -> ``fn(table, cfg, values) -> AdvantageResult`` (``values``: the critic's ``[E]``
values for critic-based estimators, else None)."""


def register_adv_estimator(name: str) -> Callable[[AdvEstimator], AdvEstimator]:
    """Register an advantage estimator under ``name`` (decorator); re-registering replaces it."""

    def deco(fn: AdvEstimator) -> AdvEstimator:
        ADV_ESTIMATORS[name] = fn
        return fn

    return deco


def get_adv_estimator(name: str) -> AdvEstimator:
    """The estimator registered as ``name``; an unknown name raises with the known ones."""
    try:
        return ADV_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADV_ESTIMATORS)}") from None


def group_relative_event_advantages(
    rewards: Tensor | Sequence[float],
    group_keys: Sequence[Hashable] | Tensor,
    eps: float = 1e-6,
    singleton: str = "zero",
    unbiased: bool = False,
    scale: str = "std",
) -> Tensor:
    """``(R_e - mean_g) / (std_g + eps)`` over groups of comparable items (vectorised with scatter).

    Args:
        rewards: ``[E]`` one reward per item (event or output).
        group_keys: ``E`` hashable keys, or a ``LongTensor[E]`` of group ids; items with equal keys
            are compared.
        eps: added to the std.
        singleton: ``"zero"`` | ``"raw"`` | ``"error"`` for groups of one (see module docstring).
        unbiased: sample std (``True``) instead of population std (``False``, default).
        scale: ``"std"`` divides by ``std + eps`` (GRPO); ``"none"`` only centres (Dr.GRPO: the std
            division up-weights groups whose rewards barely differ, a difficulty bias).

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
    if scale not in ADV_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; use one of {ADV_SCALES}")
    if singleton not in SINGLETON_POLICIES:
        raise ValueError(f"unknown singleton policy {singleton!r}; use one of {SINGLETON_POLICIES}")
    if r.shape[0] == 0:
        return r.clone()
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite")

    if isinstance(group_keys, Tensor):
        gid = group_keys.to(device=r.device, dtype=torch.long)
        n_groups = int(gid.max()) + 1
    else:
        ids: dict[Hashable, int] = {}
        gid = torch.tensor(
            [ids.setdefault(k, len(ids)) for k in group_keys], dtype=torch.long, device=r.device
        )
        n_groups = len(ids)
    counts = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gid, torch.ones_like(r))
    mean = torch.zeros_like(counts).index_add_(0, gid, r) / counts
    centred = r - mean[gid]
    sq = torch.zeros_like(counts).index_add_(0, gid, centred.square())
    dof = (counts - 1.0).clamp_min(1.0) if unbiased else counts
    std = (sq / dof).sqrt()
    gmax = torch.full_like(counts, -torch.inf).scatter_reduce_(0, gid, r, reduce="amax")
    gmin = torch.full_like(counts, torch.inf).scatter_reduce_(0, gid, r, reduce="amin")

    adv = centred / (std[gid] + eps) if scale == "std" else centred
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    adv = torch.where((gmax == gmin)[gid], zero, adv)
    is_single = (counts == 1)[gid]
    if singleton == "error" and bool(is_single.any()):
        raise ValueError(f"{int(is_single.sum())} singleton group(s) and singleton='error'")
    return torch.where(is_single, r if singleton == "raw" else zero, adv)


def _group_stats(adv: Tensor, gid: Tensor) -> dict[str, float]:
    """``actor/zero_adv_frac`` (items whose advantage is exactly 0: singleton or all-equal groups)
    and ``actor/singleton_group_frac`` (items alone in their group)."""
    if adv.numel() == 0:
        return {"actor/zero_adv_frac": 0.0, "actor/singleton_group_frac": 0.0}
    counts = torch.bincount(gid)
    return {
        "actor/zero_adv_frac": float((adv == 0).double().mean()),
        "actor/singleton_group_frac": float((counts[gid] == 1).double().mean()),
    }


def _slots(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Dense ids of the pairs ``(a_i, b_i)`` in order of first appearance, and each slot's first
    position."""
    key = a * (int(b.max()) + 1 if b.numel() else 1) + b
    ids: dict[int, int] = {}
    first: list[int] = []
    dense = []
    for i, k in enumerate(key.tolist()):
        j = ids.get(k)
        if j is None:
            j = ids[k] = len(first)
            first.append(i)
        dense.append(j)
    return torch.tensor(dense, dtype=torch.long), torch.tensor(first, dtype=torch.long)


def event_group_key(row: Row) -> tuple[str, str, str, int]:
    """Events are comparable iff same task group and same ``(task_id, event_type, step)``."""
    return (row.group_id, *row.comparable_key)


def event_advantages_from_rows(
    rows: Sequence[Row],
    eps: float = 1e-6,
    singleton: str = "zero",
    unbiased: bool = False,
) -> tuple[list[str], Tensor]:
    """Per-event SRPO advantages of a row list: ``(event_ids, advantages[E])`` float32 (the
    ``srpo`` estimator read per event; kept for analysis scripts and tests)."""
    table = build_event_table(rows)
    adv = _srpo_event_advantages(table, AdvantageConfig(eps=eps, singleton=singleton, unbiased=unbiased))
    return table.event_ids, adv


def _srpo_event_advantages(table: EventTable, cfg: AdvantageConfig) -> Tensor:
    rewards = table.event_reward.to(torch.float32)
    return group_relative_event_advantages(
        rewards, table.event_group, cfg.eps, cfg.singleton, cfg.unbiased, cfg.scale
    )


@register_adv_estimator("srpo")
def srpo_advantages(table: EventTable, cfg: AdvantageConfig, values: Tensor | None = None) -> AdvantageResult:
    """SRPO: one group-relative advantage per *event*, ``A_e = (R_e - mean_g) / (std_g + eps)``.

    ``R_e`` is the event's reward (team outcome minus the event's penalty); the group ``g`` holds
    the comparable events of the task's G rollouts (same task, event type and step,
    :attr:`EventTable.event_group`). Every member row of an event gets ``A_e``.
    """
    adv_e = _srpo_event_advantages(table, cfg)
    return AdvantageResult(adv_e.double()[table.row_event], stats=_group_stats(adv_e, table.event_group))


@register_adv_estimator("grpo")
def grpo_advantages(table: EventTable, cfg: AdvantageConfig, values: Tensor | None = None) -> AdvantageResult:
    """GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (R_i - mean(R)) / std(R)`` over the G rollouts
    of a task, every output of rollout ``i`` sharing ``A_i``.

    ``R_i`` is the episode's return (outcome minus every penalty, :meth:`EventTable.episode_return`).
    Statistics are per (task group, role) over the rollouts in which the role acted, each rollout
    counted once (a rollout that called the role more often does not weigh more in the baseline).
    ``cfg.scale="none"`` drops the std division (Dr.GRPO).
    """
    ret = table.episode_return().to(torch.float32)
    slot, first = _slots(table.row_episode, table.row_role)
    slot_episode = table.row_episode[first]
    gkey, _ = _slots(table.episode_group[slot_episode], table.row_role[first])
    adv_s = group_relative_event_advantages(
        ret[slot_episode], gkey, cfg.eps, cfg.singleton, cfg.unbiased, cfg.scale
    )
    return AdvantageResult(adv_s.double()[slot], stats=_group_stats(adv_s, gkey))


@register_adv_estimator("rloo")
def rloo_advantages(table: EventTable, cfg: AdvantageConfig, values: Tensor | None = None) -> AdvantageResult:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): ``A_i = R_i - 1/(G-1) sum_{j != i} R_j``.

    The baseline of rollout ``i`` is the mean return of the *other* rollouts of its task, so it is
    independent of ``i``'s own sample (unbiased), and no std division. Equivalently
    ``A_i = G/(G-1) (R_i - mean(R))``. Statistics over the task group's episodes (each once);
    ``R_i`` is the episode's return. A group of one has no baseline: ``A = 0`` (``singleton``).
    """
    ret = table.episode_return()
    gid = table.episode_group
    n = int(gid.max()) + 1
    counts = torch.zeros(n, dtype=ret.dtype).index_add_(0, gid, torch.ones_like(ret))
    total = torch.zeros(n, dtype=ret.dtype).index_add_(0, gid, ret)
    g = counts[gid]
    adv_ep = torch.where(g > 1, ret - (total[gid] - ret) / (g - 1).clamp_min(1), torch.zeros_like(ret))
    if cfg.singleton == "raw":
        adv_ep = torch.where(g > 1, adv_ep, ret)
    elif cfg.singleton == "error" and bool((g == 1).any()):
        raise ValueError("singleton group(s) and singleton='error'")
    return AdvantageResult(adv_ep[table.row_episode], stats=_group_stats(adv_ep, gid))


@register_adv_estimator("dr-mas")
def dr_mas_advantages(
    table: EventTable, cfg: AdvantageConfig, values: Tensor | None = None
) -> AdvantageResult:
    """Dr. MAS (agent-wise advantage normalisation): ``A_{i,k} = (R_i - mu_k) / (sigma_k + eps)``,
    with ``mu_k, sigma_k`` the mean and std of the rewards of agent ``k``'s own outputs in the group.

    GRPO pools every output of a rollout under one statistic; with heterogeneous agents (a
    proposer called three times per step, an aggregator once, a router that runs only some
    members) the pooled statistics mis-scale each agent's gradient. Dr. MAS normalises per agent
    (here: per role within the task group), over that role's *outputs* (each call counts), so each
    agent's advantages have zero mean and unit scale over its own samples. ``R_i`` is the episode's
    return.
    """
    ret = table.episode_return().to(torch.float32)
    gkey, _ = _slots(table.episode_group[table.row_episode], table.row_role)
    adv = group_relative_event_advantages(
        ret[table.row_episode], gkey, cfg.eps, cfg.singleton, cfg.unbiased, cfg.scale
    )
    return AdvantageResult(adv.double(), stats=_group_stats(adv, gkey))


@register_adv_estimator("at-grpo")
def at_grpo_advantages(
    table: EventTable, cfg: AdvantageConfig, values: Tensor | None = None
) -> AdvantageResult:
    """AT-GRPO (agent- and turn-wise grouping, Zhao et al. 2025 "Stronger-MAS"): the outputs compared
    are those of the *same agent at the same turn* of the task's rollouts,
    ``A = (r - mean_{g,agent,turn}) / (std + eps)``.

    ``r`` is the reward of the event the output belongs to (team outcome minus that event's
    penalty). The paper samples the G candidates of a turn from one shared state (tree sampling);
    here the G rollouts are independent and the grouping — task group x agent x turn — is the part
    matched. Rows of one agent at one turn across the rollouts form a group (a turn reached in only
    one rollout is a singleton: ``singleton`` policy).
    """
    rewards = table.event_reward.to(torch.float32)[table.row_event]
    agent_ids, _ = _first_appearance([r.agent for r in table.rows])
    step = table.event_step[table.row_event]
    group = table.episode_group[table.row_episode]
    key = (group * (int(agent_ids.max()) + 1) + agent_ids) * (int(step.max()) + 1) + step
    gkey, _ = _slots(key, torch.zeros_like(key))
    adv = group_relative_event_advantages(rewards, gkey, cfg.eps, cfg.singleton, cfg.unbiased, cfg.scale)
    return AdvantageResult(adv.double(), stats=_group_stats(adv, gkey))


#: How the member cost an env charges (``Row.member_cost``) reaches the advantage: ``in-outcome`` (the
#: estimator sees the team reward as the env gives it) or ``apart`` (the estimator sees the outcome without
#: the cost, and :func:`member_cost_advantages` adds the cost back at its own scale).
MEMBER_COST_ADVANTAGES = ("in-outcome", "apart")


def member_cost_advantages(table: EventTable) -> Tensor:
    """``float64[R]``: every row's episode member cost against its task group's mean, in reward units,
    ``-(c_i - mean_g c)``: centred, never divided by a standard deviation.

    Why: with the cost inside the outcome, a group whose rollouts all fail differs only in what they paid,
    and a std-normalised advantage turns 0.02-0.10 of cost into a full-size push toward fewer members on
    exactly the questions the team cannot solve yet (quick-search-routed's router fell to K=1 that way).
    Apart, the outcome is normalised on its own and the cost stays as large as it is."""
    cost = table.episode_member_cost
    if cost is None:
        return torch.zeros(table.num_rows, dtype=torch.float64)
    groups = int(table.episode_group.max()) + 1
    total = torch.zeros(groups, dtype=torch.float64).index_add_(0, table.episode_group, cost)
    count = torch.zeros(groups, dtype=torch.float64).index_add_(0, table.episode_group, torch.ones_like(cost))
    return -(cost - (total / count)[table.episode_group])[table.row_episode]


def _first_appearance(keys: Sequence[Hashable]) -> tuple[Tensor, list[Hashable]]:
    ids: dict[Hashable, int] = {}
    dense = [ids.setdefault(k, len(ids)) for k in keys]
    return torch.tensor(dense, dtype=torch.long), list(ids)


@register_adv_estimator("gae")
def gae_advantages(table: EventTable, cfg: AdvantageConfig, values: Tensor | None = None) -> AdvantageResult:
    """MAPPO (Yu et al. 2022): GAE over each episode's events with a centralised critic's values.

    Per-step rewards are ``-penalty_e`` at every event plus the team outcome at the last one (they
    sum to the episode's return); ``values`` are the critic's ``V(state before event)``, bootstrap 0
    after the last event. Advantages are whitened over the batch's events (standard PPO), but a
    spread below 1e-2 is only centred, never blown up. Returns (``A + V``) are the critic's targets.
    """
    if values is None:
        raise ValueError("the gae estimator needs the critic's per-event values")
    if values.shape != (table.num_events,):
        raise ValueError(f"values must be [E={table.num_events}], got {tuple(values.shape)}")
    v_all = values.detach().double()
    event_adv = torch.zeros(table.num_events, dtype=torch.float64)
    returns = torch.zeros(table.num_events, dtype=torch.float64)
    order: list[int] = []
    episode_events: dict[int, list[int]] = {}
    for e, ep in enumerate(table.event_episode.tolist()):
        episode_events.setdefault(ep, []).append(e)
    for ep, events in episode_events.items():
        events.sort(key=lambda e: int(table.event_step[e]))
        outcome = float(table.episode_outcome[ep])
        rew = [
            -float(table.event_penalty[e]) + (outcome if j == len(events) - 1 else 0.0)
            for j, e in enumerate(events)
        ]
        vals = [float(v_all[e]) for e in events] + [0.0]
        adv, ret = gae(
            torch.tensor(rew, dtype=torch.float64),
            torch.tensor(vals, dtype=torch.float64),
            gamma=cfg.gamma,
            lam=cfg.gae_lambda,
        )
        idx = torch.tensor(events, dtype=torch.long)
        event_adv[idx] = adv
        returns[idx] = ret
        order.extend(events)
    flat = event_adv[torch.tensor(order, dtype=torch.long)].numpy()
    mean, std = (flat.mean(), flat.std()) if len(flat) else (0.0, 1.0)
    scale = std if std > 1e-2 else 1.0
    row_adv = torch.from_numpy((event_adv.numpy()[table.row_event.numpy()] - mean) / scale)
    return AdvantageResult(
        row_adv, returns=returns, stats=_group_stats(row_adv, torch.zeros_like(table.row_event))
    )


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
