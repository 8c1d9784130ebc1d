"""Trainer wiring: every algorithm moves the policy towards higher-advantage outputs; resume is exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from learners.checkpoint import checkpoint_iteration, load_checkpoint
from learners.trainer import TrainConfig, Trainer, train


def _cfg(model: Path, out: Path, **kw) -> TrainConfig:
    base = dict(
        model=str(model),
        out_dir=str(out),
        iterations=2,
        tasks_per_iter=2,
        group_size=2,
        epochs=1,
        max_new_tokens=8,
        eval_problems=4,
        eval_every=1,
        save_every=1,
        lr=5e-3,
    )
    base.update(kw)
    return TrainConfig(**base)


def _reward_first_sample(batch) -> None:
    """Make sample g0 of every task the winner, so every algorithm has a non-zero signal.

    The outcome changes; each event keeps its own penalty, and its reward stays ``outcome - penalty``
    (the one reward definition every algorithm reads)."""
    for r in batch.rows:
        r.outcome_reward = 1.0 if r.episode_id.endswith("-g0") else 0.0
        r.reward = r.outcome_reward - r.penalty


@pytest.mark.parametrize("algo", ["srpo", "grpo", "dr-grpo", "gspo", "dr-mas", "at-grpo", "rloo", "mappo"])
def test_update_raises_logprob_of_rewarded_outputs(algo: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path, algo=algo), log=None)
    batch = trainer.collector.collect([0, 1, 2], group_size=2, seed=5)
    _reward_first_sample(batch)
    policy = trainer.policies["proposer"]
    before = policy.compute_logprobs([r.prompt_ids for r in batch.rows], [r.response_ids for r in batch.rows])
    stats = trainer.update(batch, iteration=1)
    after = policy.compute_logprobs([r.prompt_ids for r in batch.rows], [r.response_ids for r in batch.rows])
    gain = [sum(a) - sum(b) for a, b in zip(after, before, strict=True)]
    win = [g for g, r in zip(gain, batch.rows, strict=True) if r.episode_id.endswith("-g0")]
    lose = [g for g, r in zip(gain, batch.rows, strict=True) if not r.episode_id.endswith("-g0")]
    assert sum(win) / len(win) > sum(lose) / len(lose)
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values() if not isinstance(v, dict))
    assert policy.policy_version == 1
    assert stats["rollout/mean_k"] > 1.0  # proposers-aggregator: propose events have K=3


@pytest.mark.parametrize("sharing", ["per-role", "lora"])
def test_sharing_modes_train(sharing: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path, sharing=sharing), log=None)
    batch = trainer.collector.collect([0, 1], group_size=2, seed=1)
    _reward_first_sample(batch)
    snapshot = {k: v.clone() for k, v in trainer.policies["aggregator"].model.state_dict().items()}
    trainer.update(batch, iteration=1)
    changed = any(
        not torch.equal(v, trainer.policies["aggregator"].model.state_dict()[k]) for k, v in snapshot.items()
    )
    assert changed
    if sharing == "per-role":
        assert trainer.policies["proposer"].model is not trainer.policies["aggregator"].model
    else:
        assert trainer.policies["proposer"].model is trainer.policies["aggregator"].model


def test_train_loop_logs_and_exports(tiny_model_dir: Path, tmp_path: Path) -> None:
    history = train(_cfg(tiny_model_dir, tmp_path, algo="srpo", norm="k1"), log=None)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [0, 1, 2] == [h["iteration"] for h in history]
    for key in (
        "actor/loss",
        "actor/grad_norm",
        "actor/clip_frac",
        "actor/approx_kl",
        "actor/mean_abs_log_ratio",
        "actor/zero_adv_frac",
        "actor/singleton_group_frac",
        "rollout/mean_k",
        "rollout/max_k",
        "rollout/k_hist",
        "rollout/events_dropped",
        "mean_response_len",
        "reward_mean",
        "reward_std",
        "eval_accuracy",
    ):
        assert key in lines[-1], key
    # k1 ablation: the rollout's events keep their K (propose events have K=3); the loss treats each
    # member as its own event
    assert lines[-1]["rollout/max_k"] == 3.0
    assert sum(int(k) * n for k, n in lines[-1]["rollout/k_hist"].items()) == lines[-1]["rows"]
    assert (tmp_path / "final" / "config.json").exists() and (tmp_path / "checkpoint" / "manifest.json").exists()


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = [
        "--model",
        str(tiny_model_dir),
        "--iterations",
        "4",
        "--tasks-per-iter",
        "2",
        "--group-size",
        "2",
        "--epochs",
        "1",
        "--max-new-tokens",
        "8",
        "--eval-problems",
        "4",
        "--eval-every",
        "2",
        "--save-every",
        "1",
        "--lr",
        "5e-3",
        "--seed",
        "3",
    ]
    cmd = [sys.executable, "-m", "srpo_cli", "train", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full = tmp_path / "full"
    subprocess.run([*cmd, "--out", str(full)], check=True, env=env, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*cmd, "--out", str(killed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (checkpoint_iteration(killed) or 0) >= 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (checkpoint_iteration(killed) or 0) < 4
    subprocess.run([*cmd, "--out", str(killed), "--resume"], check=True, env=env, capture_output=True)

    def final(path: Path) -> dict:
        return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()][-1]

    def iterations(path: Path) -> list[int]:
        return [json.loads(x)["iteration"] for x in (path / "metrics.jsonl").read_text().splitlines()]

    assert iterations(killed) == iterations(full) == [0, 1, 2, 3, 4]  # no row logged twice
    a, b = final(full), final(killed)
    for key in ("rollout_s", "update_s"):
        a.pop(key), b.pop(key)
    assert a == b
    wa = load_checkpoint(full)["models"]
    wb = load_checkpoint(killed)["models"]
    assert all(torch.equal(wa["model0"][k], wb["model0"][k]) for k in wa["model0"])


@pytest.mark.slow
def test_trainer_runs_on_the_search_env(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same trainer drives the multi-turn retrieval env (searcher events K=2, aggregator K=1)."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        algo="srpo",
        env_id="MultiTurnSearch-v0",
        iterations=1,
        env_kwargs={"max_turns": 1},
        eval_env_kwargs={"split": "test", "dataset_size": 4},
    )
    trainer = Trainer(cfg, log=None)
    batch = trainer.collector.collect([0, 1], group_size=2, seed=0)
    assert {r.event_type for r in batch.rows} == {"search", "aggregate"}
    assert {r.k for r in batch.rows if r.event_type == "search"} == {2}
    _reward_first_sample(batch)
    stats = trainer.update(batch, iteration=1)
    assert stats["rollout/max_k"] == 2.0 and torch.isfinite(torch.tensor(stats["actor/loss"]))


# ------------------------------------------------------------------ the public update and continuation API
def _forward_calls(trainer: Trainer) -> list[int]:
    """Wrap ``trainer.forward.policy_logprobs``: one entry (rows forwarded) per training forward call."""
    calls: list[int] = []
    real = trainer.forward.policy_logprobs

    def counted(rows, batch, extras=True):  # noqa: ANN001, ANN202
        calls.append(len(rows))
        return real(rows, batch, extras)

    trainer.forward.policy_logprobs = counted  # type: ignore[method-assign]
    return calls


def test_parts_follow_the_config_after_reconfigure_or_an_assigned_field(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The parts hold their config sections (not the config): ``reconfigure`` hands them the new ones, and
    a field assigned on ``trainer.cfg`` reaches them at the next ``update`` (a stale section would keep
    training in one micro-batch: 1 forward call instead of several)."""
    from tests._builders import g0_wins, update_check_config, update_inputs

    trainer = Trainer(update_check_config(tiny_model_dir, tmp_path, algo="grpo", forward_rows=64), log=None)
    table, adv, mb, loss_fn, unit = update_inputs(trainer)
    calls = _forward_calls(trainer)
    trainer.updater.minibatch_step(mb, table, adv, loss_fn, unit)
    assert len(calls) == 1  # no token budget: the minibatch is one micro-batch
    budget = max(sum(len(r.prompt_ids) + len(r.response_ids) for r in mb.rows) // 4, 1)
    trainer.reconfigure(max_tokens_per_microbatch=budget)
    assert trainer.forward.update.max_tokens_per_microbatch == budget == trainer.updater.section.max_tokens_per_microbatch
    calls.clear()
    trainer.updater.minibatch_step(mb, table, adv, loss_fn, unit)
    assert len(calls) >= 3 and sum(calls) == mb.num_rows
    with pytest.raises(ValueError):  # re-validated like a new config
        trainer.reconfigure(epochs=0)
    # an assigned field: picked up by the public update (which the loop calls)
    trainer.reconfigure(max_tokens_per_microbatch=None)
    trainer.cfg.max_tokens_per_microbatch = budget
    batch = trainer.collector.collect([0, 1], group_size=2, seed=3)
    g0_wins(batch.rows)
    calls.clear()
    trainer.update(batch, iteration=1)
    assert len(calls) >= 3 and trainer.iteration == 1


def test_start_from_resumes_and_continue_from_adopts_a_runs_curve(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``Trainer(cfg, start_from=RUN)`` is ``load_checkpoint`` of RUN (its iteration, weights, metrics cut to
    it); ``continue_from(RUN, n)`` starts a fresh run directory whose curve is RUN's first n rows and whose
    next iteration is n + 1; ``start_fresh`` removes a previous checkpoint and metrics file."""
    from tests._builders import checkpoint_run_config

    run = tmp_path / "run"
    train(checkpoint_run_config(tiny_model_dir, run, iterations=2), log=None)
    resumed = Trainer(checkpoint_run_config(tiny_model_dir, run, iterations=3), log=None, start_from=run)
    assert resumed.iteration == 2
    state = load_checkpoint(run)
    for name, p in resumed.distinct_models()[0].model.state_dict().items():
        assert torch.equal(p, state["models"]["model0"][name]), name
    again = tmp_path / "again"
    cont = Trainer(checkpoint_run_config(run / "final", again, iterations=3), log=None)
    cont.continue_from(run, 1)
    assert cont.iteration == 1
    rows = [json.loads(x) for x in cont.metrics_path.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1]
    history = cont.train()
    assert [h["iteration"] for h in history] == [1, 2, 3]
    with pytest.raises(ValueError, match="outside 0..3"):
        cont.continue_from(run, 4)
    assert checkpoint_iteration(again) == 3
    cont.start_fresh()
    assert checkpoint_iteration(again) is None and not cont.metrics_path.exists() and cont.iteration == 0
