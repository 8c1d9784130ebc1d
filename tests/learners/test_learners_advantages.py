"""Tests of learners/advantages.py: group-relative normalisation, row grouping, GAE."""

from __future__ import annotations

import statistics

import pytest
import torch

from agents.rows import Row
from learners.advantages import (
    ADV_ESTIMATORS,
    AdvantageConfig,
    event_advantages_from_rows,
    gae,
    get_adv_estimator,
    group_relative_event_advantages,
)
from learners.batching import build_event_table
from tests._numeric import F32, assert_close_scaled

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)


def _z(values: list[float], x: float, eps: float = 1e-6, sample: bool = False) -> float:
    sd = statistics.stdev(values) if sample else statistics.pstdev(values)
    return (x - statistics.fmean(values)) / (sd + eps)


def test_group_relative_known_values() -> None:
    rewards = [1.0, 0.0, 0.0, 0.5, 3.0, 0.1, 0.1, 0.1, 2.0, 5.0]
    keys = ["a", "a", "a", "a", "solo", "flat", "flat", "flat", ("t", 1), ("t", 1)]
    adv = group_relative_event_advantages(torch.tensor(rewards, dtype=torch.float64), keys)
    grp_a = [1.0, 0.0, 0.0, 0.5]
    for i in range(4):
        assert adv[i].item() == pytest.approx(_z(grp_a, rewards[i]), abs=1e-9)
    assert adv[4].item() == 0.0  # singleton: no relative signal
    assert adv[5:8].tolist() == [0.0, 0.0, 0.0]  # zero variance, exactly 0 despite 0.1 rounding
    # a group of two gives exactly +-1 with the population std (up to eps)
    assert adv[8].item() == pytest.approx(-1.0, abs=1e-5)
    assert adv[9].item() == pytest.approx(1.0, abs=1e-5)
    # population std -> unit RMS within a group
    assert (adv[:4].square().mean().sqrt()).item() == pytest.approx(1.0, abs=1e-5)


def test_group_relative_options() -> None:
    rewards = [1.0, 0.0, 0.0, 0.5, 3.0]
    keys = ["a", "a", "a", "a", "solo"]
    sample = group_relative_event_advantages(rewards, keys, unbiased=True)
    assert sample.dtype == torch.float32
    for i in range(4):
        assert sample[i].item() == pytest.approx(_z(rewards[:4], rewards[i], sample=True), abs=1e-5)
    raw = group_relative_event_advantages(rewards, keys, singleton="raw")
    assert raw[4].item() == 3.0
    with pytest.raises(ValueError, match="singleton"):
        group_relative_event_advantages(rewards, keys, singleton="error")
    with pytest.raises(ValueError, match="singleton policy"):
        group_relative_event_advantages(rewards, keys, singleton="drop")
    with pytest.raises(ValueError, match="group keys"):
        group_relative_event_advantages(rewards, keys[:3])
    with pytest.raises(ValueError, match="finite"):
        group_relative_event_advantages([float("nan"), 1.0], ["a", "a"])
    assert group_relative_event_advantages([], []).numel() == 0


def test_group_relative_is_permutation_equivariant() -> None:
    g = torch.Generator().manual_seed(0)
    r = torch.randn(30, generator=g, dtype=torch.float64)
    keys = [i % 4 for i in range(30)]
    perm = torch.randperm(30, generator=g)
    a = group_relative_event_advantages(r, keys)
    b = group_relative_event_advantages(r[perm], [keys[i] for i in perm.tolist()])
    assert torch.allclose(a[perm], b)


