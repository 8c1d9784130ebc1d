"""Asynchronous RL's pure parts (learners.staleness): admission control and the decoupled correction.

Every correction test states its hand-computed value *and* checks that the plain PPO clip around the
behaviour policy (what the loss computes without the correction) gives another number, so each test
fails if the correction is missing. Tolerances: float64 throughout, ``1e-12 * max(1, |expected|)``
(a few roundings of numbers of order 1).
"""

from __future__ import annotations

import math

import pytest
import torch

from agents.rows import Row
from learners.losses import LossConfig, get_policy_loss
from learners.staleness import (
    admit_rows,
    decoupled_correction,
    generation_version,
    rollout_capacity,
    staleness_histogram,
)

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under the other CPU kernel sets

D = torch.float64


def _close(actual: float | torch.Tensor, expected: float | torch.Tensor) -> None:
    a = torch.as_tensor(actual, dtype=D)
    e = torch.as_tensor(expected, dtype=D)
    atol = 1e-12 * max(1.0, float(e.abs().max()))
    torch.testing.assert_close(a, e, rtol=0.0, atol=atol)


def _row(event: str, member: int, version: int, k: int = 2, role: str = "r") -> Row:
    return Row(
        event_id=event, episode_id="ep", pre_state_id="s", event_type="t", step=0, agent=f"a{member}",
        role=role, member_index=member, k=k, prompt_ids=[1], response_ids=[2], response_mask=[1],
        behaviour_logprobs=[-1.0], policy_version=version, task_id="t", group_id="g", reward=0.0,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# admission control
# --------------------------------------------------------------------------------------------------


def test_generation_version_is_the_oldest_the_bound_allows() -> None:
    assert [generation_version(t, 0) for t in (1, 2, 5)] == [0, 1, 4]  # synchronous: the update's own
    assert [generation_version(t, 1) for t in (1, 2, 3, 5)] == [0, 0, 1, 3]
    assert [generation_version(t, 2) for t in (1, 2, 3, 4, 7)] == [0, 0, 0, 1, 4]
    with pytest.raises(ValueError, match="max_staleness"):
        generation_version(3, -1)
    with pytest.raises(ValueError, match="from 1"):
        generation_version(0, 1)


def test_rollout_capacity_is_areals_rule_hand_computed() -> None:
    # (N + v + 1) * B - running - accepted: (1 + 0 + 1) * 4 - 3 - 2 = 3
    assert rollout_capacity(version=0, max_staleness=1, batch_size=4, running=3, accepted=2) == 3
    assert rollout_capacity(version=0, max_staleness=0, batch_size=4, running=3, accepted=2) == 0  # never < 0
    assert rollout_capacity(version=2, max_staleness=2, batch_size=3, running=0, accepted=6) == 9
    with pytest.raises(ValueError):
        rollout_capacity(version=0, max_staleness=1, batch_size=0, running=0, accepted=0)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_capacity_in_whole_batches_starts_batch_t_at_its_generation_version(n: int) -> None:
    """With a batch as the unit (B = 1), batch t may start at version v iff v >= generation_version:
    the capacity rule and the generator's schedule are one rule, and no batch is more than N behind
    the version that trains it (t - 1)."""
    for t in range(1, 12):
        allowed = [v for v in range(12) if rollout_capacity(v, n, 1, running=0, accepted=t - 1) >= 1]
        assert min(allowed) == generation_version(t, n)
        assert (t - 1) - generation_version(t, n) <= n


def test_admission_drops_stale_rows_then_their_events_whole() -> None:
    rows = [
        _row("e0", 0, 5), _row("e0", 1, 4),  # 0 and 1 behind: kept with N = 1
        _row("e1", 0, 5), _row("e1", 1, 3),  # one member 2 behind: the row, then the event, dropped
        _row("e2", 0, 2, k=1),  # 3 behind
    ]  # fmt: skip
    adm = admit_rows(rows, lambda r: 5, max_staleness=1)
    assert [(r.event_id, r.member_index) for r in adm.rows] == [("e0", 0), ("e0", 1)]
    assert adm.stale_dropped == 2 and adm.events_dropped == 2
    st = adm.stats()
    assert st["rollout/staleness"] == {"0": 2, "1": 1, "2": 1, "3": 1}
    assert st["rollout/staleness_mean"] == pytest.approx((0 + 0 + 1 + 2 + 3) / 5)
    assert st["rollout/staleness_max"] == 3.0
    assert st["rollout/stale_dropped"] == 2.0
    assert "rollout/stale_events_dropped" not in st  # one name per count: the trainer logs rollout/refused_events
    every = admit_rows(rows, lambda r: 5, max_staleness=3)
    assert every.rows == rows and every.stale_dropped == 0
    sync = admit_rows(rows, lambda r: 5, max_staleness=0)
    assert sync.rows == [] and sync.events_dropped == 3
    with pytest.raises(ValueError, match="newer"):
        admit_rows(rows, lambda r: 4, max_staleness=1)


def test_staleness_is_per_role_version() -> None:
    rows = [_row("e0", 0, 3, role="proposer"), _row("e0", 1, 1, role="aggregator")]
    versions = {"proposer": 4, "aggregator": 1}
    assert staleness_histogram(rows, lambda r: versions[r.role]) == {"0": 1, "1": 1}


# --------------------------------------------------------------------------------------------------
# the decoupled correction: SRPO's set ratio with members from different versions
# --------------------------------------------------------------------------------------------------

# event 0: two members sampled by different versions (mu_0, mu_1); event 1: one member, far behind
PROX = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.4, -1.0], [-1.0, -1.0, 0.0]], dtype=D)
MU = torch.tensor([[-1.2, -2.1, 5.0], [-0.6, -0.4, -1.0], [-2.0, -1.5, 0.0]], dtype=D)  # 5.0 on padding
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=D)
EVENTS = torch.tensor([0, 0, 1])
ADV_ROWS = torch.tensor([1.0, 1.0, -0.5], dtype=D)  # A_0 = 1, A_1 = -0.5
CAP = 2.0
# l_0 = 0.2 + 0.1 = 0.3 (vs mu_0), l_1 = 0.1 (vs mu_1), l_2 = 1.0 + 0.5 = 1.5
W_EVENT0 = math.exp((0.3 + 0.1) / math.sqrt(2))  # 1.3269: on the sqrt(K) scale, under the cap
W_EVENT1 = min(math.exp(1.5), CAP)  # 4.48 -> capped at 2


