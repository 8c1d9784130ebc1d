"""Benchmark metrics: Avg@k, unbiased pass@k, aggregation, seeds and bootstrap intervals.

Input is one row per *sample* (one attempt of the team at one problem), as a pandas DataFrame with
the columns of :data:`SAMPLE_COLUMNS`. Everything here is plain numpy/pandas so that the numbers in a
paper table can be recomputed from the raw per-sample records, and every random step takes a seed.

Conventions (kept explicit because papers disagree):

* **Avg@k** is the mean accuracy over the k samples drawn per problem, averaged over problems. With
  n >= k samples per problem, ``c / n`` is the unbiased estimate of the per-problem Avg@k, so the
  per-problem value is ``c / n`` whatever k is.
* **pass@k** uses the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``.
* **Dataset-level** numbers average over problems (each problem weighs the same);
  **macro** numbers average over datasets (each dataset weighs the same).
* **Team tokens / tool calls per problem** are the mean cost of one attempt at a problem (mean over
  samples, then over problems); totals are also reported.
* **Token utility** is correct samples per million team tokens, pooled over a dataset.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "SAMPLE_COLUMNS",
    "avg_at_k",
    "bootstrap_ci",
    "bootstrap_macro_ci",
    "dataset_metrics",
    "macro_average",
    "macro_row",
    "mean_std",
    "metrics_to_record_dict",
    "pass_at_k",
    "pass_at_k_array",
    "per_dataset",
    "per_problem",
    "seed_summary",
    "token_utility",
    "validate_samples",
]

#: Required columns of the per-sample DataFrame.
SAMPLE_COLUMNS: tuple[str, ...] = (
    "dataset",
    "problem_id",
    "sample_idx",
    "correct",
    "team_tokens",
    "tool_calls",
)

#: Scale of :func:`token_utility` (correct samples per this many team tokens).
TOKENS_SCALE = 1_000_000


def _as_int(name: str, value: object) -> int:
    """Accept Python/numpy integers only: a float ``k=2.5`` or a bool is a caller bug, not a value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r})")
    return int(value)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct (Chen et al., 2021).

    ``1 - C(n-c, k) / C(n, k)`` is evaluated as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``: the binomial
    coefficients overflow floats for realistic n, while the product of factors in [0, 1] does not.

    Raises:
        TypeError: if an argument is not an integer.
        ValueError: unless ``n >= 1``, ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    n, c, k = _as_int("n", n), _as_int("c", c), _as_int("k", k)
    if n < 1:
        raise ValueError(f"n must be >= 1, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must satisfy 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k must satisfy 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        # Every k-subset contains at least one correct sample.
        return 1.0
    factors = 1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(factors))


def pass_at_k_array(n: Sequence[int] | np.ndarray, c: Sequence[int] | np.ndarray, k: int) -> np.ndarray:
    """:func:`pass_at_k` element-wise over per-problem ``n`` and ``c`` arrays (same validation)."""
    n_arr = np.asarray(n)
    c_arr = np.asarray(c)
    if n_arr.shape != c_arr.shape:
        raise ValueError(f"n and c must have the same shape, got {n_arr.shape} and {c_arr.shape}")
    return np.array(
        [pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n_arr.ravel(), c_arr.ravel(), strict=True)],
        dtype=np.float64,
    ).reshape(n_arr.shape)


def avg_at_k(correct: Sequence[Sequence[bool]] | np.ndarray) -> float:
    """Avg@k from a ``(problems, k)`` matrix of sample correctness: mean over samples, then problems.

    A 1-D input is taken as the k samples of a single problem. Rows must all have k samples, which
    is what makes the per-problem mean an Avg@k rather than an average over ragged attempt counts.
    """
    arr = np.asarray(correct)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"correct must be a non-empty (problems, k) matrix, got shape {arr.shape}")
    if arr.dtype != bool:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError("correct must contain only booleans or 0/1")
        arr = arr.astype(bool)
    return float(arr.mean(axis=1).mean())


