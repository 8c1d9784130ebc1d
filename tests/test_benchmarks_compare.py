"""The training comparison runner end to end on a tiny model (one iteration per variant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.compare import ABLATIONS, CompareConfig, run_comparison
from leaderboards.schema import validate_record


@pytest.mark.slow
def test_comparison_writes_tables_curves_records(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = CompareConfig(
        model=str(tiny_model_dir),
        out_dir=str(tmp_path),
        variants={"srpo-k1": ABLATIONS["srpo-k1"], "grpo": {"algo": "grpo"}},
        seeds=(0, 1),
        train={"iterations": 2, "tasks_per_iter": 2, "group_size": 2, "epochs": 1},
        eval_k=2,
        eval_limit=4,
        max_new_tokens=8,
    )
    result = run_comparison(cfg, log=None)
    assert list(result.table["variant"]) == ["start (SFT)", "srpo-k1", "grpo"]
    assert len(result.runs) == 4 and set(result.runs["seed"]) == {0, 1}
    assert (result.runs["after"] - result.runs["before"] == result.runs["delta"]).all()
    assert set(result.curves["iteration"]) == {1, 2}
    for name in ("results.json", "leaderboard.md", "leaderboard.html", "curves.png", "comparison.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    records = json.loads((tmp_path / "results.json").read_text())
    assert len(records) == 3
    for rec in records:
        validate_record(rec)
        assert rec["seeds"] == [0, 1] and rec["suite"] == "quick-math"
    assert "srpo-k1" in (tmp_path / "leaderboard.md").read_text()