def test_event_weight_hand_computed_per_member_behaviour_on_the_ck_scale() -> None:
    w, stats = decoupled_correction(PROX, MU, MASK, level="event", cap=CAP, event_index=EVENTS, norm="sqrt")
    expected = torch.tensor([[W_EVENT0] * 3, [W_EVENT0] * 3, [W_EVENT1] * 3], dtype=D) * MASK
    _close(w, expected)
    # without the per-member correction (no weight) every entry would be the mask itself
    assert (w - MASK).abs().max() > 0.3
    # the other c(K): sum (the exact joint ratio) and mean (geometric mean)
    w_sum, _ = decoupled_correction(PROX, MU, MASK, level="event", cap=10.0, event_index=EVENTS, norm="sum")
    _close(w_sum[0, 0], math.exp(0.4))
    w_mean, _ = decoupled_correction(PROX, MU, MASK, level="event", cap=10.0, event_index=EVENTS, norm="mean")
    _close(w_mean[1, 2], math.exp(0.2))
    # k1: every member its own event, so its own sequence weight
    w_k1, _ = decoupled_correction(PROX, MU, MASK, level="event", cap=10.0, event_index=EVENTS, norm="k1")
    _close(w_k1[:, 0], torch.tensor([math.exp(0.3), math.exp(0.1), math.exp(1.5)], dtype=D))
    # stats over the rows' weights: ESS = (sum w)^2 / (n sum w^2); mismatch KL = k3 per loss token
    rw = [W_EVENT0, W_EVENT0, W_EVENT1]
    _close(stats["rollout/tis_ess"], sum(rw) ** 2 / (3 * sum(x * x for x in rw)))
    _close(stats["rollout/tis_capped_frac"], 1 / 3)
    # k3 of KL(mu || prox) on tokens sampled from mu: (r - 1) - log r with r = prox / mu, per token
    d = [0.2, 0.1, 0.1, 0.0, 0.0, 1.0, 0.5]  # log prox - log mu on the 7 loss tokens
    _close(stats["rollout/mismatch_kl"], sum(math.exp(x) - 1 - x for x in d) / 7)