def validate_samples(df: pd.DataFrame) -> pd.DataFrame:
    """Check a per-sample DataFrame and return a normalised copy (``correct`` as bool, costs as float).

    Rejects missing columns, missing values, non-binary correctness, negative costs and duplicate
    ``(dataset, problem_id, sample_idx)`` keys -- duplicates would silently double-count a sample.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    missing = [col for col in SAMPLE_COLUMNS if col not in df.columns]
    if missing:
        raise ValueError(f"per-sample frame is missing columns: {missing}")
    if df.empty:
        raise ValueError("per-sample frame is empty")
    out = df.loc[:, list(SAMPLE_COLUMNS) + [c for c in df.columns if c not in SAMPLE_COLUMNS]].copy()
    nulls = [col for col in SAMPLE_COLUMNS if out[col].isna().any()]
    if nulls:
        raise ValueError(f"per-sample frame has missing values in columns: {nulls}")
    correct = out["correct"]
    if correct.dtype != bool:
        # Object columns of Python bools (after concat/JSON) are fine; strings like "yes" are not.
        all_bools = correct.map(lambda v: isinstance(v, bool | np.bool_)).all()
        if not all_bools and (not pd.api.types.is_numeric_dtype(correct) or not correct.isin([0, 1]).all()):
            raise ValueError("column 'correct' must be boolean or 0/1")
        out["correct"] = correct.astype(bool)
    for col in ("team_tokens", "tool_calls"):
        if not pd.api.types.is_numeric_dtype(out[col]):
            raise ValueError(f"column {col!r} must be numeric")
        values = out[col].astype(np.float64)
        if not np.isfinite(values).all() or (values < 0).any():
            raise ValueError(f"column {col!r} must be finite and non-negative")
        out[col] = values
    dup = out.duplicated(subset=["dataset", "problem_id", "sample_idx"])
    if dup.any():
        first = out.loc[dup, ["dataset", "problem_id", "sample_idx"]].iloc[0].tolist()
        raise ValueError(f"duplicate (dataset, problem_id, sample_idx) rows, e.g. {first}")
    return out


def _check_ks(ks: Iterable[int]) -> tuple[int, ...]:
    out = tuple(_as_int("k", k) for k in ks)
    if any(k < 1 for k in out):
        raise ValueError(f"every k must be >= 1, got {out}")
    return out


def per_problem(df: pd.DataFrame, ks: Iterable[int] = (1,)) -> pd.DataFrame:
    """One row per ``(dataset, problem_id)``: sample count, correct count, Avg@k, pass@k and costs.

    Columns: ``dataset, problem_id, n, c, avg@k`` (= c/n), ``pass@<k>`` for each k in ``ks``,
    ``team_tokens`` and ``tool_calls`` (mean per attempt), ``team_tokens_total`` and
    ``tool_calls_total``. Raises if a problem has fewer than ``k`` samples for a requested pass@k.
    """
    samples = validate_samples(df)
    ks = _check_ks(ks)
    grouped = samples.groupby(["dataset", "problem_id"], sort=True, observed=True)
    table = grouped.agg(
        n=("correct", "size"),
        c=("correct", "sum"),
        team_tokens=("team_tokens", "mean"),
        tool_calls=("tool_calls", "mean"),
        team_tokens_total=("team_tokens", "sum"),
        tool_calls_total=("tool_calls", "sum"),
    ).reset_index()
    table["n"] = table["n"].astype(np.int64)
    table["c"] = table["c"].astype(np.int64)
    table["avg@k"] = table["c"] / table["n"]
    for k in ks:
        short = table[table["n"] < k]
        if not short.empty:
            row = short.iloc[0]
            raise ValueError(
                f"pass@{k} needs >= {k} samples per problem; problem {row['problem_id']!r} of "
                f"dataset {row['dataset']!r} has {int(row['n'])}"
            )
        table[f"pass@{k}"] = pass_at_k_array(table["n"].to_numpy(), table["c"].to_numpy(), k)
    front = ["dataset", "problem_id", "n", "c", "avg@k"] + [f"pass@{k}" for k in ks]
    return table[front + ["team_tokens", "tool_calls", "team_tokens_total", "tool_calls_total"]]


def token_utility(n_correct: float, team_tokens: float) -> float:
    """Correct samples per million team tokens; NaN when no tokens were spent (undefined, not infinite)."""
    if n_correct < 0 or team_tokens < 0:
        raise ValueError("n_correct and team_tokens must be non-negative")
    if team_tokens == 0:
        return math.nan
    return float(n_correct) * TOKENS_SCALE / float(team_tokens)


def per_dataset(df: pd.DataFrame, ks: Iterable[int] = (1,)) -> pd.DataFrame:
    """One row per dataset, indexed by dataset name, from the per-sample frame.

    Columns: ``n_problems, n_samples, avg@k, pass@<k>..., team_tokens_per_problem,
    tool_calls_per_problem, team_tokens_total, tool_calls_total, utility``. Problem-level values are
    averaged with equal weight per problem; ``utility`` pools all samples (see :func:`token_utility`).
    """
    ks = _check_ks(ks)
    problems = per_problem(df, ks)
    rows = {}
    for dataset, grp in problems.groupby("dataset", sort=True, observed=True):
        row: dict[str, float] = {
            "n_problems": int(len(grp)),
            "n_samples": int(grp["n"].sum()),
            "avg@k": float(grp["avg@k"].mean()),
        }
        for k in ks:
            row[f"pass@{k}"] = float(grp[f"pass@{k}"].mean())
        row["team_tokens_per_problem"] = float(grp["team_tokens"].mean())
        row["tool_calls_per_problem"] = float(grp["tool_calls"].mean())
        row["team_tokens_total"] = float(grp["team_tokens_total"].sum())
        row["tool_calls_total"] = float(grp["tool_calls_total"].sum())
        row["utility"] = token_utility(float(grp["c"].sum()), row["team_tokens_total"])
        rows[dataset] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "dataset"
    return table


#: Alias kept for readability at call sites (``dataset_metrics(samples, ks=(1, 4))``).
dataset_metrics = per_dataset


def macro_average(values: Mapping[str, float] | pd.Series) -> float:
    """Unweighted mean over datasets, so a large dataset cannot drown out a small one."""
    series = pd.Series(values, dtype=np.float64) if isinstance(values, Mapping) else values.astype(float)
    if series.empty:
        raise ValueError("macro average over zero datasets is undefined")
    if series.isna().any():
        raise ValueError(
            f"macro average got missing values for datasets: {list(series[series.isna()].index)}"
        )
    return float(series.mean())


def macro_row(table: pd.DataFrame, columns: Sequence[str] | None = None) -> pd.Series:
    """Macro-average of the numeric columns of a per-dataset table (one row per dataset).

    Count/total columns (``n_problems``, ``n_samples``, ``*_total``) are summed, not averaged,
    since "mean number of problems per dataset" is not what a reader expects in a totals row.
    """
    if columns is None:
        columns = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c])]
    out = {}
    for col in columns:
        if col in ("n_problems", "n_samples") or col.endswith("_total"):
            out[col] = float(table[col].sum())
        else:
            out[col] = macro_average(table[col])
    return pd.Series(out, name="macro")


def mean_std(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1) over seeds; std is 0.0 for a single seed."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("mean_std needs a non-empty 1-D sequence")
    if not np.isfinite(arr).all():
        raise ValueError("mean_std got non-finite values")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def seed_summary(
    df: pd.DataFrame, value: str, by: Sequence[str] = (), seed_col: str = "seed"
) -> pd.DataFrame:
    """Mean ± std of ``value`` over seeds, per group ``by`` (e.g. ``("algorithm", "dataset")``).

    Each (group, seed) must appear once: two rows for the same seed would be counted as two seeds
    and shrink the std.
    """
    keys = list(by) + [seed_col]
    missing = [c for c in keys + [value] if c not in df.columns]
    if missing:
        raise ValueError(f"seed_summary: missing columns {missing}")
    if df.duplicated(subset=keys).any():
        raise ValueError(f"seed_summary: duplicate rows for the same {keys}")
    if not by:
        mean, std = mean_std(df[value].to_numpy())
        return pd.DataFrame([{"mean": mean, "std": std, "n_seeds": int(len(df))}])
    rows = []
    for group, grp in df.groupby(list(by), sort=True, observed=True):
        group = group if isinstance(group, tuple) else (group,)
        mean, std = mean_std(grp[value].to_numpy())
        rows.append({**dict(zip(by, group, strict=True)), "mean": mean, "std": std, "n_seeds": int(len(grp))})
    return pd.DataFrame(rows)


def _check_ci_args(n_resamples: int, confidence: float) -> None:
    if _as_int("n_resamples", n_resamples) < 1:
        raise ValueError("n_resamples must be >= 1")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap CI: returns ``(point_estimate, low, high)``.

    ``values`` are i.i.d. units -- pass per-problem scores, not per-sample ones, since samples of the
    same problem are correlated and resampling them would give a too-narrow interval. The statistic
    (default: mean) must accept a 2-D array and reduce along ``axis=1``; all resamples are drawn in
    one vectorised call from ``numpy.random.default_rng(seed)``, so the result is reproducible.
    """
    _check_ci_args(n_resamples, confidence)
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("bootstrap_ci needs a non-empty 1-D sequence")
    if not np.isfinite(arr).all():
        raise ValueError("bootstrap_ci got non-finite values")
    stat = statistic if statistic is not None else (lambda a: np.mean(a, axis=-1))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_resamples, arr.size))
    boot = np.asarray(stat(arr[idx]), dtype=np.float64)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    point = float(np.asarray(stat(arr[None, :]), dtype=np.float64).reshape(-1)[0])
    return point, float(low), float(high)


