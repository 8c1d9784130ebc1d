"""Tests for benchmarks.metrics and benchmarks.report."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from benchmarks import metrics as M
from benchmarks import report as R

# ----------------------------------------------------------------------------- pass@k


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c correct) that contain a correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert M.pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_1_is_fraction_correct() -> None:
    for n in (1, 5, 16):
        for c in range(n + 1):
            assert M.pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_large_n_is_stable_and_exact() -> None:
    # C(1000, 100) overflows a float; the product form must still agree with exact rationals.
    n, c, k = 1000, 7, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert M.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert M.pass_at_k(n, 0, k) == 0.0
    assert M.pass_at_k(n, n - k + 1, k) == 1.0


def test_pass_at_k_accepts_numpy_ints_and_is_monotone_in_k() -> None:
    vals = [M.pass_at_k(np.int64(10), np.int32(3), k) for k in range(1, 11)]
    assert all(a <= b + 1e-15 for a, b in itertools.pairwise(vals))


@pytest.mark.parametrize(
    ("n", "c", "k", "exc"),
    [
        (0, 0, 1, ValueError),  # no samples
        (5, 6, 1, ValueError),  # more correct than samples
        (5, -1, 1, ValueError),  # negative correct count
        (5, 2, 0, ValueError),  # k < 1
        (5, 2, 6, ValueError),  # k > n
        (5.0, 2, 1, TypeError),  # float n
        (5, 2, 1.5, TypeError),  # float k
        (True, 1, 1, TypeError),  # bool is not a count
    ],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, exc) -> None:
    with pytest.raises(exc):
        M.pass_at_k(n, c, k)


def test_pass_at_k_array_matches_scalar() -> None:
    n = np.array([4, 4, 6, 8])
    c = np.array([0, 2, 3, 8])
    got = M.pass_at_k_array(n, c, 3)
    assert got.tolist() == pytest.approx([M.pass_at_k(int(a), int(b), 3) for a, b in zip(n, c, strict=True)])
    with pytest.raises(ValueError):
        M.pass_at_k_array([4, 4], [1], 1)


# ----------------------------------------------------------------------------- Avg@k


def test_avg_at_k_matrix() -> None:
    correct = [[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
    expected = sum(sum(row) / len(row) for row in correct) / len(correct)
    assert M.avg_at_k(correct) == pytest.approx(expected)
    assert M.avg_at_k(np.array(correct, dtype=bool)) == pytest.approx(expected)
    assert M.avg_at_k([True, False, False, False]) == pytest.approx(0.25)


@pytest.mark.parametrize("bad", [[], [[1, 2, 0]], [[]], [[0.5, 1.0]]])
def test_avg_at_k_rejects_bad_input(bad) -> None:
    with pytest.raises(ValueError):
        M.avg_at_k(bad)


# ----------------------------------------------------------------------------- aggregation


def make_samples(seed: int = 0) -> pd.DataFrame:
    """Two datasets of different sizes with random correctness and costs."""
    rng = np.random.default_rng(seed)
    rows = []
    for dataset, n_problems in (("small", 2), ("large", 5)):
        for p in range(n_problems):
            for s in range(4):
                rows.append(
                    {
                        "dataset": dataset,
                        "problem_id": f"{dataset}-{p}",
                        "sample_idx": s,
                        "correct": bool(rng.random() < 0.5),
                        "team_tokens": int(rng.integers(100, 1000)),
                        "tool_calls": int(rng.integers(0, 4)),
                    }
                )
    return pd.DataFrame(rows)


def test_per_problem_matches_manual_loops() -> None:
    df = make_samples()
    table = M.per_problem(df, ks=(1, 2, 4))
    assert len(table) == 7
    for row in table.to_dict("records"):
        sub = df[(df.dataset == row["dataset"]) & (df.problem_id == row["problem_id"])]
        c = int(sub.correct.sum())
        assert (row["n"], row["c"]) == (len(sub), c)
        assert row["avg@k"] == pytest.approx(c / len(sub))
        assert row["team_tokens"] == pytest.approx(sub.team_tokens.mean())
        assert row["tool_calls_total"] == pytest.approx(sub.tool_calls.sum())
    assert table["pass@2"].tolist() == pytest.approx(
        [brute_force_pass_at_k(int(n), int(c), 2) for n, c in zip(table.n, table.c, strict=True)]
    )


def test_per_dataset_and_macro() -> None:
    df = make_samples(1)
    table = M.per_dataset(df, ks=(1, 4))
    assert set(table.index) == {"small", "large"}
    for ds in ("small", "large"):
        sub = df[df.dataset == ds]
        per_prob_acc = sub.groupby("problem_id").correct.mean()
        assert table.at[ds, "avg@k"] == pytest.approx(per_prob_acc.mean())
        assert table.at[ds, "n_problems"] == sub.problem_id.nunique()
        assert table.at[ds, "team_tokens_per_problem"] == pytest.approx(
            sub.groupby("problem_id").team_tokens.mean().mean()
        )
        assert table.at[ds, "utility"] == pytest.approx(sub.correct.sum() * 1e6 / sub.team_tokens.sum())
    macro = M.macro_average(table["avg@k"])
    assert macro == pytest.approx((table.at["small", "avg@k"] + table.at["large", "avg@k"]) / 2)
    row = M.macro_row(table)
    assert row["avg@k"] == pytest.approx(macro)
    assert row["n_problems"] == 7  # counts are summed, not averaged


def test_macro_average_weights_datasets_equally() -> None:
    # 1 problem solved in A, 0 of 3 solved in B: macro 0.5, micro 0.25.
    assert M.macro_average({"A": 1.0, "B": 0.0}) == 0.5
    with pytest.raises(ValueError):
        M.macro_average({})
    with pytest.raises(ValueError):
        M.macro_average(pd.Series({"A": 1.0, "B": float("nan")}))


def test_validate_samples_normalises_correct() -> None:
    df = make_samples()
    expected = df["correct"].copy()
    for variant in (df.assign(correct=df.correct.astype(int)), df.assign(correct=df.correct.astype(object))):
        out = M.validate_samples(variant)
        assert out["correct"].dtype == bool
        assert out["correct"].tolist() == expected.tolist()
    with pytest.raises(ValueError, match="correct"):
        M.validate_samples(df.assign(correct="yes"))


def test_pass_at_k_requires_enough_samples() -> None:
    df = make_samples()
    with pytest.raises(ValueError, match="pass@8"):
        M.per_problem(df, ks=(8,))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.drop(columns=["team_tokens"]), "missing columns"),
        (lambda d: d.assign(correct=2), "correct"),
        (lambda d: d.assign(team_tokens=-1), "non-negative"),
        (lambda d: pd.concat([d, d.iloc[:1]]), "duplicate"),
        (lambda d: d.assign(tool_calls=np.nan), "missing values"),
        (lambda d: d.iloc[:0], "empty"),
    ],
)
def test_validate_samples_rejects(mutate, match) -> None:
    with pytest.raises(ValueError, match=match):
        M.validate_samples(mutate(make_samples()))


def test_token_utility() -> None:
    assert M.token_utility(3, 1_500_000) == pytest.approx(2.0)
    assert math.isnan(M.token_utility(0, 0))
    with pytest.raises(ValueError):
        M.token_utility(-1, 10)


# ----------------------------------------------------------------------------- seeds and bootstrap


def test_mean_std_over_seeds() -> None:
    assert M.mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert M.mean_std([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError):
        M.mean_std([])
    df = pd.DataFrame({"algorithm": ["a", "a", "b", "b"], "seed": [0, 1, 0, 1], "acc": [0.1, 0.3, 0.5, 0.5]})
    out = M.seed_summary(df, "acc", by=("algorithm",)).set_index("algorithm")
    assert out.loc["a", "mean"] == pytest.approx(0.2)
    assert out.loc["a", "std"] == pytest.approx(np.std([0.1, 0.3], ddof=1))
    assert out.loc["b", "std"] == 0.0
    with pytest.raises(ValueError, match="duplicate"):
        M.seed_summary(pd.concat([df, df.iloc[:1]]), "acc", by=("algorithm",))


def test_bootstrap_constant_data_has_zero_width() -> None:
    point, low, high = M.bootstrap_ci([0.75] * 30, seed=3)
    assert point == low == high == 0.75


def test_bootstrap_is_seeded_and_sensible() -> None:
    rng = np.random.default_rng(123)
    data = (rng.random(400) < 0.3).astype(float)
    a = M.bootstrap_ci(data, seed=7)
    assert a == M.bootstrap_ci(data, seed=7)
    assert a != M.bootstrap_ci(data, seed=8)
    point, low, high = a
    assert point == pytest.approx(data.mean())
    assert low < point < high
    # Percentile bootstrap of a mean ~ normal approximation for n=400.
    half = 1.96 * math.sqrt(point * (1 - point) / data.size)
    assert (high - low) / 2 == pytest.approx(half, rel=0.15)
    # Higher confidence gives a wider interval.
    _, low99, high99 = M.bootstrap_ci(data, seed=7, confidence=0.99)
    assert low99 < low and high99 > high


def test_bootstrap_custom_statistic_and_bad_args() -> None:
    data = np.arange(10, dtype=float)
    point, low, high = M.bootstrap_ci(data, lambda a: np.median(a, axis=-1), seed=0, n_resamples=500)
    assert point == pytest.approx(4.5)
    assert low <= point <= high
    with pytest.raises(ValueError):
        M.bootstrap_ci(data, confidence=1.0)
    with pytest.raises(ValueError):
        M.bootstrap_ci([1.0, float("nan")])


def test_bootstrap_macro_ci() -> None:
    problems = pd.DataFrame({"dataset": ["a"] * 3 + ["b"] * 5, "avg@k": [1.0, 1.0, 1.0] + [0.0] * 5})
    assert M.bootstrap_macro_ci(problems, seed=0) == (0.5, 0.5, 0.5)
    table = M.per_problem(make_samples(2))
    point, low, high = M.bootstrap_macro_ci(table, seed=0)
    assert point == pytest.approx(M.macro_average(table.groupby("dataset")["avg@k"].mean()))
    assert low <= point <= high
    assert M.bootstrap_macro_ci(table, seed=0) == (point, low, high)


def test_metrics_to_record_dict_feeds_make_record() -> None:
    from leaderboards.schema import make_record

    table = M.per_dataset(make_samples(), ks=(1, 4))
    metrics = M.metrics_to_record_dict(table, k=4)
    assert set(metrics) == {"small", "large"}
    assert "avg@4" in metrics["small"] and "avg@k" not in metrics["small"]
    rec = make_record(
        suite="math",
        metrics=metrics,
        k=4,
        seeds=[0],
        algorithm="srpo",
        workflow="solver-verifier",
        model_id="toy",
        config={"lr": 1e-6},
        dataset_sha256={"small": "2" * 64, "large": "1" * 64},
        version="0.0.0",
        commit="unknown",
        date="2025-01-01",
    )
    assert rec.macro["avg@4"] == pytest.approx(M.macro_average(table["avg@k"]))


# ----------------------------------------------------------------------------- report


def small_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "algorithm": ["srpo", "grpo|v2", "ma_ppo & co"],
            "avg@4": [0.51234, 0.4, float("nan")],
            "tokens": [1200, 1300, 900],
        }
    )


def test_to_markdown() -> None:
    md = R.to_markdown(small_table(), floatfmt=".2f")
    lines = md.strip().split("\n")
    assert lines[0] == "| algorithm | avg@4 | tokens |"
    assert lines[1] == "|:---|---:|---:|"
    assert lines[2] == "| srpo | 0.51 | 1200 |"
    assert lines[3] == "| grpo\\|v2 | 0.40 | 1300 |"  # pipe escaped, not a new cell
    assert lines[4] == "| ma_ppo & co |  | 900 |"  # NaN is an empty cell
    assert len(lines) == 5


def test_to_latex_escapes() -> None:
    tex = R.to_latex(small_table(), floatfmt=".3f", caption="Results 100%", label="tab:res")
    assert "\\begin{tabular}{lrr}" in tex
    assert "ma\\_ppo \\& co &  & 900 \\\\" in tex
    assert "avg@4" in tex and "0.512" in tex
    assert "\\caption{Results 100\\%}" in tex and "\\label{tab:res}" in tex
    assert tex.count("\\toprule") == tex.count("\\bottomrule") == 1


def test_write_tables_atomic_and_round_trip(tmp_path) -> None:
    df = small_table()
    paths = R.write_tables(df, tmp_path / "out", "main")
    assert {p.name for p in paths.values()} == {"main.md", "main.csv", "main.tex"}
    back = pd.read_csv(paths["csv"])
    pd.testing.assert_frame_equal(back, df)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["main.csv", "main.md", "main.tex"]


def curve_frame() -> pd.DataFrame:
    rows = []
    for alg, slope in (("srpo", 0.02), ("grpo", 0.01)):
        for seed in range(3):
            for step in range(0, 50, 10):
                rows.append(
                    {"algorithm": alg, "seed": seed, "step": step, "value": slope * step + 0.01 * seed}
                )
    return pd.DataFrame(rows)


def test_learning_curve_png(tmp_path) -> None:
    import matplotlib.image as mpimg

    path = R.plot_learning_curves(curve_frame(), tmp_path / "curve.png", title="acc", ylabel="Avg@4")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0  # something was drawn
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]  # no temp files left
    with pytest.raises(ValueError):
        R.plot_learning_curves(curve_frame(), tmp_path / "x.png", band="iqr")
    with pytest.raises(ValueError):
        R.plot_learning_curves(curve_frame().drop(columns=["seed"]), tmp_path / "x.png")


def test_k_histogram_png(tmp_path) -> None:
    p1 = R.plot_k_histogram([1, 2, 2, 3, 3, 3], tmp_path / "k.png")
    p2 = R.plot_k_histogram({"srpo": [1, 2, 2], "grpo": np.array([3, 3])}, tmp_path / "k2.png", density=True)
    for p in (p1, p2):
        assert p.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        R.plot_k_histogram([1.5, 2], tmp_path / "bad.png")
    with pytest.raises(ValueError):
        R.plot_k_histogram([], tmp_path / "bad.png")


def test_format_mean_std() -> None:
    assert R.format_mean_std(0.51234, 0.0123) == "0.512 ± 0.012"
