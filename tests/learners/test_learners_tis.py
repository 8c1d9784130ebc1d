"""Token-level truncated importance sampling (rollout -> training policy): weights, losses, trainer path."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from learners.batching import micro_batch_bounds
from learners.losses import LossConfig, get_policy_loss, grpo_loss, gspo_loss
from learners.scale import ScaleOut
from learners.trainer import TrainConfig, Trainer
from tests._builders import g0_wins, update_check_config, update_inputs
from tests._numeric import F64, assert_close_scaled, assert_differs_scaled

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)


def _ppo_term(rho: float, adv: float, eps: float = 0.2) -> float:
    return min(rho * adv, min(max(rho, 1 - eps), 1 + eps) * adv)


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------


def test_grpo_token_weights_hand_computed() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.4, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-1.1, -1.5, -0.5], [-0.3, -0.9, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    w = torch.tensor([[0.5, 2.0, 1.0], [1.5, 0.25, 9.0]], dtype=torch.float64)  # 9.0 sits on padding
    loss, _ = grpo_loss(lp, old, mask, adv, clip_eps=0.2, token_weights=w)
    terms = [
        (0.5, -1.0 - -1.1, 2.0),
        (2.0, -2.0 - -1.5, 2.0),
        (1.0, 0.0, 2.0),
        (1.5, 0.0, -1.0),
        (0.25, -0.4 - -0.9, -1.0),
    ]
    expected = -sum(wt * _ppo_term(math.exp(d), a) for wt, d, a in terms) / 5  # token-mean: 5 tokens
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    plain, _ = grpo_loss(lp, old, mask, adv, clip_eps=0.2)
    ones, _ = grpo_loss(lp, old, mask, adv, clip_eps=0.2, token_weights=torch.ones_like(w))
    assert ones.item() == plain.item() and abs(loss.item() - plain.item()) > 1e-3


def test_gspo_token_weights_keep_the_ratio_and_weight_each_tokens_gradient() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.0]], dtype=torch.float64)
    delta = torch.tensor([[1e-4, -2e-4, 3e-4, 0.0]], dtype=torch.float64)  # last token is padding
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.5], dtype=torch.float64)
    w = torch.tensor([[0.5, 2.0, 1.0, 7.0]], dtype=torch.float64)

    def run(weights):
        lp = (old + delta).clone().requires_grad_(True)
        loss, stats = gspo_loss(lp, old, mask, adv, clip_eps=3e-4, clip_eps_high=4e-4, token_weights=weights)
        loss.backward()
        return loss.item(), lp.grad, stats

    plain, g_plain, s_plain = run(None)
    ones, g_ones, _ = run(torch.ones_like(w))
    weighted, g_w, s_w = run(w)
    log_s = float(delta[0, :3].sum() / 3)  # 6.7e-5: inside the clip range, the gradient flows
    assert plain == pytest.approx(-1.5 * math.exp(log_s), abs=1e-12)
    assert ones == plain and weighted == plain and s_w == s_plain  # same ratio, same clipping decision
    assert torch.equal(g_ones, g_plain)
    # d/d lp_t of -A s = -A s / |y| per token; weighted: times w_t; padding gets nothing
    expected = torch.tensor(
        [[-1.5 * math.exp(log_s) / 3 * wt for wt in (0.5, 2.0, 1.0)] + [0.0]], dtype=torch.float64
    )
    assert torch.allclose(g_w, expected, rtol=1e-9, atol=1e-15)


def test_srpo_token_weights_keep_the_ratio_and_weight_each_members_gradient() -> None:
    """One event of two members (sqrt norm): the weights leave rho_e and the loss value alone and
    multiply each token's share of the gradient, d/d lp_jt = -A rho_e w_jt / (sqrt(2) E)."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=torch.float64)
    delta = torch.tensor([[0.01, -0.02, 0.03], [0.02, 0.01, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    events, adv = torch.tensor([0, 0]), torch.tensor([1.5, 1.5], dtype=torch.float64)
    w = torch.tensor([[2.0, 2.0, 2.0], [0.5, 0.25, 9.0]], dtype=torch.float64)  # 9.0 on padding

    def run(weights):
        lp = (old + delta).clone().requires_grad_(True)
        cfg = LossConfig(clip_eps=0.2, token_weights=weights)
        loss, stats = get_policy_loss("srpo")(lp, old, mask, adv, events, cfg)
        loss.backward()
        return loss.item(), lp.grad, stats

    plain, g_plain, s_plain = run(None)
    ones, g_ones, _ = run(torch.ones_like(w))
    weighted, g_w, s_w = run(w)
    rho = math.exp(float((delta * mask).sum()) / math.sqrt(2))  # 1.03: inside the clip range
    assert plain == pytest.approx(-1.5 * rho, abs=1e-12)
    assert ones == plain and weighted == plain and s_w == s_plain
    assert torch.equal(g_ones, g_plain)
    expected = -1.5 * rho / math.sqrt(2) * w * mask
    assert torch.allclose(g_w, expected, rtol=1e-12, atol=1e-15)


def test_srpo_refuses_rows_of_one_event_with_different_advantages() -> None:
    """The per-event advantage is no longer one row's pick: disagreeing rows are an error."""
    lp = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="different advantages"):
        get_policy_loss("srpo")(lp, lp, torch.ones_like(lp), adv, torch.tensor([0, 0]), LossConfig())


@pytest.mark.parametrize("algo", ["srpo", "mappo", "grpo", "gspo", "rloo"])
def test_every_registered_loss_takes_every_tis_level(algo: str) -> None:
    for level in ("token", "sequence", "event"):
        assert TrainConfig(algo=algo, model="m", tis=level).tis == level


def test_tis_is_refused_for_a_loss_without_token_weights() -> None:
    from learners.losses import POLICY_LOSSES, register_policy_loss

    @register_policy_loss("test-no-weights", unit="rows")
    def _pg(lp, old, mask, adv, event_index, cfg):  # pragma: no cover - never called
        raise AssertionError

    try:
        assert TrainConfig(model="m", algo="grpo", policy_loss="test-no-weights").tis == "auto"  # hf: off
        with pytest.raises(ValueError, match="per-token weights"):
            TrainConfig(model="m", algo="grpo", policy_loss="test-no-weights", tis="sequence")
    finally:
        POLICY_LOSSES.pop("test-no-weights")


# --------------------------------------------------------------------------------------------------
# ScaleOut.prepare: the weights and their metrics
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def learner_and_batch(tiny_model_dir):
    import srpo_envs
    from agents.hf import HFPolicy
    from agents.policy import PolicyMap, SamplingParams
    from agents.rollout import RolloutCollector

    policy = HFPolicy(tiny_model_dir)
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator"),
        PolicyMap.shared(policy),
        SamplingParams(temperature=1.0, max_new_tokens=6),
    )
    return policy, collector.collect([0, 1], group_size=2, seed=4)


def _scale(policy, **cfg) -> ScaleOut:
    """A ScaleOut whose trainer is a real TrainConfig (every field present) and the tiny policy."""
    from types import SimpleNamespace

    from agents.policy import PolicyMap

    config = TrainConfig(
        **{"model": "m", "algo": "grpo", "backend": "vllm", "tis": "token", "tis_cap": 1.5, **cfg}
    )

    def old_logprobs(rows):  # the policy's float32 recompute (the trainer's own is tested below)
        return policy.compute_logprobs([r.prompt_ids for r in rows], [r.response_ids for r in rows], 1.0)

    trainer = SimpleNamespace(
        cfg=config, policies=PolicyMap.shared(policy), device=torch.device("cpu"), old_logprobs=old_logprobs
    )
    return ScaleOut(trainer)


def test_prepare_token_level_weights_hand_computed(learner_and_batch) -> None:
    policy, batch = learner_and_batch
    shifts = (0.7, 0.2, -0.3)  # per token, cycling: exp(0.7) = 2.01 > cap 1.5, the others below it
    rows = [
        dataclasses.replace(
            r, behaviour_logprobs=[x - shifts[t % 3] for t, x in enumerate(r.behaviour_logprobs)]
        )
        for r in batch.rows
    ]
    out, weights, stats = _scale(policy).prepare(dataclasses.replace(batch, rows=rows), ratio_level="token")
    width = max(len(r.response_ids) for r in batch.rows)
    assert weights is not None and tuple(weights.shape) == (len(rows), width)
    expected, capped = [], []
    for i, r in enumerate(batch.rows):
        for t in range(width):
            if t >= len(r.response_ids) or not r.response_mask[t]:
                assert weights[i, t].item() == 0.0  # padding / env text: out of the loss
                continue
            w = min(1.5, math.exp(shifts[t % 3]))
            assert weights[i, t].item() == pytest.approx(w, rel=1e-3)
            expected.append(w)
            capped.append(w == 1.5)
    assert stats["rollout/tis_weight_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-3)
    assert stats["rollout/tis_capped_frac"] == pytest.approx(sum(capped) / len(capped), abs=1e-12)
    assert 0 < stats["rollout/tis_capped_frac"] < 1
    # behaviour == training log-probs: every weight 1 (float32 recompute noise only), nothing capped
    _, same, same_stats = _scale(policy).prepare(batch, ratio_level="token")
    on = torch.tensor(
        [[t < len(r.response_ids) and bool(r.response_mask[t]) for t in range(width)] for r in batch.rows]
    )
    assert torch.allclose(same[on], torch.ones(int(on.sum()), dtype=same.dtype), atol=1e-4)
    assert same_stats["rollout/tis_capped_frac"] == 0.0


def test_capped_fraction_counts_a_cap_that_exp_log_rounds_below(learner_and_batch) -> None:
    """exp(log 5) is 4.999... in float64: a ratio at the cap must still count as capped."""
    policy, batch = learner_and_batch
    rows = [
        dataclasses.replace(r, behaviour_logprobs=[x - 3.0 for x in r.behaviour_logprobs]) for r in batch.rows
    ]
    _, _, stats = _scale(policy, tis_cap=5.0).prepare(dataclasses.replace(batch, rows=rows), ratio_level="token")
    assert stats["rollout/tis_capped_frac"] == 1.0
    assert stats["rollout/tis_weight_mean"] == pytest.approx(5.0)


# --------------------------------------------------------------------------------------------------
# trainer: token weights through MiniBatch.collate -> Batch.take -> LossConfig
# --------------------------------------------------------------------------------------------------


def _trainer(model: Path, out: Path, **kw) -> Trainer:
    return Trainer(update_check_config(model, out, **{"dtype": "float64", **kw}), log=None)


def _grads(trainer: Trainer) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None])