def bootstrap_macro_ci(
    problems: pd.DataFrame,
    value: str = "avg@k",
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap CI of the macro average, resampling problems *within* each dataset.

    Stratifying by dataset keeps every dataset's weight fixed at 1/D, matching how the macro
    average itself is defined. ``problems`` is a :func:`per_problem` table.
    """
    _check_ci_args(n_resamples, confidence)
    for col in ("dataset", value):
        if col not in problems.columns:
            raise ValueError(f"bootstrap_macro_ci: missing column {col!r}")
    if problems.empty:
        raise ValueError("bootstrap_macro_ci: empty problem table")
    rng = np.random.default_rng(seed)
    boot = np.zeros(n_resamples, dtype=np.float64)
    means = []
    groups = list(problems.groupby("dataset", sort=True, observed=True))
    for _, grp in groups:
        arr = grp[value].to_numpy(dtype=np.float64)
        if not np.isfinite(arr).all():
            raise ValueError(f"bootstrap_macro_ci: non-finite {value!r} values")
        idx = rng.integers(0, arr.size, size=(n_resamples, arr.size))
        boot += arr[idx].mean(axis=1)
        means.append(arr.mean())
    boot /= len(groups)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(np.mean(means)), float(low), float(high)


def metrics_to_record_dict(
    table: pd.DataFrame, k: int, columns: Sequence[str] | None = None
) -> dict[str, dict[str, float]]:
    """Turn a :func:`per_dataset` table into the ``dataset -> {metric -> value}`` mapping of a
    leaderboard record, renaming ``avg@k`` to ``avg@<k>`` so the k is explicit in the name.

    Non-finite values (e.g. utility with zero tokens) are dropped for every dataset, because
    leaderboard records must be finite and every dataset must carry the same metrics.
    """
    k = _as_int("k", k)
    if columns is None:
        columns = [c for c in table.columns if c not in ("n_problems", "n_samples")]
    renamed = {c: (f"avg@{k}" if c == "avg@k" else c) for c in columns}
    sub = table.loc[:, list(columns)].astype(np.float64)
    keep = [c for c in columns if np.isfinite(sub[c].to_numpy()).all()]
    return {str(ds): {renamed[c]: float(sub.at[ds, c]) for c in keep} for ds in sub.index}
