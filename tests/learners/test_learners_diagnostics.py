"""Per-iteration rollout diagnostics: multi-member K, grading health, per-algorithm clip defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.rows import Row
from learners.batching import build_event_table
from learners.diagnostics import GradingMonitor, k_stats
from learners.trainer import TrainConfig, Trainer
from tests._builders import make_row


def _row(event: int, member: int, k: int, event_type: str) -> Row:
    return make_row(f"ep/{event}", member, k, prompt=(1,), response=(2,), event_type=event_type, step=event)


def test_k_stats_separate_multi_member_events_from_solo_ones() -> None:
    # a routed episode and a second round: route K=1, propose K=3, aggregate K=1, propose K=1, propose K=2
    events = [("route", 1), ("propose", 3), ("aggregate", 1), ("propose", 1), ("propose", 2)]
    rows = [_row(e, m, k, t) for e, (t, k) in enumerate(events) for m in range(k)]
    out = k_stats(build_event_table(rows))
    assert out["rollout/mean_k"] == pytest.approx(8 / 5)  # every event: diluted by the solo ones
    assert out["rollout/k_hist"] == {"1": 3, "2": 1, "3": 1}
    assert out["rollout/mean_k_multi"] == pytest.approx(2.5)  # only K > 1
    assert out["rollout/multi_k_frac"] == pytest.approx(2 / 5)
    assert out["rollout/mean_k_by_type/propose"] == pytest.approx(2.0)  # the router's K=1 choice counts
    assert out["rollout/mean_k_by_type/route"] == 1.0 and out["rollout/mean_k_by_type/aggregate"] == 1.0
    solo = k_stats(build_event_table([_row(0, 0, 1, "propose")]))
    assert "rollout/mean_k_multi" not in solo and solo["rollout/multi_k_frac"] == 0.0


class _FakeGrader:
    """Counters of srpo_envs.grading.grading_stats that a test moves by hand."""

    def __init__(self) -> None:
        self.counts = {"grading/answers": 0, "grading/timeouts": 0, "grading/worker_failures": 0}

    def __call__(self) -> dict[str, float]:
        return dict(self.counts)


def test_grading_monitor_reports_per_iteration_deltas_once_the_grader_works(monkeypatch) -> None:
    from srpo_envs import grading

    fake = _FakeGrader()
    fake.counts["grading/answers"] = 7  # graded before this run (another trainer in the process)
    monkeypatch.setattr(grading, "grading_stats", fake)
    monitor = GradingMonitor()
    assert monitor.delta() == {}  # nothing graded since: an env that never grades logs no grading/ keys
    fake.counts.update({"grading/answers": 12, "grading/worker_failures": 1})
    assert monitor.delta() == {"grading/answers": 5, "grading/timeouts": 0, "grading/worker_failures": 1}
    assert monitor.delta() == {"grading/answers": 0, "grading/timeouts": 0, "grading/worker_failures": 0}


def test_trainer_logs_grading_and_multi_member_k(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """One tiny iteration: the metrics row holds the grader's per-iteration counters (a grader that
    fails once while the iteration runs) and the multi-member K of the proposers-aggregator workflow."""
    from srpo_envs import grading

    fake = _FakeGrader()
    monkeypatch.setattr(grading, "grading_stats", fake)
    cfg = TrainConfig(
        model=str(tiny_model_dir), out_dir=str(tmp_path), env_id="ProcArith-v0",
        env_kwargs={"workflow": "proposers-aggregator"}, iterations=1, tasks_per_iter=1, group_size=2,
        epochs=1, max_new_tokens=4, eval_every=0, save_every=0,
    )  # fmt: skip
    trainer = Trainer(cfg, log=None)
    collect = trainer.collector.collect

    def grading_collect(*args, **kwargs):
        fake.counts["grading/answers"] += 4
        fake.counts["grading/worker_failures"] += 1
        return collect(*args, **kwargs)

    trainer.collector.collect = grading_collect
    (record,) = trainer.train()
    assert record["grading/answers"] == 4 and record["grading/worker_failures"] == 1
    assert record["grading/timeouts"] == 0
    assert record["rollout/mean_k_multi"] > 1 and 0 < record["rollout/multi_k_frac"] < 1
    assert record["rollout/mean_k_by_type/aggregate"] == 1.0
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["grading/worker_failures"] == 1


# --------------------------------------------------------------------------------------------------
# per-algorithm clip defaults
# --------------------------------------------------------------------------------------------------


def _loss_cfg(cfg: TrainConfig):
    from learners.update import loss_config

    return loss_config(cfg.update, cfg.rollout.max_new_tokens)


def test_gspo_uses_its_papers_clip_range_unless_the_user_sets_one(monkeypatch) -> None:
    from tests.learners.test_learners_cli import _captured_config

    gspo = _captured_config(monkeypatch, ["--algo", "gspo"])
    assert (gspo.clip_eps, gspo.clip_eps_high) == (None, None)
    assert (_loss_cfg(gspo).clip_eps, _loss_cfg(gspo).clip_eps_high) == (3e-4, 4e-4)
    explicit = _loss_cfg(_captured_config(monkeypatch, ["--algo", "gspo", "--clip-eps", "0.1"]))
    assert (explicit.clip_eps, explicit.clip_eps_high) == (0.1, None)  # upper side = clip_eps: the user's
    high = _loss_cfg(_captured_config(monkeypatch, ["--algo", "gspo", "--clip-eps-high", "5e-4"]))
    assert (high.clip_eps, high.clip_eps_high) == (3e-4, 5e-4)
    for algo in ("srpo", "grpo", "mappo"):  # everyone else keeps PPO's 0.2
        other = _loss_cfg(_captured_config(monkeypatch, ["--algo", algo]))
        assert (other.clip_eps, other.clip_eps_high) == (0.2, None)


def test_negative_clip_is_refused() -> None:
    with pytest.raises(ValueError, match="clip_eps"):
        TrainConfig(model="m", clip_eps=-0.1)