def _row(
    event_id: str,
    episode: str,
    group: str,
    task: str,
    etype: str,
    step: int,
    member: int,
    k: int,
    reward: float,
    role: str = "solver",
    outcome: float = 0.0,
    penalty: float = 0.0,
) -> Row:
    return Row(
        event_id=event_id,
        episode_id=episode,
        pre_state_id="s",
        event_type=etype,
        step=step,
        agent=f"{role}{member}",
        role=role,
        member_index=member,
        k=k,
        prompt_ids=[1],
        response_ids=[2],
        response_mask=[1],
        behaviour_logprobs=[-0.5],
        policy_version=0,
        task_id=task,
        group_id=group,
        reward=reward,
        outcome_reward=outcome,
        penalty=penalty,
    )


def _table(rows: list[Row]):
    return build_event_table(rows)


def _run(name: str, rows: list[Row], **kw) -> torch.Tensor:
    return get_adv_estimator(name)(_table(rows), AdvantageConfig(**kw), None).advantages


def test_srpo_estimator_per_event() -> None:
    rows: list[Row] = []
    # task T, group g1, 3 rollouts: step 0 'propose' (K=2), step 1 'aggregate' (K=1, only in 2 rollouts)
    rewards0 = {"ep0": 1.0, "ep1": 0.0, "ep2": 0.0}
    rewards1 = {"ep0": 1.0, "ep1": 0.5}
    for ep, rw in rewards0.items():
        rows += [_row(f"{ep}/0", ep, "g1", "T", "propose", 0, m, 2, rw) for m in (1, 0)]
    for ep, rw in rewards1.items():
        rows.append(_row(f"{ep}/1", ep, "g1", "T", "aggregate", 1, 0, 1, rw, role="agg"))
    # same task in another group (other iteration): not compared with g1; a singleton here
    rows.append(_row("epX/0", "epX", "g2", "T", "propose", 0, 0, 1, 7.0))
    ids, adv = event_advantages_from_rows(rows)
    assert ids == ["ep0/0", "ep1/0", "ep2/0", "ep0/1", "ep1/1", "epX/0"]
    assert adv.dtype == torch.float32
    vals0 = list(rewards0.values())
    assert adv[:3].tolist() == pytest.approx([_z(vals0, v) for v in vals0], abs=1e-5)
    assert adv[3:5].tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
    assert adv[5].item() == 0.0
    res = get_adv_estimator("srpo")(_table(rows), AdvantageConfig(), None)
    # per row: both members of an event share its advantage
    assert res.advantages[:2].tolist() == pytest.approx([adv[0].item()] * 2)
    assert res.stats["actor/singleton_group_frac"] == pytest.approx(1 / 6)
    assert res.stats["actor/zero_adv_frac"] == pytest.approx(1 / 6)

    bad = rows + [_row("ep0/0", "ep0", "g1", "T", "propose", 0, 0, 2, 0.3)]
    with pytest.raises(ValueError, match="disagree"):
        event_advantages_from_rows(bad)


def test_registry_lookup_errors_list_known_names() -> None:
    assert {"srpo", "grpo", "rloo", "dr-mas", "at-grpo", "gae"} <= set(ADV_ESTIMATORS)
    with pytest.raises(ValueError, match="known: .*srpo"):
        get_adv_estimator("nope")


def test_grpo_estimator_per_episode_and_role() -> None:
    rows: list[Row] = []
    outcomes = {"ep0": 1.0, "ep1": 0.0, "ep2": 1.0, "ep3": 0.0}
    for ep, out in outcomes.items():
        rows.append(_row(f"{ep}/0", ep, "g", "T", "solve", 0, 0, 1, out, role="solver", outcome=out))
        # ep0's solver acts twice: it must not weigh twice in the baseline
        if ep == "ep0":
            rows.append(_row(f"{ep}/2", ep, "g", "T", "solve", 2, 0, 1, out, role="solver", outcome=out))
        if ep in ("ep0", "ep1", "ep2"):
            rows.append(_row(f"{ep}/1", ep, "g", "T", "verify", 1, 0, 1, out, role="verifier", outcome=out))
    adv = _run("grpo", rows)
    assert adv.shape == (len(rows),)
    solver = [outcomes[e] for e in outcomes]
    verifier = [outcomes[e] for e in ("ep0", "ep1", "ep2")]
    for row, a in zip(rows, adv.tolist(), strict=True):
        ref = _z(solver if row.role == "solver" else verifier, row.outcome_reward)
        assert a == pytest.approx(ref, abs=1e-5)
    assert adv[0].item() == adv[1].item()  # both ep0 solver rows share the episode's advantage
    rows.append(_row("ep1/9", "ep1", "g", "T", "solve", 9, 0, 1, 1.0, role="solver", outcome=1.0))
    with pytest.raises(ValueError, match="disagree"):
        _run("grpo", rows)


