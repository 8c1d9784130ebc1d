"""Off-policy diagnostics of ``bench compare``: per-run averages from metrics.jsonl and the K-over-training plot."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from benchmarks.compare import k_counts_of, run_diagnostics
from benchmarks.report import plot_k_over_training

METRICS = [
    {
        "iteration": 1,
        "actor/clip_frac": 0.1,
        "actor/mean_abs_log_ratio": 0.02,
        "actor/approx_kl": 1e-4,
        "rollout/mean_k": 1.5,
        "rollout/k_hist": {"1": 2, "2": 2},
    },
    {
        "iteration": 2,
        "actor/clip_frac": 0.3,
        "actor/mean_abs_log_ratio": 0.04,
        "actor/approx_kl": 3e-4,
        "rollout/mean_k": 2.5,
        "rollout/k_hist": {"2": 2, "3": 2},
    },
]


def test_run_diagnostics_average_over_iterations() -> None:
    d = run_diagnostics(METRICS)
    assert d["clip_frac"] == pytest.approx(0.2)
    assert d["mean_abs_log_ratio"] == pytest.approx(0.03)
    assert d["approx_kl"] == pytest.approx(2e-4)
    assert d["mean_k"] == pytest.approx(2.0)
    assert math.isnan(run_diagnostics([{"iteration": 1}])["clip_frac"])  # never logged: NaN, not 0


def test_run_diagnostics_report_the_k_of_member_rounds_not_of_every_event() -> None:
    """A proposers->aggregator batch has K=3 proposer rounds and K=1 aggregations: the table's K is
    the proposer rounds' (3), not the mean over every event (2)."""
    metrics = [{"iteration": 1, "rollout/mean_k": 2.0, "rollout/mean_k_by_type/propose": 3.0}]
    assert run_diagnostics(metrics)["mean_k"] == pytest.approx(3.0)
    search = [{"iteration": 1, "rollout/mean_k": 1.5, "rollout/mean_k_by_type/search": 2.0}]
    assert run_diagnostics(search)["mean_k"] == pytest.approx(2.0)


def test_k_over_training_plot(tmp_path) -> None:  # noqa: ANN001
    rows = [{"variant": v, "seed": 0, **r} for v in ("a", "b") for r in k_counts_of(METRICS)]
    assert len(rows) == 8 and {r["k"] for r in rows} == {1, 2, 3}
    path = plot_k_over_training(pd.DataFrame(rows), tmp_path / "k.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no K counts"):
        plot_k_over_training(pd.DataFrame(rows).iloc[:0], tmp_path / "empty.png")


def test_ablation_and_compare_pass_off_policy_settings(monkeypatch) -> None:  # noqa: ANN001
    """--epochs / --minibatches-per-iter / --clip-eps reach every variant's TrainConfig overrides."""
    from typer.testing import CliRunner

    import benchmarks.cli as cli
    import benchmarks.compare_cli as compare_cli

    seen: list[dict] = []
    monkeypatch.setattr(compare_cli, "run_compare", lambda *a, **kw: seen.append(a[5]))
    args = [
        "--model",
        "m",
        "--suite",
        "quick-columns",
        "--epochs",
        "3",
        "--minibatches-per-iter",
        "2",
        "--clip-eps",
        "0.1",
        "--tasks-per-iter",
        "5",
        "--group-size",
        "6",
        "--eval-k",
        "2",
    ]
    for cmd in (["ablation"], ["compare", "--algos", "srpo,gspo"]):
        res = CliRunner().invoke(cli.app, [*cmd, *args])
        assert res.exit_code == 0, res.output
    assert len(seen) == 2
    for train in seen:
        assert (train["epochs"], train["minibatches_per_iter"], train["clip_eps"]) == (3, 2, 0.1)
        assert (train["tasks_per_iter"], train["group_size"]) == (5, 6)