def test_token_weights_reach_the_loss_and_accumulate_over_micro_batches(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Table-wide [R, T] weights -> MiniBatch.collate -> Batch.take -> LossConfig (the path is the same
    for every loss that takes token weights; GSPO's weighting is checked by hand above)."""
    trainer = _trainer(tiny_model_dir, tmp_path, algo="grpo")
    table, adv, mb, loss_fn, unit = update_inputs(trainer)
    width = max(len(r.response_ids) for r in table.rows)
    g = torch.Generator().manual_seed(0)
    weights = 0.5 + 1.5 * torch.rand(table.num_rows, width, generator=g, dtype=torch.float64)

    def step(w, budget=None):
        trainer.reconfigure(max_tokens_per_microbatch=budget)
        out = trainer.updater.minibatch_step(mb, table, adv, loss_fn, unit, w)
        return out, _grads(trainer).clone()

    _, g_none = step(None)
    _, g_ones = step(torch.ones(table.num_rows, width, dtype=torch.float64))
    big, g_w = step(weights)
    assert g_none.abs().sum() > 0
    # float64 gradients of two computations: tolerances scaled to the tensor's max (tests/_numeric.py)
    assert_close_scaled(g_ones, g_none, F64)  # w = 1: the no-TIS update
    assert_differs_scaled(g_w, g_none, 1e-2)  # the weights act (0.5..2 per token: a change of O(max))
    budget = max(sum(len(r.prompt_ids) + len(r.response_ids) for r in mb.rows) // 5, 1)
    assert len(micro_batch_bounds(mb.rows, mb.event_index, budget)) >= 4
    small, g_small = step(weights, budget)  # Batch.take slices the weights with their rows
    assert_close_scaled(g_small, g_w, F64)
    assert small["loss"] == pytest.approx(big["loss"], rel=1e-9, abs=1e-12)


@pytest.mark.slow
def test_update_with_token_tis_and_learner_behaviour_equals_no_tis(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The whole _update path with tis=token against the learner's own log-probs (a vLLM engine that
    agrees with the learner): every weight ~1, nothing capped, and the update's gradient equals the one
    without TIS; behaviour log-probs shifted so that the weights vary per token change the gradient.
    (lr = 0: one trainer, the same parameters for the three updates.)"""
    trainer = _trainer(tiny_model_dir, tmp_path, algo="grpo", tis="token")
    batch = trainer.collector.collect([0, 1], group_size=2, seed=3)
    g0_wins(batch.rows)
    # the rollout engine more (even tokens) or less (odd tokens) confident than the learner
    shifted = [
        dataclasses.replace(
            r, behaviour_logprobs=[x + (0.3 if t % 2 else -0.3) for t, x in enumerate(r.behaviour_logprobs)]
        )
        for r in batch.rows
    ]
    grads, logs = {}, {}
    for name, backend, rows in (
        ("tis", "vllm", batch.rows),
        ("plain", "hf", batch.rows),
        ("shifted", "vllm", shifted),
    ):
        trainer.reconfigure(backend=backend)  # the learner recomputes pi_old as it would for vLLM rollouts
        for pol in trainer.policies.policies:
            pol.policy_version = 0  # the rows' version: _update bumps it, and stale rows are refused
        logs[name] = trainer.update(dataclasses.replace(batch, rows=rows), 1)
        grads[name] = _grads(trainer).clone()
    assert logs["tis"]["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-6)  # recompute noise
    assert logs["tis"]["rollout/tis_capped_frac"] == 0.0
    assert "rollout/tis_weight_mean" not in logs["plain"]
    assert grads["plain"].abs().sum() > 0
    # weights 1 up to the float32 recompute noise (<= 1e-6 above): the gradients agree to 1e-5 of their max
    assert_close_scaled(grads["tis"], grads["plain"], 1e-5)
    moved = logs["shifted"]  # weights exp(+-0.3) = 1.35 / 0.74, both under the cap 2
    assert moved["rollout/tis_capped_frac"] == 0.0 and moved["rollout/tis_weight_mean"] > 1.01
    assert_differs_scaled(grads["shifted"], grads["plain"], 1e-2)


# --------------------------------------------------------------------------------------------------
# issue 28: every row its own weight (SRPO included), the event weight on SRPO's c(K) scale, pi_old
# from the training forward (bf16: the first ratio exactly 1), token level by default for GRPO
# --------------------------------------------------------------------------------------------------


def _shift_rows(rows, log_w: dict[int, float]):
    """Rollout log-probs lower by ``log_w[i] / n`` on each of row ``i``'s n loss tokens, so that its
    sequence weight pi_old / pi_rollout is ``exp(log_w[i])`` (pi_old == the behaviour log-probs up to
    float64 recompute noise)."""
    out = []
    for i, r in enumerate(rows):
        n = sum(1 for m in r.response_mask if m)
        d = log_w.get(i, 0.0) / max(n, 1)
        lps = [x - d if m else x for x, m in zip(r.behaviour_logprobs, r.response_mask, strict=True)]
        out.append(dataclasses.replace(r, behaviour_logprobs=lps))
    return out


def _row_logprob_grad(trainer: Trainer, row) -> torch.Tensor:
    """The gradient of row's summed loss-token log-prob, from a forward of that row alone."""
    from learners.batching import collate
    from learners.losses import masked_sum

    trainer.optimizer.zero_grad(set_to_none=True)
    batch = collate([row], trainer.policies.policies[0].pad_id, dtype=torch.float64)
    lp = trainer.forward.policy_logprobs([row], batch)[0]
    masked_sum(lp, batch.response_mask).backward()
    return _grads(trainer).clone()


@pytest.mark.slow
def test_srpo_row_weights_reach_their_own_rows(tiny_model_dir: Path, tmp_path: Path) -> None:
    """tis=sequence under SRPO: two members of one event weighted 2.0 and 0.5 move the gradient by
    exactly their own rows' gradients times (w - 1) (at rho = 1, unclipped: d/dtheta of the SRPO
    objective is -A_e / (c(K) E) sum_j w_j grad l_j). Before the fix the weights were folded into the
    advantages and SRPO kept one row's value per event: every member got the same weight."""
    from learners.batching import build_event_table

    trainer = _trainer(tiny_model_dir, tmp_path, algo="srpo", tis="sequence", tis_cap=10.0)
    trainer.reconfigure(backend="vllm")  # the learner recomputes pi_old as it would for vLLM rollouts
    batch = trainer.collector.collect([0, 1], group_size=2, seed=3)
    g0_wins(batch.rows)
    table = build_event_table(batch.rows)
    adv = trainer.updater.advantages(table).advantages
    events: dict[str, list[int]] = {}
    for i, r in enumerate(batch.rows):
        events.setdefault(r.event_id, []).append(i)
    a, b = next(
        idx[:2]
        for idx in events.values()
        if len(idx) >= 2 and abs(float(adv[table.rows.index(batch.rows[idx[0]])])) > 1e-6
    )
    k = len(events[batch.rows[a].event_id])

    def update(log_w: dict[int, float]) -> tuple[torch.Tensor, dict]:
        for pol in trainer.policies.policies:
            pol.policy_version = 0  # the rows' version: _update bumps it
        stats = trainer.update(dataclasses.replace(batch, rows=_shift_rows(batch.rows, log_w)), 1)
        return _grads(trainer).clone(), stats

    g_one, s_one = update({})
    g_w, s_w = update({a: math.log(2.0), b: math.log(0.5)})
    # pi_old (float64 training forward) vs the sampler's log-probs: 1e-7 apart
    assert s_one["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert s_w["actor/clip_frac"] == 0.0 and s_w["actor/mean_abs_log_ratio"] < 1e-5  # rho = 1
    grad_a, grad_b = _row_logprob_grad(trainer, batch.rows[a]), _row_logprob_grad(trainer, batch.rows[b])
    assert not torch.allclose(grad_a, grad_b, rtol=1e-3)
    scale = -float(adv[table.rows.index(batch.rows[a])]) / (math.sqrt(k) * s_w["actor/num_events"])
    expected = scale * ((2.0 - 1.0) * grad_a + (0.5 - 1.0) * grad_b)
    assert float(expected.abs().max()) > 0
    diff = g_w - g_one
    assert float((diff - expected).abs().max()) <= 1e-5 * float(expected.abs().max())


def test_srpo_event_weight_is_on_the_scale_of_its_clipped_ratio(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Every loss token 0.01 more likely under the learner than under the rollout engine: SRPO's event
    weight is exp(0.01 * tokens_e / sqrt(K_e)) (sqrt norm), capped at 2 -- the scale of its clipped
    ratio -- not the unnormalised product exp(0.01 * tokens_e) (which large events would hit the cap
    with)."""
    shift = 0.01
    for norm in ("sqrt",):
        trainer = _trainer(tiny_model_dir, tmp_path / norm, algo="srpo", norm=norm)
        trainer.reconfigure(backend="vllm")
        assert trainer.scale.tis_level("event") == "event"  # --tis auto: SRPO's event level
        batch = trainer.collector.collect([0, 1], group_size=2, seed=3)
        g0_wins(batch.rows)
        rows = [
            dataclasses.replace(
                r,
                behaviour_logprobs=[
                    x - shift if m else x for x, m in zip(r.behaviour_logprobs, r.response_mask, strict=True)
                ],
            )
            for r in batch.rows
        ]
        stats = trainer.update(dataclasses.replace(batch, rows=rows), 1)
        events: dict[str, list] = {}
        for r in batch.rows:
            events.setdefault(r.event_id, []).append(r)
        expected = []
        for members in events.values():
            tokens = sum(sum(1 for m in r.response_mask if m) for r in members)
            c = math.sqrt(len(members)) if norm == "sqrt" else len(members)
            expected += [min(2.0, math.exp(shift * tokens / c))] * len(members)
        assert stats["rollout/tis_weight_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-6)


def test_auto_tis_is_token_level_for_per_token_losses(tiny_model_dir: Path, tmp_path: Path) -> None:
    """verl's default: a per-token loss (GRPO) gets per-token weights under --tis auto. Alternating
    +-0.3 token shifts: token weights exp(+-0.3) (mean 1.045, ESS < 1), where a sequence weight would
    be their product (about 1 on even-length rows)."""
    trainer = _trainer(tiny_model_dir, tmp_path, algo="grpo")
    trainer.reconfigure(backend="vllm")
    batch = trainer.collector.collect([0, 1], group_size=2, seed=3)
    g0_wins(batch.rows)
    rows = [
        dataclasses.replace(
            r, behaviour_logprobs=[x + (0.3 if t % 2 else -0.3) for t, x in enumerate(r.behaviour_logprobs)]
        )
        for r in batch.rows
    ]
    stats = trainer.update(dataclasses.replace(batch, rows=rows), 1)
    on = [t % 2 for r in batch.rows for t, m in enumerate(r.response_mask) if m]
    weights = [math.exp(-0.3) if odd else math.exp(0.3) for odd in on]
    assert stats["rollout/tis_weight_mean"] == pytest.approx(sum(weights) / len(weights), rel=1e-6)
    ess = sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))
    assert stats["rollout/tis_ess"] == pytest.approx(ess, rel=1e-6) and ess < 1
    assert stats["rollout/tis_capped_frac"] == 0.0


@pytest.mark.parametrize("algo", ["srpo", "grpo"])
def test_bf16_first_ratio_is_exactly_one(tiny_model_dir: Path, tmp_path: Path, algo: str) -> None:
    """pi_old from the training forward under the same bf16 autocast (CPU): before the first optimizer
    step every ratio is exactly 1 (no clipping, zero log-ratio). Before the fix pi_old was the float32
    sampler's log-probs and the bf16 forward's ratio was off by bf16 rounding."""
    trainer = Trainer(update_check_config(tiny_model_dir, tmp_path, algo=algo, dtype="bfloat16"), log=None)
    batch = trainer.collector.collect([0, 1], group_size=2, seed=3)
    g0_wins(batch.rows)
    stats = trainer.update(batch, 1)
    assert stats["actor/mean_abs_log_ratio"] == 0.0 and stats["actor/approx_kl"] == 0.0
    assert stats["actor/clip_frac"] == 0.0
    assert stats["rollout/logprob_abs_diff"] > 0  # the float32 sampler and the bf16 forward do differ