def test_every_estimator_sees_the_format_penalty() -> None:
    """Two correct episodes, one with an invalid output (penalty 0.1): SRPO's event advantages are
    +-1, and GRPO must see the same difference (it read ``outcome_reward`` and gave 0, 0)."""
    rows = [
        _row("a/0", "a", "g", "T", "solve", 0, 0, 1, 1.0, outcome=1.0),
        _row("b/0", "b", "g", "T", "solve", 0, 0, 1, 0.9, outcome=1.0, penalty=0.1),
    ]
    for name in ("srpo", "grpo", "dr-mas", "at-grpo"):
        assert _run(name, rows).tolist() == pytest.approx([1.0, -1.0], abs=1e-4), name
    # RLOO: R_i minus the other rollout's return
    assert _run("rloo", rows).tolist() == pytest.approx([0.1, -0.1])
    # GAE: per-step reward -penalty + outcome at the last step; with zero values A = return
    res = get_adv_estimator("gae")(_table(rows), AdvantageConfig(gae_lambda=1.0), torch.zeros(2))
    assert res.returns.tolist() == pytest.approx([1.0, 0.9])


def test_dr_grpo_scale_none_only_centres() -> None:
    rows = [
        _row(f"e{i}/0", f"e{i}", "g", "T", "s", 0, 0, 1, r, outcome=r) for i, r in enumerate([1, 0, 0, 0])
    ]
    assert _run("grpo", rows, scale="none").tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert _run("grpo", rows).tolist() == pytest.approx([_z([1, 0, 0, 0], x) for x in [1, 0, 0, 0]], abs=1e-5)
    with pytest.raises(ValueError, match="scale"):
        _run("grpo", rows, scale="mad")


def test_rloo_hand_computed() -> None:
    # returns 1, 0, 0.5 in one group: A_i = R_i - mean of the other two
    rows = [_row(f"e{i}/0", f"e{i}", "g", "T", "s", 0, 0, 1, r, outcome=r) for i, r in enumerate([1, 0, 0.5])]
    rows.append(_row("solo/0", "solo", "h", "T", "s", 0, 0, 1, 1.0, outcome=1.0))
    assert _run("rloo", rows).tolist() == pytest.approx([0.75, -0.75, 0.0, 0.0])


def test_dr_mas_normalises_per_agent_role() -> None:
    """Role 'p' acts twice per episode in e0 and once in e1; role 'a' once in each. Dr. MAS pools each
    role's own outputs: p sees returns [1, 1, 0] (mean 2/3), a sees [1, 0] (mean 1/2)."""
    rows = [
        _row("e0/0", "e0", "g", "T", "p", 0, 0, 2, 1.0, role="p", outcome=1.0),
        _row("e0/0", "e0", "g", "T", "p", 0, 1, 2, 1.0, role="p", outcome=1.0),
        _row("e0/1", "e0", "g", "T", "a", 1, 0, 1, 1.0, role="a", outcome=1.0),
        _row("e1/0", "e1", "g", "T", "p", 0, 0, 1, 0.0, role="p", outcome=0.0),
        _row("e1/1", "e1", "g", "T", "a", 1, 0, 1, 0.0, role="a", outcome=0.0),
    ]
    adv = _run("dr-mas", rows)
    p = [1.0, 1.0, 0.0]
    assert adv.tolist() == pytest.approx(
        [_z(p, 1.0), _z(p, 1.0), _z([1, 0], 1.0), _z(p, 0.0), _z([1, 0], 0.0)], abs=1e-5
    )
    # GRPO counts each (episode, role) once: p sees [1, 0] -> +-1, unlike Dr. MAS's 0.707 / -1.414
    assert _run("grpo", rows)[0].item() == pytest.approx(1.0, abs=1e-5)


