"""Tests of learners/losses.py: hand-computed values, gradients, clipping, masking, validation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from learners.losses import (
    AGG_MODES,
    EVENT_NORMS,
    POLICY_LOSSES,
    LossConfig,
    aggregate,
    entropy_from_logits,
    get_policy_loss,
    grpo_loss,
    gspo_loss,
    kl_k3,
    logprobs_from_logits,
    loss_denominator,
    masked_mean,
    ppo_policy_loss,
    srpo_loss,
    value_loss,
)

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)

DTYPES = [torch.float32, torch.float64]


def _ppo_term(rho: float, adv: float, eps: float = 0.2) -> float:
    """Reference PPO objective of one ratio, written independently of the library."""
    return min(rho * adv, min(max(rho, 1 - eps), 1 + eps) * adv)


# --------------------------------------------------------------------------------------------------
# srpo_loss: values
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_srpo_hand_computed(dtype: torch.dtype) -> None:
    # 3 rows, 2 tokens; rows 0,1 -> event 0 (K=2), row 2 -> event 1 (K=1).
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7], [-1.2, -3.0]], dtype=dtype)
    old = torch.tensor([[-1.1, -2.1], [-0.6, -0.6], [-1.0, -9.0]], dtype=dtype)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=dtype)  # last token of row 2 is env text
    idx = torch.tensor([0, 0, 1])
    adv = torch.tensor([1.5, -0.5], dtype=dtype)
    # member log-ratios: 0.1+0.1, 0.1-0.1, -0.2 (masked token ignored)
    l0 = 0.2
    l1 = 0.0
    l2 = -0.2
    L = [(l0 + l1) / math.sqrt(2), l2 / 1.0]
    expected = -(_ppo_term(math.exp(L[0]), 1.5) + _ppo_term(math.exp(L[1]), -0.5)) / 2
    loss, stats = srpo_loss(lp, old, mask, idx, adv, clip_eps=0.2, norm="sqrt")
    assert loss.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert loss.item() == pytest.approx(expected, abs=tol)
    assert stats["num_events"] == 2
    assert stats["mean_k"] == pytest.approx(1.5)
    assert stats["max_k"] == 2
    assert stats["mean_abs_log_ratio"] == pytest.approx((abs(L[0]) + abs(L[1])) / 2, abs=tol)
    assert stats["approx_kl"] == pytest.approx((0.5 * L[0] ** 2 + 0.5 * L[1] ** 2) / 2, abs=tol)
    assert stats["clip_frac"] == 0.0  # |L| < log(1.2) for both


def test_srpo_clip_frac_and_clipped_value() -> None:
    # event 0: rho = e^1 > 1.2 with A > 0 -> clipped to 1.2 * A; event 1: rho = e^-1 with A > 0: not clipped.
    lp = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp)
    adv = torch.tensor([2.0, 3.0], dtype=torch.float64)
    loss, stats = srpo_loss(lp, old, mask, torch.tensor([0, 1]), adv)
    assert loss.item() == pytest.approx(-(1.2 * 2.0 + math.exp(-1) * 3.0) / 2)
    assert stats["clip_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("norm", sorted(EVENT_NORMS))
def test_srpo_k1_equals_sequence_level_ppo(norm: str) -> None:
    g = torch.Generator().manual_seed(0)
    R, T = 7, 5
    lp = -torch.rand(R, T, generator=g, dtype=torch.float64)
    old = lp + 0.15 * torch.randn(R, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(R, T, generator=g) > 0.3).double()
    adv = torch.randn(R, generator=g, dtype=torch.float64)
    loss, _ = srpo_loss(lp, old, mask, torch.arange(R), adv, norm=norm)
    seq, _ = ppo_policy_loss(lp, old, mask, adv, level="sequence")
    ref = (
        -sum(_ppo_term(math.exp(float(((lp[i] - old[i]) * mask[i]).sum())), float(adv[i])) for i in range(R))
        / R
    )
    assert loss.item() == pytest.approx(ref, abs=1e-12)
    assert seq.item() == pytest.approx(ref, abs=1e-12)


def _event_log_ratios(lp, old, mask, idx, n_ev, norm) -> list[float]:
    """Recover each L_e from the loss: unclipped (huge eps), one-hot advantage -> loss = -exp(L_e) / E."""
    out = []
    for e in range(n_ev):
        adv = torch.zeros(n_ev, dtype=lp.dtype)
        adv[e] = 1.0
        loss, _ = srpo_loss(lp, old, mask, idx, adv, clip_eps=1e6, norm=norm)
        out.append(math.log(-loss.item() * n_ev))
    return out


def test_srpo_norms_differ_by_stated_scaling() -> None:
    g = torch.Generator().manual_seed(1)
    ks = [1, 2, 3, 4]
    idx = torch.repeat_interleave(torch.arange(len(ks)), torch.tensor(ks))
    R, T = int(idx.numel()), 6
    lp = -torch.rand(R, T, generator=g, dtype=torch.float64)
    old = lp - 0.05 * torch.rand(R, T, generator=g, dtype=torch.float64)  # all positive log-ratios
    mask = torch.ones(R, T, dtype=torch.float64)
    L = {n: _event_log_ratios(lp, old, mask, idx, len(ks), n) for n in ("sum", "sqrt", "mean")}
    for e, k in enumerate(ks):
        assert L["sum"][e] == pytest.approx(math.sqrt(k) * L["sqrt"][e], rel=1e-10)
        assert L["sum"][e] == pytest.approx(k * L["mean"][e], rel=1e-10)
        member_sum = float(((lp - old) * mask)[idx == e].sum())
        assert L["sum"][e] == pytest.approx(member_sum, rel=1e-10)


def test_srpo_num_events_rescales_for_accumulation() -> None:
    lp = torch.tensor([[0.1], [0.05], [-0.1]], dtype=torch.float64)
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp)
    idx = torch.tensor([0, 0, 1])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    full, _ = srpo_loss(lp, old, mask, idx, adv)
    half, _ = srpo_loss(lp, old, mask, idx, adv, num_events=4)
    assert half.item() == pytest.approx(full.item() / 2)
    # two micro-batches with num_events = total events sum to the full-batch loss
    a, _ = srpo_loss(lp[:2], old[:2], mask[:2], torch.tensor([0, 0]), adv[:1], num_events=2)
    b, _ = srpo_loss(lp[2:], old[2:], mask[2:], torch.tensor([0]), adv[1:], num_events=2)
    assert (a + b).item() == pytest.approx(full.item())


def test_srpo_log_ratio_is_clamped() -> None:
    lp = torch.tensor([[500.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = srpo_loss(
        lp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.ones(1, 1),
        torch.tensor([0]),
        torch.tensor([-1.0], dtype=torch.float64),
    )
    assert torch.isfinite(loss)
    assert loss.item() == pytest.approx(math.exp(20.0))
    loss.backward()
    assert torch.isfinite(lp.grad).all()


# --------------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------------


def test_srpo_gradcheck() -> None:
    g = torch.Generator().manual_seed(2)
    idx = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    R, T = int(idx.numel()), 4
    old = -torch.rand(R, T, generator=g, dtype=torch.float64)
    lp0 = old + 0.05 * torch.randn(R, T, generator=g, dtype=torch.float64)
    lp0[3:6] += 0.4  # event 2 far outside the clip range: a zero-gradient region, away from the kink
    mask = (torch.rand(R, T, generator=g) > 0.25).double()
    adv = torch.tensor([1.0, -0.7, 0.9, -1.3], dtype=torch.float64)
    for norm in EVENT_NORMS:

        def f(x: torch.Tensor, norm: str = norm) -> torch.Tensor:
            return srpo_loss(x, old, mask, idx, adv, norm=norm)[0]

        assert torch.autograd.gradcheck(f, (lp0.clone().requires_grad_(True),), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("agg", sorted(AGG_MODES))
def test_grpo_gradcheck(agg: str) -> None:
    g = torch.Generator().manual_seed(3)
    R, T = 4, 5
    old = -torch.rand(R, T, generator=g, dtype=torch.float64)
    lp0 = old + 0.05 * torch.randn(R, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(R, T, generator=g) > 0.3).double()
    adv = torch.randn(R, generator=g, dtype=torch.float64)

    def f(x: torch.Tensor) -> torch.Tensor:
        return grpo_loss(x, old, mask, adv, agg=agg)[0]

    assert torch.autograd.gradcheck(f, (lp0.clone().requires_grad_(True),), eps=1e-6, atol=1e-8)


def test_clipped_events_have_zero_gradient() -> None:
    # event 0: A>0, rho=e^0.5 > 1.2 (clipped) | event 1: A<0, rho=e^-0.5 < 0.8 (clipped)
    # event 2: A>0, rho=e^-0.5 < 0.8 (NOT clipped: PPO only cuts the profitable direction) | event 3: inside
    lp = torch.tensor([[0.25, 0.0], [0.25, 0.0], [-0.5, 0.0], [-0.5, 0.0], [0.05, 0.0]], dtype=torch.float64)
    lp.requires_grad_(True)
    old = torch.zeros(5, 2, dtype=torch.float64)
    mask = torch.tensor([[1, 0]] * 5, dtype=torch.float64)
    idx = torch.tensor([0, 0, 1, 2, 3])
    adv = torch.tensor([1.0, -1.0, 1.0, 2.0], dtype=torch.float64)
    loss, stats = srpo_loss(lp, old, mask, idx, adv, norm="sum")
    loss.backward()
    grad = lp.grad
    assert torch.all(grad[:3] == 0)
    assert torch.all(grad[3:, 0] != 0)
    assert torch.all(grad[:, 1] == 0)  # masked tokens never get gradient
    assert stats["clip_frac"] == pytest.approx(0.5)
    # unclipped events: d(-rho A / E)/d lp = -rho A / E
    assert grad[3, 0].item() == pytest.approx(-math.exp(-0.5) * 1.0 / 4)
    assert grad[4, 0].item() == pytest.approx(-math.exp(0.05) * 2.0 / 4)


def test_grpo_clipped_tokens_have_zero_gradient() -> None:
    lp = torch.tensor([[0.5, -0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    loss, stats = grpo_loss(lp, old, torch.ones(1, 3), torch.tensor([1.0], dtype=torch.float64))
    loss.backward()
    assert lp.grad[0, 0] == 0  # ratio e^0.5 > 1.2 with A > 0
    assert lp.grad[0, 1].item() == pytest.approx(-math.exp(-0.5) / 3)
    assert lp.grad[0, 2].item() == pytest.approx(-1.0 / 3)
    assert stats["clip_frac"] == pytest.approx(1 / 3)


# --------------------------------------------------------------------------------------------------
# masking
# --------------------------------------------------------------------------------------------------


def _masked_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    R, T = 6, 7
    old = -torch.rand(R, T, generator=g, dtype=torch.float64)
    lp = old + 0.1 * torch.randn(R, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(R, T, generator=g) > 0.4).double()
    mask[:, 0] = 1.0
    return lp, old, mask


@pytest.mark.parametrize(
    "loss_fn",
    [
        lambda lp, old, m: srpo_loss(
            lp, old, m, torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([1.0, -2.0, 0.5])
        )[0],
        *[
            (lambda agg: lambda lp, old, m: grpo_loss(lp, old, m, torch.linspace(-1, 1, 6), agg=agg)[0])(a)
            for a in sorted(AGG_MODES)
        ],
        lambda lp, old, m: ppo_policy_loss(lp, old, m, torch.linspace(-1, 1, 6), level="sequence")[0],
    ],
)
def test_masked_tokens_change_nothing(loss_fn) -> None:
    lp, old, mask = _masked_inputs(4)
    a = lp.clone().requires_grad_(True)
    loss_a = loss_fn(a, old, mask)
    loss_a.backward()
    junk = torch.randn_like(lp) * 50
    junk[0, mask[0] == 0] = float("nan")
    junk[1, mask[1] == 0] = float("inf")
    lp_b = torch.where(mask.bool(), lp, junk)
    old_b = torch.where(mask.bool(), old, -junk)
    b = lp_b.clone().requires_grad_(True)
    loss_b = loss_fn(b, old_b, mask)
    loss_b.backward()
    assert loss_b.item() == pytest.approx(loss_a.item(), abs=1e-12)
    assert torch.equal(a.grad, b.grad)  # exact by design: masked entries are selected away, same kernels
    assert torch.all(b.grad[mask == 0] == 0)
    # and the mask is not a no-op: changing an unmasked token does change the loss
    c = lp.clone()
    c[mask.bool()] += 0.05
    assert loss_fn(c, old, mask).item() != pytest.approx(loss_a.item(), abs=1e-9)


def test_bool_and_int_masks_match_float() -> None:
    lp, old, mask = _masked_inputs(5)
    idx = torch.tensor([0, 1, 1, 2, 3, 3])
    adv = torch.tensor([0.3, -1.0, 2.0, 0.1])
    ref = srpo_loss(lp, old, mask, idx, adv)[0]
    assert srpo_loss(lp, old, mask.bool(), idx, adv)[0].item() == pytest.approx(ref.item(), abs=1e-12)
    assert srpo_loss(lp, old, mask.long(), idx.int(), adv)[0].item() == pytest.approx(ref.item(), abs=1e-12)


# --------------------------------------------------------------------------------------------------
# aggregation, GRPO values
# --------------------------------------------------------------------------------------------------


def test_aggregate_modes_known_values() -> None:
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # row 2 has no loss token
    assert aggregate(loss_mat, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 / 3 + 4 / 3) / 2)
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm", norm_len=10).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(loss_mat, mask, "nope")
    with pytest.raises(ValueError):
        aggregate(loss_mat, mask[:, :2], "token-mean")


@pytest.mark.parametrize("dtype", DTYPES)
def test_grpo_hand_computed(dtype: torch.dtype) -> None:
    lp = torch.tensor([[-0.9, -1.0], [-2.0, -0.5]], dtype=dtype)
    old = torch.tensor([[-1.0, -1.0], [-1.5, -0.5]], dtype=dtype)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=dtype)
    adv = torch.tensor([2.0, -1.0], dtype=dtype)
    t00 = -_ppo_term(math.exp(0.1), 2.0)
    t01 = -_ppo_term(1.0, 2.0)
    t10 = -_ppo_term(math.exp(-0.5), -1.0)  # rho=0.607 < 0.8 with A<0: clipped to -0.8*-1
    loss, stats = grpo_loss(lp, old, mask, adv, agg="token-mean")
    assert loss.dtype == dtype
    assert loss.item() == pytest.approx((t00 + t01 + t10) / 3, abs=1e-6)
    loss2, _ = grpo_loss(lp, old, mask, adv, agg="seq-mean-token-mean")
    assert loss2.item() == pytest.approx(((t00 + t01) / 2 + t10) / 2, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["num_tokens"] == 3
    # asymmetric clip: upper bound only matters for A>0
    loss3, _ = grpo_loss(lp, old, mask, adv, clip_eps=0.2, clip_eps_high=0.05)
    t00h = -min(math.exp(0.1) * 2.0, 1.05 * 2.0)
    assert loss3.item() == pytest.approx((t00h + t01 + t10) / 3, abs=1e-6)


def test_grpo_per_token_advantages_match_broadcast() -> None:
    lp, old, mask = _masked_inputs(6)
    adv = torch.randn(6, dtype=torch.float64)
    a, _ = grpo_loss(lp, old, mask, adv)
    b, _ = ppo_policy_loss(lp, old, mask, adv[:, None].expand(-1, 7).clone(), level="token")
    assert a.item() == pytest.approx(b.item(), abs=1e-12)


# --------------------------------------------------------------------------------------------------
# value loss, KL, entropy, helpers
# --------------------------------------------------------------------------------------------------


def test_value_loss_known_values() -> None:
    values = torch.tensor([1.0, 0.0, 2.0])
    old = torch.tensor([0.5, 0.0, 1.0])
    returns = torch.tensor([0.0, 1.0, 3.0])
    # entry 0: unclipped err 1, clipped v=0.7 -> 0.49; max 1
    # entry 1: err 1 both -> 1
    # entry 2: unclipped (2-3)^2=1, clipped v=1.2 -> 3.24: max 3.24 (clipped is larger)
    loss, stats = value_loss(values, old, returns, clip_eps=0.2)
    assert loss.item() == pytest.approx(0.5 * (1 + 1 + 3.24) / 3)
    assert stats["vf_clip_frac"] == pytest.approx(1 / 3)
    plain, _ = value_loss(values, old, returns, clip_eps=None)
    assert plain.item() == pytest.approx(0.5 * 3 / 3)
    masked, _ = value_loss(values, old, returns, clip_eps=0.2, mask=torch.tensor([1, 1, 0]))
    assert masked.item() == pytest.approx(0.5 * 2 / 2)
    with pytest.raises(ValueError):
        value_loss(values, old, returns[:2])


def test_kl_k3() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, -1.0, -40.0]], dtype=torch.float64)
    k = kl_k3(lp, ref)
    assert k[0, 0].item() == 0.0
    assert k[0, 1].item() == pytest.approx(math.exp(1.0) - 1.0 - 1.0)
    assert k[0, 2].item() == pytest.approx(10.0)  # clamped
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(50, 10, generator=g), torch.randn(50, 10, generator=g)
    assert torch.all(kl_k3(x, y) >= 0)


def test_entropy_and_logprobs_from_logits() -> None:
    v = 13
    assert entropy_from_logits(torch.zeros(2, v)).allclose(torch.full((2,), math.log(v)))
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    # logsumexp(z) - sum(p z): a difference of two ~100s in float32 (ulp(100) = 7.6e-6); scaled to the logits
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6 * peaked.abs().max().item())
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 4, v, generator=g, dtype=torch.float64)
    labels = torch.randint(0, v, (3, 4), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert logprobs_from_logits(logits, labels).allclose(ref)
    ref_t = torch.log_softmax(logits / 0.7, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert logprobs_from_logits(logits, labels, temperature=0.7).allclose(ref_t)
    p = torch.softmax(logits, -1)
    assert entropy_from_logits(logits).allclose(-(p * p.log()).sum(-1))
    assert logprobs_from_logits(logits.to(torch.bfloat16), labels).dtype == torch.float32


def test_masked_mean() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    m = torch.tensor([[1, 0], [1, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_mean(x, m, dim=-1).tolist() == [1.0, 3.0]
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert masked_mean(x, torch.tensor([[0.5, 0.0], [1.5, 0.0]])).item() == pytest.approx((0.5 + 4.5) / 2)


# --------------------------------------------------------------------------------------------------
# validation and registries
# --------------------------------------------------------------------------------------------------


def test_srpo_validation() -> None:
    lp = torch.zeros(3, 2)
    m = torch.ones(3, 2)
    idx = torch.tensor([0, 0, 1])
    adv = torch.zeros(2)
    with pytest.raises(ValueError, match="unknown event norm"):
        srpo_loss(lp, lp, m, idx, adv, norm="cube")
    with pytest.raises(ValueError, match="shape mismatch"):
        srpo_loss(lp, lp[:, :1], m, idx, adv)
    with pytest.raises(ValueError, match="event_index"):
        srpo_loss(lp, lp, m, idx[:2], adv)
    with pytest.raises(ValueError, match="no rows"):
        srpo_loss(lp, lp, m, torch.tensor([0, 0, 2]), torch.zeros(3))  # event 1 empty
    with pytest.raises(ValueError, match="outside"):
        srpo_loss(lp, lp, m, torch.tensor([0, 1, 2]), adv)
    with pytest.raises(ValueError, match="outside"):
        srpo_loss(lp, lp, m, torch.tensor([0, -1, 1]), adv)
    with pytest.raises(ValueError, match="integer"):
        srpo_loss(lp, lp, m, idx.float(), adv)
    with pytest.raises(ValueError, match="advantages"):
        srpo_loss(lp, lp, m, idx, torch.zeros(0))
    with pytest.raises(ValueError, match="empty batch"):
        srpo_loss(lp[:0], lp[:0], m[:0], idx[:0], adv)
    with pytest.raises(ValueError):
        grpo_loss(lp, lp, m, torch.zeros(4))
    with pytest.raises(ValueError, match="level"):
        ppo_policy_loss(lp, lp, m, torch.zeros(3), level="event")


def test_registries() -> None:
    assert set(EVENT_NORMS) == {"sqrt", "sum", "mean", "k1"}
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"} <= set(AGG_MODES)
    assert {"srpo", "grpo", "ppo", "gspo"} <= set(POLICY_LOSSES)
    with pytest.raises(ValueError, match="known: .*gspo"):
        get_policy_loss("nope")
    with pytest.raises(ValueError, match="known"):
        srpo_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.tensor([0]), torch.ones(1), norm="x"
        )


# --------------------------------------------------------------------------------------------------
# k1, GSPO, registered losses with one signature, exact micro-batch normalisers
# --------------------------------------------------------------------------------------------------


def test_k1_is_members_as_events_with_the_event_advantage() -> None:
    # one K=2 event (rows 0, 1) and one K=1 event; k1 = sequence-level PPO per member, mean over members
    lp = torch.tensor([[0.3, 0.0], [-0.1, 0.05], [0.02, 0.0]], dtype=torch.float64)
    old = torch.zeros_like(lp)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    idx = torch.tensor([0, 0, 1])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, stats = srpo_loss(lp, old, mask, idx, adv, norm="k1")
    ref = (
        -(_ppo_term(math.exp(0.3), 1.0) + _ppo_term(math.exp(-0.05), 1.0) + _ppo_term(math.exp(0.02), -2.0))
        / 3
    )
    assert loss.item() == pytest.approx(ref, abs=1e-12)
    assert stats["max_k"] == 1.0 and stats["num_events"] == 3


def test_gspo_hand_computed() -> None:
    # row 0: 2 tokens with log-ratios 0.15, 0.05 -> log s = 0.1 (inside the clip range); row 1: one loss
    # token, -0.5 -> s = e^-0.5 = 0.61 < 0.8 with A = -1: the clipped term (0.8) is the active one
    lp = torch.tensor([[0.15, 0.05], [-0.5, 9.0]], dtype=torch.float64)
    old = torch.zeros_like(lp)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, stats = gspo_loss(lp, old, mask, adv, clip_eps=0.2)
    ref = -(_ppo_term(math.exp(0.1), 1.0) + _ppo_term(math.exp(-0.5), -1.0)) / 2
    assert loss.item() == pytest.approx(ref, abs=1e-12)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["mean_abs_log_ratio"] == pytest.approx((0.1 + 0.5) / 2)


def _random_minibatch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ks = [2, 1, 3, 1, 2]
    idx = torch.repeat_interleave(torch.arange(len(ks)), torch.tensor(ks))
    R, T = int(idx.numel()), 6
    old = -torch.rand(R, T, generator=g, dtype=torch.float64)
    lp = old + 0.2 * torch.randn(R, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(R, T, generator=g) > 0.3).double()
    mask[:, 0] = 1.0
    adv = torch.randn(len(ks), generator=g, dtype=torch.float64)[idx]  # per row, shared by an event
    return lp, old, mask, idx, adv


@pytest.mark.parametrize(
    ("name", "cfg"),
    [
        ("srpo", LossConfig(norm="sqrt")),
        ("srpo", LossConfig(norm="k1")),
        ("grpo", LossConfig(agg="token-mean")),
        ("grpo", LossConfig(agg="seq-mean-token-mean")),
        ("grpo", LossConfig(agg="seq-mean-token-sum-norm", norm_len=48)),
        ("gspo", LossConfig()),
    ],
)
def test_micro_batches_with_the_minibatch_denominator_sum_to_the_full_loss(
    name: str, cfg: LossConfig
) -> None:
    lp, old, mask, idx, adv = _random_minibatch()
    loss_fn = get_policy_loss(name)
    full, _ = loss_fn(lp, old, mask, adv, idx, cfg)
    denom = loss_denominator(loss_fn.unit(cfg), mask, idx)
    with_denom = replace(cfg, denominator=denom)
    assert loss_fn(lp, old, mask, adv, idx, with_denom)[0].item() == pytest.approx(full.item(), abs=1e-12)
    parts = 0.0
    for a, b in [(0, 3), (3, 6), (6, 9)]:  # event-atomic: events {0, 1}, {2}, {3, 4}
        local = idx[a:b] - idx[a]
        parts += loss_fn(lp[a:b], old[a:b], mask[a:b], adv[a:b], local, with_denom)[0].item()
    assert parts == pytest.approx(full.item(), abs=1e-12)


def test_dr_grpo_norm_len_makes_the_loss_independent_of_padding() -> None:
    lp, old, mask, idx, adv = _random_minibatch(1)
    wide = [torch.nn.functional.pad(t, (0, 5)) for t in (lp, old, mask)]
    cfg = LossConfig(agg="seq-mean-token-sum-norm", norm_len=48)
    a, _ = get_policy_loss("grpo")(lp, old, mask, adv, idx, cfg)
    b, _ = get_policy_loss("grpo")(*wide, adv, idx, cfg)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)


def test_on_policy_sum_and_k1_give_the_same_update_direction() -> None:
    """One on-policy step (old = current, every ratio 1): SRPO's ``sum`` and K=1 gradients differ only by
    the factor E/R (events vs members in the mean), which Adam removes; ``sqrt`` weighs events of
    different K differently, so its direction differs."""
    g = torch.Generator().manual_seed(4)
    ks = [1, 3, 2, 4]
    idx = torch.repeat_interleave(torch.arange(len(ks)), torch.tensor(ks))
    R, T = int(idx.numel()), 5
    feats = torch.randn(R, T, 8, generator=g, dtype=torch.float64)
    theta0 = torch.randn(8, generator=g, dtype=torch.float64)
    mask = (torch.rand(R, T, generator=g) > 0.2).double()
    adv = torch.randn(len(ks), generator=g, dtype=torch.float64)

    def grad(norm: str) -> torch.Tensor:
        theta = theta0.clone().requires_grad_(True)
        lp = torch.nn.functional.logsigmoid(feats @ theta)
        loss, _ = srpo_loss(lp, lp.detach(), mask, idx, adv, norm=norm)
        (g_theta,) = torch.autograd.grad(loss, theta)
        return g_theta

    cos = torch.nn.functional.cosine_similarity
    assert cos(grad("sum"), grad("k1"), dim=0).item() == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(grad("sum") * len(ks) / R, grad("k1"), atol=1e-14)
    assert cos(grad("sqrt"), grad("k1"), dim=0).item() < 0.999