def test_compare_defaults_are_the_suites_bench_quick_settings(monkeypatch) -> None:  # noqa: ANN001
    """``bench compare --suite S`` with no options trains as ``bench quick`` does for S, with S's decision
    settings over it (``presets.DECISION_TRAIN``: quick-search), and evaluates with S's decision eval
    (``presets.DECISION_EVAL``: the whole held-out split) where it has one, else as bench quick does; a
    suite ``bench quick`` does not run gets the on-policy quick preset; given options win."""
    from typer.testing import CliRunner

    import benchmarks.cli as cli
    import benchmarks.compare_cli as compare_cli
    from benchmarks.presets import (
        COMPARE_DEFAULTS,
        DECISION_EVAL,
        DECISION_TRAIN,
        QUICK_SETTINGS,
        QUICK_TRAIN,
    )

    seen: list[tuple] = []
    monkeypatch.setattr(compare_cli, "run_compare", lambda *a, **kw: seen.append((a[5], a[6], a[7])))

    def run(*args: str) -> tuple:
        res = CliRunner().invoke(cli.app, ["compare", "--model", "m", *args])
        assert res.exit_code == 0, res.output
        return seen[-1]

    for suite in ("quick-columns", "quick-search"):
        quick = QUICK_SETTINGS[suite]
        ev = DECISION_EVAL.get(suite, quick)
        train = {**quick["train"], **DECISION_TRAIN.get(suite, {})}
        assert run("--suite", suite) == (train, ev["eval_k"], ev["eval_limit"])
        assert quick["train"]["minibatches_per_iter"] == 2  # off-policy, as the main job runs it
    assert run("--suite", "math") == (
        {**QUICK_TRAIN, "iterations": COMPARE_DEFAULTS["iterations"]},
        16,
        COMPARE_DEFAULTS["eval_limit"],
    )
    train, k, limit = run(
        "--suite",
        "quick-columns",
        "--rows-per-batch",
        "64",
        "--iterations",
        "2",
        "--eval-k",
        "3",
        "--eval-limit",
        "5",
    )
    assert (train["rows_per_batch"], train["iterations"], k, limit) == (64, 2, 3, 5)
    assert "minibatches_per_iter" not in train  # an explicit minibatch size replaces the preset's split
    ablation = CliRunner().invoke(cli.app, ["ablation", "--model", "m", "--suite", "quick-columns"])
    assert ablation.exit_code == 0, ablation.output
    assert seen[-1][0] == QUICK_SETTINGS["quick-columns"]["train"]
    # the routed search suite keeps groups by outcome (DAPO's rule) unless told otherwise
    ablation = CliRunner().invoke(cli.app, ["ablation", "--model", "m", "--suite", "quick-search-routed"])
    assert ablation.exit_code == 0, ablation.output
    assert seen[-1][0]["filter_signal"] == "correct" and seen[-1][0]["filter_groups"]
    assert run("--suite", "quick-search-routed", "--filter-signal", "reward")[0]["filter_signal"] == "reward"
    bad = CliRunner().invoke(cli.app, ["compare", "--model", "m", "--suite", "quick-search", "--filter-signal", "x"])
    assert bad.exit_code != 0 and "--filter-signal must be one of reward, correct" in bad.output


def test_seeds_default_to_the_power_sized_preset(monkeypatch) -> None:  # noqa: ANN001
    """Issue 27: ``bench compare|ablation --suite S`` runs presets.DECISION_SEEDS[S] seeds unless told;
    other suites keep COMPARE_DEFAULTS; --seeds wins."""
    from typer.testing import CliRunner

    import benchmarks.cli as cli
    import benchmarks.compare_cli as compare_cli
    from benchmarks.presets import COMPARE_DEFAULTS, DECISION_SEEDS

    seen: list[list[int]] = []
    monkeypatch.setattr(compare_cli, "run_compare", lambda *a, **kw: seen.append(a[3]))
    for cmd in (["compare"], ["ablation"]):
        res = CliRunner().invoke(cli.app, [*cmd, "--model", "m", "--suite", "quick-columns-routed"])
        assert res.exit_code == 0, res.output
        assert seen[-1] == list(range(DECISION_SEEDS["quick-columns-routed"])) and len(seen[-1]) >= 10
    CliRunner().invoke(cli.app, ["compare", "--model", "m", "--suite", "math"])
    assert seen[-1] == [int(s) for s in COMPARE_DEFAULTS["seeds"].split(",")]
    CliRunner().invoke(cli.app, ["ablation", "--model", "m", "--suite", "quick-columns", "--seeds", "4,5"])
    assert seen[-1] == [4, 5]
