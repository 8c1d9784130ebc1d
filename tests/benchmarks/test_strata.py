"""Held-out results by hop (benchmarks.strata): labels from task meta, per-stratum accuracy and the
paired gain over the start model on each stratum alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from benchmarks.decide import START
from benchmarks.strata import problem_strata, strata_frame, strata_markdown, suite_strata, write_strata

ONE = [f"q{i}" for i in range(30)]
TWO = [f"r{i}" for i in range(20)]
STRATA = {**{("kb", p): "1-hop" for p in ONE}, **{("kb", p): "2-hop" for p in TWO}}


def _samples(p_one: float, p_two: float, seed: int, k: int = 4, tools_two: int = 3) -> pd.DataFrame:
    """k samples per problem, correct with probability p_one on one-hop and p_two on two-hop problems."""
    rng = np.random.default_rng(seed)
    rows = []
    for pid in ONE + TWO:
        p, tools = (p_one, 2) if pid in ONE else (p_two, tools_two)
        for g in range(k):
            rows.append(
                {
                    "dataset": "kb",
                    "problem_id": pid,
                    "sample_idx": g,
                    "correct": bool(rng.random() < p),
                    "team_tokens": 30,
                    "tool_calls": tools,
                    "ks": [2, 1],
                }
            )
    return pd.DataFrame(rows)


def test_problem_strata_read_the_hops_from_task_meta_and_nothing_else() -> None:
    tasks = [
        SimpleNamespace(id="a", meta={"hops": 1}),
        SimpleNamespace(id="b", meta={"hops": 2}),
        SimpleNamespace(id="c", meta={}),  # no hops: left out, never guessed
    ]
    assert problem_strata({"kb": tasks}) == {("kb", "a"): "1-hop", ("kb", "b"): "2-hop"}
    assert problem_strata({"columns": [SimpleNamespace(id="x", meta={"difficulty": 2})]}) == {}


def test_the_quick_search_suite_has_one_and_two_hop_questions_and_the_column_suites_none() -> None:
    strata = suite_strata("quick-search", 64)
    assert len(strata) == 64 and set(strata.values()) == {"1-hop", "2-hop"}
    assert suite_strata("quick-columns-routed", 4) == {}


def test_a_gain_on_one_hop_only_shows_on_one_hop_only() -> None:
    """Training that lifts one-hop EM by 30 points and leaves two-hop alone: the one-hop gain's interval
    excludes 0, the two-hop gain's does not, and the accuracies are the samples' means."""
    seeds = range(6)
    samples = {
        START: {s: _samples(0.2, 0.05, seed=100 + s) for s in seeds},
        "srpo": {s: _samples(0.5, 0.05, seed=200 + s, tools_two=4) for s in seeds},
    }
    frame = strata_frame(samples, STRATA).set_index(["method", "stratum"])
    one, two = frame.loc[("srpo", "1-hop")], frame.loc[("srpo", "2-hop")]
    assert one["problems"] == 30 and two["problems"] == 20 and one["seeds"] == 6
    expected = np.mean([samples["srpo"][s].iloc[: 30 * 4]["correct"].mean() for s in seeds])
    assert one["accuracy"] == pytest.approx(expected)
    assert one["gain_low"] > 0.15 and one["gain_verdict"] == "better"
    assert two["gain_low"] < 0 < two["gain_high"]
    assert one["gain"] == pytest.approx(one["accuracy"] - frame.loc[(START, "1-hop"), "accuracy"])
    assert two["tool_calls"] == 4 and frame.loc[(START, "2-hop"), "tool_calls"] == 3
    assert one["mean_k"] == 2
    assert np.isnan(frame.loc[(START, "1-hop"), "gain"])  # the baseline gains nothing over itself


def test_samples_without_a_stratum_are_left_out_and_no_strata_write_nothing(tmp_path) -> None:
    samples = {START: {0: _samples(0.2, 0.1, 0)}, "srpo": {0: _samples(0.3, 0.1, 1)}}
    only_two = {k: v for k, v in STRATA.items() if v == "2-hop"}
    frame = strata_frame(samples, only_two)
    assert list(frame["stratum"].unique()) == ["2-hop"]
    assert strata_frame(samples, {}).empty
    assert write_strata(pd.DataFrame(), tmp_path, "x") == {}
    paths = write_strata(frame, tmp_path, "quick-search")
    md = paths["by_hop_md"].read_text()
    assert "held-out results by hop" in md and "| srpo | 2-hop | 20 |" in md
    assert pd.read_csv(paths["by_hop_csv"]).shape[0] == 2
    assert strata_markdown(frame, "t").count("\n| ") == 2 + 1  # header + one row per method


def test_bench_report_writes_the_hop_table_of_saved_search_runs(tmp_path) -> None:  # noqa: ANN001
    """`srpo bench report` on saved quick-search evaluations: by_hop.md/.csv beside decisions.md."""
    import json

    from typer.testing import CliRunner

    from benchmarks.cli import app

    strata = suite_strata("quick-search", 64)
    for method, p_one in ((START, 0.2), ("srpo", 0.6)):
        for seed in range(2):
            rng = np.random.default_rng(seed)
            rows = [
                {
                    "dataset": "kb",
                    "problem_id": pid,
                    "sample_idx": g,
                    "correct": bool(rng.random() < (p_one if label == "1-hop" else 0.05)),
                    "team_tokens": 30,
                    "tool_calls": 2,
                    "ks": [2, 1],
                    "inputs": 2,
                    "inputs_truncated": 0,
                    # the start's runs stand for evaluations saved before the column existed
                    **({} if method == START else {"evidence_recall": 1.0 if label == "1-hop" else 0.5}),
                }
                for (_, pid), label in strata.items()
                for g in range(4)
            ]
            out = tmp_path / method.replace(" ", "_") / f"seed{seed}"
            out.mkdir(parents=True)
            pd.DataFrame(rows).to_parquet(out / "eval_samples.parquet")
            info = {"method": method, "config": {"seed": seed, "datasets": [{"name": "kb"}]}}
            summary = {
                "suite": "quick-search",
                "workflow": "parallel",
                "k": 4,
                "datasets": {},
                "run_info": info,
            }
            (out / "eval.json").write_text(json.dumps(summary))
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    by_hop = pd.read_csv(tmp_path / "rep" / "by_hop.csv")
    frame = by_hop.set_index(["method", "stratum"])
    assert frame.loc[("srpo", "1-hop"), "gain"] > 0.3 and abs(frame.loc[("srpo", "2-hop"), "gain"]) < 0.1
    # gold found: every gold passage of a one-hop question, half of a two-hop one's (so none fully)
    assert frame.loc[("srpo", "1-hop"), "evidence"] == 1.0 and frame.loc[("srpo", "2-hop"), "evidence"] == 0.0
    assert np.isnan(frame.loc[(START, "1-hop"), "evidence"])
    md = (tmp_path / "rep" / "by_hop.md").read_text()
    assert "gold found (%)" in md and "100.0 ± 0.0" in md
    assert "held-out results by hop" in res.output
    # the start model's directory sorts after srpo's, yet every table reads before -> after
    assert all(list(rows["method"]) == [START, "srpo"] for _, rows in by_hop.groupby("stratum"))
    paper = res.output[res.output.index("| method |") :]
    assert paper.index(f"| {START} |") < paper.index("| srpo |")
