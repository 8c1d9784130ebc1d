"""Issue 52 point 2: no silent collapse. The divergence guard (learners.guard) stops a run whose update
exploded with one line and exit 3, before the diverged weights are checkpointed or exported, and stays
silent on healthy runs of the shipped presets.

Before: ``srpo train ... --lr 1000`` exited 0 with held-out accuracy 0.578 -> 0.000, actor/approx_kl
8e12 and finite, exported weights (the only check counted non-finite steps).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from learners import checkpoint as ckpt
from learners import guard
from learners.trainer import TrainConfig
from srpo_cli.app import main

CHECKPOINTS = Path(__file__).resolve().parents[2] / "agents" / "checkpoints"
LIMITS = guard.GuardLimits.from_config(TrainConfig(model="m"))


def test_violations_name_each_metric_past_its_threshold() -> None:
    healthy = {"iteration": 3, "actor/approx_kl": 0.05, "actor/mean_abs_log_ratio": 0.2, "actor/loss": -0.5,
               "actor/grad_norm": 3.7}  # fmt: skip
    assert guard.violations(healthy, LIMITS) == []
    blown = {**healthy, "actor/approx_kl": 7.95e12, "actor/mean_abs_log_ratio": 997003.1, "actor/loss": -1e5}
    found = guard.violations(blown, LIMITS)
    assert [f.split()[0] for f in found] == ["actor/approx_kl", "actor/mean_abs_log_ratio", "actor/loss"]
    assert "actor/approx_kl 7.95e+12 > 1 (--guard-max-approx-kl)" in found[0]
    # a skipped (non-finite) step is the non-finite counter's business, not the guard's
    assert guard.violations({**healthy, "actor/grad_norm": math.nan}, LIMITS) == []
    # thresholds are options: inf turns one off
    off = guard.GuardLimits({**LIMITS.thresholds, "actor/approx_kl": math.inf}, LIMITS.eval_drop)
    assert [f.split()[0] for f in guard.violations(blown, off)] == ["actor/mean_abs_log_ratio", "actor/loss"]


def test_eval_collapse_counts_only_when_the_start_had_something_to_lose() -> None:
    record = {"iteration": 2, "eval_accuracy": 0.0}
    found = guard.violations(record, LIMITS, start=0.578, eval_samples=64)
    assert found == ["held-out accuracy 0.578 -> 0.000, down more than 50% (--guard-eval-drop)"]
    # the MAPPO collapse at its first evaluation (0.578 -> 0.141 on 64 samples: z = 5.1)
    assert guard.violations({"iteration": 1, "eval_accuracy": 0.141}, LIMITS, start=0.578, eval_samples=64)
    assert guard.violations({"iteration": 2, "eval_accuracy": 0.3}, LIMITS, start=0.578, eval_samples=64) == []
    # below half the start but within noise on few samples (0.625 -> 0.15 on 16 samples: z = 2.8): not a collapse
    assert guard.violations({"iteration": 2, "eval_accuracy": 0.15}, LIMITS, start=0.625, eval_samples=16) == []
    # 3 of 64 solved at the start: 0 later is within sampling noise, not a collapse
    assert guard.violations(record, LIMITS, start=3 / 64, eval_samples=64) == []
    assert guard.start_accuracy([{"iteration": 0, "eval_accuracy": 0.5}, {"iteration": 1}]) == 0.5
    assert guard.start_accuracy([{"iteration": 1, "eval_accuracy": 0.5}]) is None


def test_thresholds_are_validated_options() -> None:
    with pytest.raises(ValueError, match="guard_max_loss must be > 0"):
        TrainConfig(model="m", guard_max_loss=0.0)
    with pytest.raises(ValueError, match="guard_eval_drop must be in"):
        TrainConfig(model="m", guard_eval_drop=1.5)
    assert TrainConfig(model="m", guard_max_approx_kl=math.inf).guard_max_approx_kl == math.inf


@pytest.mark.slow
def test_lr_1000_stops_with_exit_3_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's command (plus a checkpoint every iteration and a smaller held-out set, for time)."""
    run = tmp_path / "run"
    args = [
        "train", "--algo", "srpo", "--model", str(CHECKPOINTS / "mini-columns-sft"), "--env-kwarg",
        "dataset=procedural-columns", "--iterations", "2", "--tasks-per-iter", "2", "--group-size", "2",
        "--lr", "1000", "--out", str(run), "--save-every", "1", "--eval-problems", "16",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(args)
    _, err = capsys.readouterr()
    assert info.value.code == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: training diverged at iteration 2: actor/approx_kl "), last
    assert "(--guard-max-approx-kl)" in last and "stopped before checkpointing or exporting" in last
    assert "the last checkpoint" in last and "Traceback" not in err
    assert not (run / "final").exists()  # nothing exported
    assert ckpt.load_checkpoint(run)["iteration"] == 1  # the last good checkpoint, not overwritten
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # the diverged iteration is logged for diagnosis
    assert rows[2]["actor/approx_kl"] > LIMITS.thresholds["actor/approx_kl"]


@pytest.mark.slow
def test_a_healthy_preset_run_stays_far_inside_the_guard(tmp_path: Path) -> None:
    """quick-columns-routed SRPO as ``bench quick`` trains it (two iterations): the guard does not trip,
    and every guarded metric stays below a tenth of its default threshold (the margin
    ``python -m benchmarks.perf.guard_margins`` prints for every preset)."""
    from benchmarks import presets
    from learners.trainer import train

    env = presets.TRAINING_ENVS["quick-columns-routed"]
    settings = {**presets.QUICK_SETTINGS["quick-columns-routed"]["train"], "iterations": 2}
    cfg = TrainConfig(
        model=str(env.bundled_model), out_dir=str(tmp_path / "run"), env_id=env.env_id,
        env_kwargs={"workflow": env.workflow, **env.env_kwargs}, eval_every=0, save_every=0, **settings,
    )  # fmt: skip
    history = train(cfg, log=None)
    assert len(history) == 2 and (tmp_path / "run" / "final").exists()
    for record in history:
        for key, limit in LIMITS.thresholds.items():
            assert abs(record[key]) < limit / 10, (key, record[key], limit)