def _srpo(lp_values: torch.Tensor, old: torch.Tensor, weights: torch.Tensor | None):
    lp = lp_values.clone().requires_grad_(True)
    cfg = LossConfig(clip_eps=0.2, norm="sqrt", token_weights=weights)
    loss, _ = get_policy_loss("srpo")(lp, old, MASK, ADV_ROWS, EVENTS, cfg)
    loss.backward()
    return loss.item(), lp.grad


def test_srpo_decoupled_gradient_hand_computed_and_unlike_the_plain_clip() -> None:
    """At the first step (current = pi_prox, rho_e = 1) the decoupled SRPO gradient of token t of
    member j of event e is -A_e w_e m_jt / (c(K_e) E): event 0 -(1)(1.3269)/(sqrt 2 * 2), event 1
    -(-0.5)(2)/(1 * 2) = 0.5. The plain clip around mu sees rho_0 = exp(0.4/sqrt 2) = 1.33 > 1.2
    with A > 0 (clipped: no gradient) and rho_1 = e^1.5 = 4.48 with A < 0 (unclipped, uncapped:
    -(-0.5)(4.48)/2 = 1.12)."""
    w, _ = decoupled_correction(PROX, MU, MASK, level="event", cap=CAP, event_index=EVENTS, norm="sqrt")
    loss, grad = _srpo(PROX, PROX, w)
    _close(loss, -(1.0 * 1.0 + -0.5 * 1.0) / 2)  # rho = 1: the loss value is the unweighted one
    g0 = -1.0 * W_EVENT0 / (math.sqrt(2) * 2)
    g1 = 0.5 * W_EVENT1 / 2  # -A_1 w_1 / (c(1) E) with A_1 = -0.5
    expected = torch.tensor([[g0] * 3, [g0] * 3, [g1] * 3], dtype=D) * MASK
    _close(grad, expected)

    plain_loss, plain_grad = _srpo(PROX, MU, None)  # no correction: the ratio against mu
    rho0, rho1 = math.exp(0.4 / math.sqrt(2)), math.exp(1.5)
    _close(plain_loss, -(min(rho0, 1.2) * 1.0 + rho1 * -0.5) / 2)
    _close(plain_grad, torch.tensor([[0.0] * 3, [0.0] * 3, [0.5 * rho1 / 2] * 3], dtype=D) * MASK)
    assert (grad - plain_grad).abs().max() > 0.4  # the correction is what the test checks

    # a synchronous batch (mu = pi_prox): every weight exactly 1, the loss and gradient today's
    ones, _ = decoupled_correction(PROX, PROX, MASK, level="event", cap=CAP, event_index=EVENTS, norm="sqrt")
    assert torch.equal(ones, MASK)
    sync_loss, sync_grad = _srpo(PROX, PROX, ones)
    ref_loss, ref_grad = _srpo(PROX, PROX, None)
    assert sync_loss == ref_loss and torch.equal(sync_grad, ref_grad)  # x * 1.0: exact by design


