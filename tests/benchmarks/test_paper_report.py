"""Paper-layout tables: ± over seeds and bootstrap CIs from per-sample records; bench eval/report CLI."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from benchmarks.paper import MACRO, EvalRun, load_runs, paper_tables


def _run(method: str, seed: int, correct: dict[str, list[list[bool]]], ks: int = 3) -> EvalRun:
    rows = []
    for ds, problems in correct.items():
        for p, samples in enumerate(problems):
            for g, c in enumerate(samples):
                rows.append(
                    {
                        "dataset": ds,
                        "problem_id": f"{ds}-{p}",
                        "sample_idx": g,
                        "correct": c,
                        "team_tokens": 10,
                        "tool_calls": 0,
                        "ks": [ks, 1],
                        "inputs": ks,
                        "inputs_truncated": 1,
                    }
                )
    return EvalRun(method, seed, "quick-math", "proposers-aggregator", 2, list(correct), pd.DataFrame(rows))


def test_seed_std_bootstrap_ci_and_macro_are_what_they_say() -> None:
    a0 = _run("A", 0, {"d1": [[True, True], [False, False]], "d2": [[True, False], [True, True]]})
    a1 = _run("A", 1, {"d1": [[True, False], [False, False]], "d2": [[True, True], [True, True]]})
    b0 = _run("B", 0, {"d1": [[False, False], [False, False]], "d2": [[True, True], [True, True]]})
    b1 = _run("B", 1, {"d1": [[True, True], [True, True]], "d2": [[False, False], [False, False]]})
    pt = paper_tables([a0, a1, b0, b1], percent=False)
    long = pt.long.set_index(["method", "metric", "benchmark"])
    # A, avg@2: d1 per seed 0.5 / 0.25, d2 per seed 0.75 / 1.0 -> macro per seed 0.625 / 0.625
    d1 = long.loc[("A", "Avg@2", "d1")]
    assert d1["mean"] == pytest.approx(0.375) and d1["std"] == pytest.approx(np.std([0.5, 0.25], ddof=1))
    macro = long.loc[("A", "Avg@2", MACRO)]
    assert macro["mean"] == pytest.approx(0.625) and macro["std"] == pytest.approx(0.0)
    assert macro["n_seeds"] == 2
    # B: seed macros 0.5 / 0.5 but each benchmark flips: std per benchmark is large, the CI is wide
    b_d1 = long.loc[("B", "Avg@2", "d1")]
    assert b_d1["std"] == pytest.approx(np.std([0.0, 1.0], ddof=1))
    assert b_d1["ci_low"] <= b_d1["mean"] <= b_d1["ci_high"]
    # pass@2 (unbiased): A seed 0 d1: problems 1.0, 0.0
    assert long.loc[("A", "Pass@2", "d1")]["mean"] == pytest.approx((0.5 + 0.5) / 2)
    table = pt.tables["Avg@2"]
    assert list(table.columns) == ["method", "d1", "d2", MACRO] and list(table["method"]) == ["A", "B"]
    assert table.loc[0, MACRO].startswith("0.625 ± 0.000 [")
    assert pt.cost.loc[0, "mean K"] == "3.00 ± 0.00" and pt.cost.loc[0, "trunc rate"].startswith("0.333")


def test_mixed_suites_or_duplicate_seeds_are_refused() -> None:
    a = _run("A", 0, {"d1": [[True, False]]})
    with pytest.raises(ValueError, match="two runs"):
        paper_tables([a, a])
    other = _run("A", 1, {"d2": [[True, False]]})
    with pytest.raises(ValueError, match="evaluated"):
        paper_tables([a, other])


def _fake_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.benchmarks.test_benchmarks_evaluate import ArithPolicy

    monkeypatch.setitem(
        sys.modules, "agents.hf", types.SimpleNamespace(HFPolicy=lambda path, device=None: ArithPolicy(p=0.6))
    )


def test_bench_eval_seeds_then_report_reproduces_the_table(tmp_path: Path, monkeypatch) -> None:
    from benchmarks.cli import app

    _fake_hf(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "out"
    args = ["eval", "--model", str(model), "--suite", "quick-math", "--k", "2", "--limit", "4"]
    res = CliRunner().invoke(
        app, [*args, "--seeds", "0,1", "--out", str(out), "--no-progress", "--method", "M"]
    )
    assert res.exit_code == 0, res.output
    assert (out / "seed0" / "eval.json").is_file() and (out / "seed1" / "eval.json").is_file()
    first = (out / "paper.csv").read_text()
    assert "| M | " in res.output and "Avg." in res.output and "arith-d2" in res.output
    rep = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    assert (tmp_path / "rep" / "paper.csv").read_text() == first
    assert (tmp_path / "rep" / "paper.png").stat().st_size > 0
    runs = load_runs([out])
    assert sorted(r.seed for r in runs) == [0, 1] and runs[0].datasets == ["arith-d1", "arith-d2"]
    # seeds run at different times, merged by linking their eval directories into one tree; a seed
    # linked twice counts once and a link back up the tree does not loop
    merged = tmp_path / "merged" / "M"
    merged.mkdir(parents=True)
    for seed in (0, 1):
        (merged / f"seed{seed}").symlink_to(out / f"seed{seed}", target_is_directory=True)
    (merged / "again").symlink_to(out / "seed1", target_is_directory=True)
    (merged / "up").symlink_to(tmp_path / "merged", target_is_directory=True)
    assert sorted(r.seed for r in load_runs([tmp_path / "merged"])) == [0, 1]
    long = pd.read_csv(tmp_path / "rep" / "paper.csv")
    assert set(long["benchmark"]) == {"arith-d1", "arith-d2", MACRO} and (long["n_seeds"] == 2).all()


def test_bench_eval_model_hub_id_offline_says_not_cached(monkeypatch, tmp_path: Path) -> None:
    from benchmarks.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = CliRunner().invoke(
        app, ["eval", "--model", "no-such-owner/no-such-model-srpo", "--out", str(tmp_path)]
    )
    assert res.exit_code != 0
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", res.output).split())  # unwrap rich's error box
    assert "not in the local Hugging Face cache" in text and "is not a directory" not in text
    assert "hf download no-such-owner/no-such-model-srpo" in text


def test_paper_k_defaults() -> None:
    from benchmarks.compare_cli import suite_eval_k
    from benchmarks.suites import SUITES

    assert SUITES["math"].default_k == 16 and SUITES["math-routed"].default_k == 16
    assert suite_eval_k("math", None) == 16 and suite_eval_k("quick-columns", None) == 2 and suite_eval_k("math", 4) == 4
