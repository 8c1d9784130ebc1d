"""Tests of learners/advantages.py: group-relative normalisation, row grouping, GAE."""

from __future__ import annotations

import statistics

import pytest
import torch

from agents.rows import Row
from learners.advantages import (
    ADVANTAGE_ESTIMATORS,
    event_advantages_from_rows,
    gae,
    group_relative_event_advantages,
    grpo_output_advantages,
)


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
    )


def test_event_advantages_from_rows() -> None:
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
    assert ADVANTAGE_ESTIMATORS["srpo_event"] is event_advantages_from_rows

    bad = rows + [_row("ep0/0", "ep0", "g1", "T", "propose", 0, 0, 2, 0.3)]
    with pytest.raises(ValueError, match="disagree"):
        event_advantages_from_rows(bad)


def test_grpo_output_advantages_per_episode_and_role() -> None:
    rows: list[Row] = []
    outcomes = {"ep0": 1.0, "ep1": 0.0, "ep2": 1.0, "ep3": 0.0}
    for ep, out in outcomes.items():
        rows.append(_row(f"{ep}/0", ep, "g", "T", "solve", 0, 0, 1, out, role="solver", outcome=out))
        # ep0's solver acts twice: it must not weigh twice in the baseline
        if ep == "ep0":
            rows.append(_row(f"{ep}/2", ep, "g", "T", "solve", 2, 0, 1, out, role="solver", outcome=out))
        if ep in ("ep0", "ep1", "ep2"):
            rows.append(_row(f"{ep}/1", ep, "g", "T", "verify", 1, 0, 1, out, role="verifier", outcome=out))
    adv = grpo_output_advantages(rows)
    assert adv.shape == (len(rows),)
    solver = [outcomes[e] for e in outcomes]
    verifier = [outcomes[e] for e in ("ep0", "ep1", "ep2")]
    for row, a in zip(rows, adv.tolist(), strict=True):
        ref = _z(solver if row.role == "solver" else verifier, row.outcome_reward)
        assert a == pytest.approx(ref, abs=1e-5)
    assert adv[0].item() == adv[1].item()  # both ep0 solver rows share the episode's advantage
    rows.append(_row("ep1/9", "ep1", "g", "T", "solve", 9, 0, 1, 1.0, role="solver", outcome=1.0))
    with pytest.raises(ValueError, match="disagree"):
        grpo_output_advantages(rows)
    assert grpo_output_advantages([]).numel() == 0


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
    assert torch.allclose(cat_adv, torch.cat([a1, a2]), atol=1e-6)
    # leading batch dims are independent episodes
    R, V = torch.randn(4, 5, generator=g), torch.randn(4, 6, generator=g)
    batch_adv, batch_ret = gae(R, V, 0.99, 0.95)
    for i in range(4):
        ai, ri = gae(R[i], V[i], 0.99, 0.95)
        assert torch.allclose(batch_adv[i], ai) and torch.allclose(batch_ret[i], ri)
    with pytest.raises(ValueError):
        gae(R, V[:, :3])
    assert ADVANTAGE_ESTIMATORS["gae"] is gae