def test_at_grpo_groups_by_agent_and_turn() -> None:
    """Rows of the same agent at the same turn across rollouts form a group, with the event's reward."""
    rows = []
    for ep, (r0, r1) in {"e0": (1.0, 0.9), "e1": (0.0, 0.5), "e2": (1.0, 0.1)}.items():
        rows.append(_row(f"{ep}/0", ep, "g", "T", "t", 0, 0, 1, r0, outcome=r0))
        rows.append(_row(f"{ep}/1", ep, "g", "T", "t", 1, 0, 1, r1, outcome=r0))
    adv = _run("at-grpo", rows)
    turn0, turn1 = [1.0, 0.0, 1.0], [0.9, 0.5, 0.1]
    assert adv[0::2].tolist() == pytest.approx([_z(turn0, x) for x in turn0], abs=1e-5)
    assert adv[1::2].tolist() == pytest.approx([_z(turn1, x) for x in turn1], abs=1e-5)


def test_gae_hand_computed() -> None:
    r = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    v = torch.tensor([0.5, 0.2, 0.4, 0.3], dtype=torch.float64)
    gamma, lam = 0.9, 0.8
    d2 = 2.0 + gamma * 0.3 - 0.4
    d1 = 0.0 + gamma * 0.4 - 0.2
    d0 = 1.0 + gamma * 0.2 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, ret = gae(r, v, gamma, lam)
    assert adv.tolist() == pytest.approx([a0, a1, a2])
    assert ret.tolist() == pytest.approx([a0 + 0.5, a1 + 0.2, a2 + 0.4])
    # lam = 1, gamma = 1 -> returns are plain reward-to-go plus bootstrap
    _, ret1 = gae(r, v, 1.0, 1.0)
    assert ret1.tolist() == pytest.approx([3.3, 2.3, 2.3])
    # terminal episode: values of length T bootstrap with 0
    adv_t, _ = gae(r, v[:3], gamma, lam)
    adv_ref, _ = gae(r, torch.cat([v[:3], torch.zeros(1, dtype=torch.float64)]), gamma, lam)
    assert torch.allclose(adv_t, adv_ref)


def test_gae_dones_and_batch() -> None:
    g = torch.Generator().manual_seed(1)
    r1, r2 = torch.randn(3, generator=g), torch.randn(2, generator=g)
    v1, v2 = torch.randn(3, generator=g), torch.randn(2, generator=g)
    a1, _ = gae(r1, v1, 0.95, 0.9)
    a2, _ = gae(r2, v2, 0.95, 0.9)
    # two terminal episodes concatenated with dones: the trace must be cut at the boundary
    cat_adv, _ = gae(torch.cat([r1, r2]), torch.cat([v1, v2]), 0.95, 0.9, dones=torch.tensor([0, 0, 1, 0, 1]))
    # float32, the same recursion vectorised another way: scaled to the max (tests/_numeric.py)
    assert_close_scaled(cat_adv, torch.cat([a1, a2]), F32)
    # leading batch dims are independent episodes
    R, V = torch.randn(4, 5, generator=g), torch.randn(4, 6, generator=g)
    batch_adv, batch_ret = gae(R, V, 0.99, 0.95)
    for i in range(4):
        ai, ri = gae(R[i], V[i], 0.99, 0.95)
        assert_close_scaled(batch_adv[i], ai, F32)
        assert_close_scaled(batch_ret[i], ri, F32)
    with pytest.raises(ValueError):
        gae(R, V[:, :3])
