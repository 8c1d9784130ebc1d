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
    # issue 27: every variant decided against the reference (the first here: neither srpo nor sqrt ran)
    # then each variant against the start model: what training gained, paired by eval seed and problem
    assert list(result.decisions["variant"]) == ["grpo", "srpo-k1", "grpo"]
    assert list(result.decisions["reference"]) == ["srpo-k1", "start (SFT)", "start (SFT)"]
    assert set(result.decisions["verdict"]) <= {"better", "worse", "equivalent", "undecided"}
    gain = result.decisions.iloc[1]
    srpo_k1 = result.runs[result.runs["variant"] == "srpo-k1"]
    assert gain["delta"] == pytest.approx(float(srpo_k1["after"].mean() - srpo_k1["before"].mean()))
    for name in ("decisions.csv", "decisions.md", "decisions.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    page_rows = json.loads((tmp_path / "decisions.json").read_text())["quick-math"]
    assert page_rows[0]["variant"] == "grpo"
    # issue 52: each row names its records, so the page ranks them by the paired decision
    by_name = {rec["name"].rsplit(" (", 1)[0]: rec["record_hash"] for rec in records}
    assert [(r["variant_record"], r["reference_record"]) for r in page_rows] == [
        (by_name["grpo"], by_name["srpo-k1"]), (by_name["srpo-k1"], by_name["start"]), (by_name["grpo"], by_name["start"])
    ]  # fmt: skip
    assert 'data-decisions="quick-math"' in (tmp_path / "leaderboard.html").read_text()


@pytest.mark.slow
def test_bench_quick_runs_every_suite_and_merges_outputs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`srpo bench quick` wiring: columns, routed columns and search suites, each from its own warm start,
    one leaderboard."""
    from typer.testing import CliRunner

    from agents.corpus import search_corpus
    from agents.tiny import init_tiny
    from benchmarks.cli import QUICK_SETTINGS, app

    search_model = tmp_path / "search-model"
    init_tiny(search_model, size="tiny", seed=0, corpus=search_corpus(300), vocab_size=1024)
    out = tmp_path / "quick"
    small = {"tasks_per_iter": 2, "group_size": 2}
    saved = {name: dict(s["train"]) for name, s in QUICK_SETTINGS.items()}
    try:
        for s in QUICK_SETTINGS.values():
            s["train"].update(small)
        args = [
            "quick",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--search-model",
            str(search_model),
            "--columns-model",
            str(tiny_model_dir),
            "--suites",  # the default two column suites plus search, whose wiring this also checks
            "quick-columns,quick-columns-routed,quick-search",
        ]
        result = CliRunner().invoke(
            app, [*args, "--seeds", "0", "--iterations", "1", "--eval-limit", "2", "--workers", "0"]
        )
    finally:
        for name, train in saved.items():
            QUICK_SETTINGS[name]["train"] = train
    assert result.exit_code == 0, result.output
    records = json.loads((out / "results.json").read_text())
    assert sorted({r["suite"] for r in records}) == ["quick-columns", "quick-columns-routed", "quick-search"]
    assert len(records) == 12  # start + 3 algorithms, per suite
    for rec in records:
        validate_record(rec)
    html = (out / "leaderboard.html").read_text()
    assert all(s in html for s in ("quick-columns", "quick-columns-routed", "quick-search"))
    md = (out / "comparison.md").read_text()
    assert all(f"## {s}" in md for s in ("quick-columns", "quick-columns-routed", "quick-search"))
    assert (out / "curves.png").stat().st_size > 0
    search_run = json.loads((out / "quick-search" / "compare_config.json").read_text())
    assert search_run["env_id"] == "MultiTurnSearch-v0" and search_run["workflow"] == "parallel"
    # the search suite's held-out results by hop (its first two questions are one-hop); none for columns
    assert "| srpo | 1-hop | 2 |" in (out / "quick-search" / "by_hop.md").read_text()
    assert not (out / "quick-columns" / "by_hop.md").exists()


@pytest.mark.slow
def test_ray_workers_give_the_same_comparison_as_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``workers=2`` runs the (variant, seed) jobs as Ray tasks: same accuracies, curves and records
    as running them here one after another with the workers' torch thread count."""
    import os

    import torch

    from agents.ray_rollout import shutdown_ray

    def config(out: Path, workers: int) -> CompareConfig:
        return CompareConfig(
            model=str(tiny_model_dir),
            out_dir=str(out),
            variants={"srpo": {"algo": "srpo"}, "grpo": {"algo": "grpo"}},
            seeds=(0, 1),
            train={"iterations": 1, "tasks_per_iter": 2, "group_size": 2, "epochs": 2},
            eval_k=2,
            eval_limit=3,
            max_new_tokens=8,
            workers=workers,
        )

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))  # what each of 2 workers gets
    try:
        here = run_comparison(config(tmp_path / "here", 0), log=None)
    finally:
        torch.set_num_threads(threads)
    lines: list[str] = []
    try:
        ray = run_comparison(config(tmp_path / "ray", 2), log=lines.append)
    finally:
        shutdown_ray()
    assert any("4 runs on 2 Ray workers" in line for line in lines)
    cols = ["variant", "seed", "before", "after", "delta", "clip_frac", "approx_kl"]
    assert here.runs[cols].equals(ray.runs[cols])
    assert here.curves.equals(ray.curves)
    assert [r.metrics for r in here.records] == [r.metrics for r in ray.records]