def test_srpo_decoupled_clip_is_around_prox_after_a_step() -> None:
    """After the policy moved (current = prox + delta), the clip acts on rho_e = pi/pi_prox, not on
    pi/mu: event 0 with delta summing to 0.1 per member has rho = exp(0.2/sqrt 2) = 1.152, inside
    [0.8, 1.2], so its gradient is -A rho w / (sqrt 2 E); the plain clip (ratio to mu,
    exp(0.6/sqrt 2) = 1.53) cuts it to 0."""
    delta = torch.tensor([[0.05, 0.05, 0.0], [0.1, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    w, _ = decoupled_correction(PROX, MU, MASK, level="event", cap=CAP, event_index=EVENTS, norm="sqrt")
    _, grad = _srpo(PROX + delta, PROX, w)
    rho0 = math.exp(0.2 / math.sqrt(2))
    _close(grad[0, :2], torch.full((2,), -1.0 * rho0 * W_EVENT0 / (math.sqrt(2) * 2), dtype=D))
    _, plain = _srpo(PROX + delta, MU, None)
    assert float(plain[0].abs().max()) == 0.0 and float(grad[0].abs().max()) > 0.4


# --------------------------------------------------------------------------------------------------
# the decoupled correction: token-level losses (GRPO / PPO)
# --------------------------------------------------------------------------------------------------


def test_token_level_decoupled_loss_hand_computed() -> None:
    """One row, three tokens; token 0 sampled by an older version. Weights min(exp(prox - mu), 1.5):
    [1.5 (e^0.5 capped), e^-1, 1]; current = prox + [0.3, 0, -0.1], A = 1. Decoupled token-mean:
    -(1.5 * 1.2 + e^-1 * 1 + 1 * e^-0.1) / 3 (token 0's ratio to prox e^0.3 = 1.35 clipped to 1.2).
    The plain clip (ratio to mu: e^0.8 -> 1.2, e^-1, e^-0.1) gives -(1.2 + e^-1 + e^-0.1) / 3."""
    prox = torch.tensor([[-1.0, -2.0, -0.5]], dtype=D)
    mu = torch.tensor([[-1.5, -1.0, -0.5]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    cur = prox + torch.tensor([[0.3, 0.0, -0.1]], dtype=D)
    adv = torch.tensor([1.0], dtype=D)
    w, stats = decoupled_correction(prox, mu, mask, level="token", cap=1.5)
    _close(w, torch.tensor([[1.5, math.exp(-1.0), 1.0]], dtype=D))
    loss_fn = get_policy_loss("grpo")
    loss, _ = loss_fn(cur, prox, mask, adv, torch.zeros(1, dtype=torch.long), LossConfig(token_weights=w))
    expected = -(1.5 * 1.2 + math.exp(-1.0) * 1.0 + 1.0 * math.exp(-0.1)) / 3
    _close(loss.item(), expected)
    plain, _ = loss_fn(cur, mu, mask, adv, torch.zeros(1, dtype=torch.long), LossConfig())
    _close(plain.item(), -(1.2 + math.exp(-1.0) + math.exp(-0.1)) / 3)
    assert abs(loss.item() - plain.item()) > 0.1
    tw = [1.5, math.exp(-1.0), 1.0]
    _close(stats["rollout/tis_ess"], sum(tw) ** 2 / (3 * sum(x * x for x in tw)))


def test_sequence_level_decoupled_weights() -> None:
    """Sequence level: one weight per row, min(exp(sum_t m (prox - mu)), C) on its tokens; GSPO's
    sequence-mean: on its length-normalised ratio's scale, min(exp(mean_t m (prox - mu)), C)."""
    w, _ = decoupled_correction(PROX, MU, MASK, level="sequence", cap=CAP)
    _close(w[:, 0], torch.tensor([math.exp(0.3), math.exp(0.1), CAP], dtype=D))
    assert float(w[0, 2]) == 0.0  # padding
    w_mean, _ = decoupled_correction(PROX, MU, MASK, level="sequence-mean", cap=CAP)
    _close(w_mean[:, 1], torch.tensor([math.exp(0.3 / 2), math.exp(0.1 / 3), CAP], dtype=D))  # e^0.75 capped
    assert (w_mean - MASK).abs().max() > 0.1  # unlike no correction
