"""curves.png of bench quick: one row per suite, training curve beside held-out before -> after."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import benchmarks.report as report


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    curves = pd.DataFrame(
        [
            {
                "suite": s,
                "variant": v,
                "seed": seed,
                "iteration": it,
                "train_accuracy": 0.1 * it + 0.01 * seed,
            }
            for s in ("quick-math", "quick-columns")
            for v in ("srpo", "grpo")
            for seed in (0, 1)
            for it in (1, 2, 3)
        ]
    )
    heldout = pd.DataFrame(
        [
            {"suite": s, "variant": v, "seed": seed, "before": 0.2, "after": 0.3 + 0.01 * seed}
            for s in ("quick-math", "quick-columns", "quick-search")
            for v in ("srpo", "grpo")
            for seed in (0, 1)
        ]
    )
    return curves, heldout


def test_one_row_per_suite_with_the_delta_in_the_legend(tmp_path: Path, monkeypatch) -> None:
    figures = []
    save = report.save_png
    monkeypatch.setattr(
        report, "save_png", lambda fig, path, dpi: (figures.append(fig), save(fig, path, dpi))[1]
    )
    curves, heldout = _frames()
    out = report.plot_suite_panels(curves, heldout, tmp_path / "curves.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = figures[0].axes
    assert len(axes) == 6  # three suites (quick-search has no curve), two panels each
    titles = [ax.get_title(loc="left") for ax in axes]
    assert titles[::2] == [f"{s}: training rollouts" for s in ("quick-math", "quick-columns", "quick-search")]
    legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert legend == ["srpo: +0.105 ± 0.007", "grpo: +0.105 ± 0.007"]
    assert [t.get_text() for t in axes[4].texts] == ["no training curve"]


def test_missing_columns_are_rejected(tmp_path: Path) -> None:
    curves, heldout = _frames()
    with pytest.raises(ValueError, match="heldout lacks columns"):
        report.plot_suite_panels(curves, heldout.drop(columns="after"), tmp_path / "x.png")


def test_bench_quick_draws_one_row_per_suite(tmp_path: Path, monkeypatch) -> None:
    """``bench quick``'s merge step feeds every suite's curves and held-out runs to the panels."""
    from benchmarks.compare import ComparisonResult
    from benchmarks.quick_cli import merge_quick_outputs

    figures = []
    save = report.save_png
    monkeypatch.setattr(
        report, "save_png", lambda fig, path, dpi: (figures.append(fig), save(fig, path, dpi))[1]
    )
    curves, heldout = _frames()
    results = {
        name: ComparisonResult(
            pd.DataFrame([{"variant": "srpo"}]),
            heldout[heldout["suite"] == name].drop(columns="suite"),
            curves[curves["suite"] == name].drop(columns="suite"),
            [],
            {},
        )
        for name in ("quick-math", "quick-search")
    }
    paths = merge_quick_outputs(tmp_path, results)
    assert paths["curves"] == tmp_path / "curves.png" and paths["curves"].is_file()
    titles = [ax.get_title(loc="left") for ax in figures[0].axes]
    assert titles == [
        "quick-math: training rollouts",
        "held-out",
        "quick-search: training rollouts",
        "held-out",
    ]
