"""The one update path: micro-batch accumulation equals one big batch, algorithms plug in by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learners.batching import build_event_table, event_minibatches, micro_batch_bounds
from learners.trainer import Trainer
from tests._builders import g0_wins, make_row, update_check_config, update_inputs
from tests._numeric import F64, assert_close_scaled

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)

_cfg = update_check_config


def _grads(trainer: Trainer) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None])


@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("srpo", {"kl_coef": 0.1, "entropy_coef": 0.01}),
        ("srpo", {"gradient_checkpointing": True}),
        ("srpo", {"norm": "k1"}),
        ("grpo", {}),
        ("dr-grpo", {}),
        ("gspo", {}),
    ],
)
def test_micro_batches_accumulate_to_the_big_batch_gradient(
    algo: str, extra: dict, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Same minibatch, float64 on CPU: one micro-batch vs >= 4 event-atomic micro-batches (backward
    each, the loss scaled by the whole minibatch's normaliser) give the same gradient."""
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path, algo=algo, dtype="float64", **extra), log=None)
    assert all(p.dtype == torch.float64 for p in trainer.params)
    table, adv, mb, loss_fn, unit = update_inputs(trainer)

    trainer.reconfigure(max_tokens_per_microbatch=None)
    big = trainer.updater.minibatch_step(mb, table, adv, loss_fn, unit)
    g_big = _grads(trainer).clone()

    budget = max(sum(len(r.prompt_ids) + len(r.response_ids) for r in mb.rows) // 5, 1)
    assert len(micro_batch_bounds(mb.rows, mb.event_index, budget)) >= 4
    trainer.reconfigure(max_tokens_per_microbatch=budget)
    small = trainer.updater.minibatch_step(mb, table, adv, loss_fn, unit)
    g_small = _grads(trainer)

    assert g_big.abs().sum() > 0
    # float64, the same terms summed per micro-batch: one tolerance scaled to max|g_big| (tests/_numeric.py)
    assert_close_scaled(g_small, g_big, F64)
    assert small["loss"] == pytest.approx(big["loss"], rel=1e-9, abs=1e-12)


def test_micro_batch_bounds_are_event_atomic() -> None:
    rows = [
        make_row(f"e{e}/0", m, k, prompt=(1, 1, 1), response=(2, 2), reward=0.0)
        for e, k in enumerate([2, 1, 3])
        for m in range(k)
    ]
    idx = torch.tensor([0, 0, 1, 2, 2, 2])
    assert micro_batch_bounds(rows, idx, None) == [(0, 6)]
    assert micro_batch_bounds(rows, idx, 10) == [(0, 2), (2, 3), (3, 6)]  # event 2 (15 tokens) alone
    assert micro_batch_bounds(rows, idx, 15) == [(0, 3), (3, 6)]
    with pytest.raises(ValueError):
        micro_batch_bounds(rows, idx, 0)


@pytest.mark.slow
def test_critic_sees_the_question_of_a_long_search_state(tiny_model_dir: Path) -> None:
    """A multi-turn search state longer than the critic's budget: the critic input keeps the question
    (first line) and the latest state (tail). Keeping only the tail (the old behaviour) lost the
    question, so the 'centralised' critic could not tell which question it was valuing."""
    import srpo_envs
    from learners.critic import ValueCritic

    env = srpo_envs.make("MultiTurnSearch-v0")
    env.reset(seed=0, options={"task_index": 0})
    for _ in range(3):
        if env.agents:
            env.step({a: "<search>capital city of the kingdom</search>" for a in env.active_agents})
    state = env.state()
    question = state.splitlines()[0]
    assert question.startswith("Question:")
    critic = ValueCritic.from_pretrained(str(tiny_model_dir), max_tokens=64)
    assert len(critic.tokenizer(state, add_special_tokens=False)["input_ids"]) > 64
    ids, attention = critic.encode([state])
    kept = ids[0][attention[0].bool()].tolist()
    assert len(kept) <= 64
    text = critic.tokenizer.decode(kept)
    assert text.startswith(question)
    assert text.rstrip().endswith(state.rstrip()[-20:])


def test_bfloat16_autocast_keeps_float32_master_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path, dtype="bfloat16", lr=1e-3), log=None)
    batch = trainer.collector.collect([0], group_size=2, seed=1)
    g0_wins(batch.rows)
    before = [p.detach().clone() for p in trainer.params]
    stats = trainer.update(batch, iteration=1)
    assert all(p.dtype == torch.float32 for p in trainer.params)
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.params, strict=True))
    assert torch.isfinite(torch.tensor(stats["actor/loss"]))


def test_dr_grpo_resolves_its_defaults_and_uses_the_generation_budget(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path, algo="dr-grpo", max_new_tokens=8)
    assert cfg.resolved("agg") == "seq-mean-token-sum-norm" and cfg.resolved("adv_scale") == "none"
    assert _cfg(tiny_model_dir, tmp_path, algo="grpo").resolved("adv_scale") == "std"
    trainer = Trainer(cfg, log=None)
    assert trainer.updater.loss_config().norm_len == 8  # the constant, not the minibatch's padded width
    with pytest.raises(ValueError, match="known: .*dr-grpo"):
        _cfg(tiny_model_dir, tmp_path, algo="nope")