def _one_srpo_run(
    model: Path, out: Path, iterations: int, *, keep_checkpoints: bool = False, **train: object
) -> CompareConfig:
    """One SRPO run (seed 0) of ``iterations`` on the tiny model, 2 tasks x G=2, evaluated on 3 x 2."""
    return CompareConfig(
        model=str(model),
        out_dir=str(out),
        variants={"srpo": {"algo": "srpo"}},
        seeds=(0,),
        train={"iterations": iterations, "tasks_per_iter": 2, "group_size": 2, **train},
        eval_k=2,
        eval_limit=3,
        max_new_tokens=8,
        keep_checkpoints=keep_checkpoints,
    )


def test_kept_checkpoints_let_a_rerun_with_more_iterations_continue_each_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``keep_checkpoints``: 1 iteration, then the same comparison at 2 iterations continues the run
    (its curve and evaluation equal a 2-iteration run's); other settings are refused, not resumed."""
    from dataclasses import replace

    from benchmarks.compare import train_and_evaluate
    from learners.checkpoint import CheckpointConfigError, find_checkpoint

    def config(out: Path, iterations: int, **train: object) -> CompareConfig:
        return _one_srpo_run(tiny_model_dir, out, iterations, keep_checkpoints=True, **{"lr": 5e-3, **train})

    whole = train_and_evaluate(replace(config(tmp_path / "whole", 2), keep_checkpoints=False), "srpo", {}, 0)
    first = train_and_evaluate(config(tmp_path / "kept", 1), "srpo", {}, 0)
    assert find_checkpoint(tmp_path / "kept" / "runs" / "srpo-s0") is not None
    assert [c["iteration"] for c in first.curves] == [1]
    longer = train_and_evaluate(config(tmp_path / "kept", 2), "srpo", {}, 0)
    assert longer.curves == whole.curves and [c["iteration"] for c in longer.curves] == [1, 2]
    assert longer.run["after"] == whole.run["after"]
    assert longer.result.samples.equals(whole.result.samples)
    assert not (tmp_path / "whole" / "runs" / "srpo-s0" / "checkpoint").exists()
    with pytest.raises(CheckpointConfigError, match=r"differs in \['lr'\]"):
        train_and_evaluate(config(tmp_path / "kept", 3, lr=1e-3), "srpo", {}, 0)


def test_a_comparison_continued_from_a_finished_one_trains_the_iterations_after_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``continue_from``: each run starts from the source run's export at its last iteration and draws
    the next iterations' tasks and seeds. With lr 0 the weights never move, so the continuation's
    iteration 2 must equal a 2-iteration run's (restarting the counter would replay iteration 1's
    tasks); its curve starts with the source's rows. Other settings, too few iterations, a missing run
    and writing over the source are refused before anything trains."""
    from dataclasses import asdict, replace

    from benchmarks.compare import continuation_of, train_and_evaluate

    def config(out: Path, iterations: int, **train: object) -> CompareConfig:
        return _one_srpo_run(tiny_model_dir, out, iterations, **{"lr": 0.0, **train})

    drop = ("rollout_s", "update_s")

    def rows(out: Path) -> list[dict]:
        lines = (out / "runs" / "srpo-s0" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k not in drop} for x in lines]

    whole_run = train_and_evaluate(config(tmp_path / "whole", 2), "srpo", {}, 0)
    first = train_and_evaluate(config(tmp_path / "first", 1), "srpo", {}, 0)
    # what run_comparison writes at its end
    (tmp_path / "first" / "compare_config.json").write_text(
        json.dumps(asdict(config(tmp_path / "first", 1)), default=str)
    )
    source_metrics = tmp_path / "first" / "runs" / "srpo-s0" / "metrics.jsonl"
    marked = {**json.loads(source_metrics.read_text().splitlines()[0]), "source": "first"}
    source_metrics.write_text(json.dumps(marked) + "\n")  # its row 1 is copied, not trained again
    go_on = replace(config(tmp_path / "more", 2), continue_from=str(tmp_path / "first"))
    assert continuation_of(go_on, "srpo", 0) == (1, tmp_path / "first" / "runs" / "srpo-s0")
    more = train_and_evaluate(go_on, "srpo", {}, 0)
    assert [c["iteration"] for c in more.curves] == [1, 2] and more.curves[0] == first.curves[0]
    assert more.run["after"] == whole_run.run["after"]  # lr 0: the same weights evaluated
    whole = rows(tmp_path / "whole")
    assert whole[0] != {**whole[1], "iteration": 1}  # iteration 2 is not a replay of iteration 1
    assert rows(tmp_path / "more") == [{**whole[0], "source": "first"}, whole[1]]
    with pytest.raises(ValueError, match=r"differs in \['train.lr'\]"):
        continuation_of(replace(go_on, train={**go_on.train, "lr": 1e-3}), "srpo", 0)
    with pytest.raises(ValueError, match=r"ran 1 iterations: continue it with --iterations > 1"):
        continuation_of(replace(go_on, train={**go_on.train, "iterations": 1}), "srpo", 0)
    with pytest.raises(ValueError, match=r"no exported run of srpo seed 5"):
        continuation_of(go_on, "srpo", 5)
    with pytest.raises(ValueError, match=r"is also the output directory"):
        continuation_of(replace(go_on, out_dir=str(tmp_path / "first")), "srpo", 0)