def test_top_p_below_one_is_refused_for_training(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nucleus"):
        _cfg(tiny_model_dir, tmp_path, top_p=0.9)


def test_a_policy_loss_registered_outside_the_package_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A REINFORCE loss and an algorithm registered here (no edit to learners/) train through the
    Trainer and through ``srpo train --algo``."""
    from typer.testing import CliRunner

    from learners.algorithms import ALGORITHMS, register_algorithm
    from learners.losses import POLICY_LOSSES, masked_sum, register_policy_loss
    from srpo_cli.app import app

    calls: list[int] = []

    @register_policy_loss("test-reinforce", unit="rows")
    def reinforce(logprobs, old_logprobs, mask, advantages, event_index, cfg):
        calls.append(int(logprobs.shape[0]))
        per_row = masked_sum(logprobs, mask, dim=-1)
        denom = cfg.denominator or float(logprobs.shape[0])
        return -(advantages.to(per_row.dtype) * per_row).sum() / denom, {"clip_frac": 0.0}

    register_algorithm("test-reinforce", estimator="rloo", loss="test-reinforce")
    try:
        trainer = Trainer(_cfg(tiny_model_dir, tmp_path / "a", algo="test-reinforce", lr=5e-3), log=None)
        batch = trainer.collector.collect([0, 1], group_size=2, seed=5)
        g0_wins(batch.rows)
        policy = trainer.policies["proposer"]
        prompts, responses = [r.prompt_ids for r in batch.rows], [r.response_ids for r in batch.rows]
        before = policy.compute_logprobs(prompts, responses)
        trainer.update(batch, iteration=1)
        after = policy.compute_logprobs(prompts, responses)
        gain = [sum(a) - sum(b) for a, b in zip(after, before, strict=True)]
        win = [g for g, r in zip(gain, batch.rows, strict=True) if r.outcome_reward == 1.0]
        lose = [g for g, r in zip(gain, batch.rows, strict=True) if r.outcome_reward == 0.0]
        assert calls and sum(win) / len(win) > sum(lose) / len(lose)

        calls.clear()
        args = [
            "train",
            "--algo",
            "test-reinforce",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "b"),
        ]
        args += ["--iterations", "1", "--tasks-per-iter", "2", "--group-size", "2", "--epochs", "1"]
        args += ["--max-new-tokens", "8", "--eval-every", "0", "--save-every", "0"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert calls
    finally:
        ALGORITHMS.pop("test-reinforce", None)
        POLICY_LOSSES.pop("test-reinforce", None)


def test_critic_chunks_by_the_token_budget_with_the_whole_minibatch_gradient(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """MAPPO's critic under ``max_tokens_per_microbatch``: values and the value-loss gradient over
    length-sorted chunks (backward each, weighted by its share of events) equal the one-forward ones
    (float64), and no chunk's padded size exceeds the budget, so the critic's memory is bounded too."""
    trainer = Trainer(
        _cfg(tiny_model_dir, tmp_path, algo="mappo", dtype="float64", critic_lr=0.0, group_size=3), log=None
    )
    assert trainer.critic is not None
    batch = trainer.collector.collect([0, 1], group_size=3, seed=3)
    table = build_event_table(batch.rows)
    mb = event_minibatches(table, shuffle=False)[0]

    def critic_grads() -> torch.Tensor:
        return torch.cat([p.grad.flatten() for p in trainer.critic.parameters() if p.grad is not None])

    trainer.reconfigure(max_tokens_per_microbatch=None)
    adv_big = trainer.updater.advantages(table)
    values_big = trainer.updater.event_values.clone()
    big = trainer.updater.critic_step(mb, table, adv_big)
    g_big = critic_grads().clone()

    texts = [table.event_row(e).state_text for e in mb.event_pos.tolist()]
    widths = [len(trainer.critic.fit(t)) for t in texts]
    budget = max(widths) * 2
    chunks = trainer.critic.token_chunks(texts, budget)
    assert len(chunks) >= 3 and sorted(i for c in chunks for i in c) == list(range(len(texts)))
    assert all(len(c) * max(widths[i] for i in c) <= budget for c in chunks)
    trainer.reconfigure(max_tokens_per_microbatch=budget)
    adv_small = trainer.updater.advantages(table)
    assert_close_scaled(trainer.updater.event_values, values_big, F64)
    small = trainer.updater.critic_step(mb, table, adv_small)
    g_small = critic_grads()

    assert g_big.abs().sum() > 0
    assert_close_scaled(g_small, g_big, F64)
    assert small["critic/value_loss"] == pytest.approx(big["critic/value_loss"], rel=1e-9, abs=1e-12)
