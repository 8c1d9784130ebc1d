"""Report writers: tables as markdown / CSV / LaTeX and PNG figures (learning curves, K histograms).

Markdown and LaTeX are rendered here rather than via ``DataFrame.to_markdown`` / ``to_latex`` because
those need optional packages (tabulate, jinja2) that are not dependencies of srpo, and because the
cell escaping must be right for text that comes from run configs. All files are written atomically
(:mod:`srpo_common.io`) so a crashed run never leaves half a table.
Matplotlib is imported lazily with the Agg backend, so importing this module needs no display.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from srpo_common import atomic_write_bytes, atomic_write_text

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "format_mean_std",
    "mean_std",
    "make_console",
    "plot_k_histogram",
    "plot_k_over_training",
    "plot_learning_curves",
    "plot_suite_panels",
    "to_latex",
    "to_markdown",
    "write_csv",
    "write_latex",
    "write_markdown",
    "write_tables",
]


#: Width of the console when stdout is not a terminal: wide enough that no table is ever cut.
UNBOUNDED_WIDTH = 100_000


def make_console(**kwargs: object) -> object:
    """A :class:`rich.console.Console` that prints tables whole. On a terminal it takes the terminal's
    width; elsewhere (a log file, a pipe, CI) rich would assume 80 columns and cut every cell of a wide
    comparison table to "0.6…", so the width is unbounded there (a table is as wide as its content)."""
    from rich.console import Console

    console = Console(**kwargs)  # type: ignore[arg-type]
    return console if console.is_terminal else Console(width=UNBOUNDED_WIDTH, **kwargs)  # type: ignore[arg-type]


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for a single value) of a metric over seeds."""
    vals = [float(v) for v in values]
    return float(np.mean(vals)), (float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0)


def format_mean_std(mean: float, std: float, digits: int = 3) -> str:
    """``"0.512 ± 0.013"`` -- the usual way to print a metric over seeds in a table cell."""
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _fmt_cell(value: object, floatfmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        if math.isnan(float(value)):
            return ""
        return format(float(value), floatfmt)
    if isinstance(value, int | np.integer):
        return str(int(value))
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    return str(value)


def _frame_rows(df: pd.DataFrame, index: bool) -> tuple[list[str], list[list[object]]]:
    frame = df.reset_index() if index else df
    headers = [str(c) for c in frame.columns]
    rows = [list(r) for r in frame.itertuples(index=False, name=None)]
    return headers, rows


def _md_escape(text: str) -> str:
    # A pipe would split the cell; a newline would end the row.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def to_markdown(df: pd.DataFrame, *, floatfmt: str = ".4f", index: bool = False) -> str:
    """GitHub-flavoured markdown table; numeric columns right-aligned, NaN as an empty cell."""
    headers, rows = _frame_rows(df, index)
    frame = df.reset_index() if index else df
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    cells = [[_md_escape(_fmt_cell(v, floatfmt)) for v in row] for row in rows]
    head = "| " + " | ".join(_md_escape(h) for h in headers) + " |"
    sep = "|" + "|".join("---:" if num else ":---" for num in numeric) + "|"
    body = ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join([head, sep, *body]) + "\n"


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text.replace("\n", " "))


def to_latex(
    df: pd.DataFrame,
    *,
    floatfmt: str = ".4f",
    index: bool = False,
    caption: str | None = None,
    label: str | None = None,
) -> str:
    """A booktabs ``tabular`` (wrapped in ``table`` when a caption/label is given), cells escaped."""
    headers, rows = _frame_rows(df, index)
    frame = df.reset_index() if index else df
    align = "".join("r" if pd.api.types.is_numeric_dtype(frame[c]) else "l" for c in frame.columns)
    lines = [
        f"\\begin{{tabular}}{{{align}}}",
        "\\toprule",
        " & ".join(_latex_escape(h) for h in headers) + " \\\\",
        "\\midrule",
    ]
    lines += [" & ".join(_latex_escape(_fmt_cell(v, floatfmt)) for v in row) + " \\\\" for row in rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    if caption is not None or label is not None:
        inner = ["\\begin{table}[t]", "\\centering"]
        if caption is not None:
            inner.append(f"\\caption{{{_latex_escape(caption)}}}")
        if label is not None:
            inner.append(f"\\label{{{label}}}")
        lines = inner + lines + ["\\end{table}"]
    return "\n".join(lines) + "\n"


def write_markdown(df: pd.DataFrame, path: str | os.PathLike[str], **kwargs: object) -> Path:
    """Atomically write :func:`to_markdown` output."""
    return atomic_write_text(path, to_markdown(df, **kwargs))  # type: ignore[arg-type]


def write_latex(df: pd.DataFrame, path: str | os.PathLike[str], **kwargs: object) -> Path:
    """Atomically write :func:`to_latex` output."""
    return atomic_write_text(path, to_latex(df, **kwargs))  # type: ignore[arg-type]


def write_csv(df: pd.DataFrame, path: str | os.PathLike[str], *, index: bool = False) -> Path:
    """Atomically write a CSV with full float precision (the CSV is the machine-readable copy)."""
    return atomic_write_text(path, df.to_csv(index=index, lineterminator="\n"))


def write_tables(
    df: pd.DataFrame,
    out_dir: str | os.PathLike[str],
    stem: str,
    *,
    index: bool = False,
    floatfmt: str = ".4f",
    caption: str | None = None,
    label: str | None = None,
) -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` and ``<stem>.tex`` into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    return {
        "md": write_markdown(df, out / f"{stem}.md", index=index, floatfmt=floatfmt),
        "csv": write_csv(df, out / f"{stem}.csv", index=index),
        "tex": write_latex(
            df, out / f"{stem}.tex", index=index, floatfmt=floatfmt, caption=caption, label=label
        ),
    }


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: object, path: str | os.PathLike[str], dpi: int) -> Path:
    plt = _pyplot()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")  # type: ignore[attr-defined]
    finally:
        plt.close(fig)  # type: ignore[arg-type]
    return atomic_write_bytes(path, buf.getvalue())


def plot_learning_curves(
    df: pd.DataFrame,
    path: str | os.PathLike[str],
    *,
    metric: str = "value",
    x: str = "step",
    hue: str = "algorithm",
    seed_col: str = "seed",
    band: str = "std",
    title: str | None = None,
    ylabel: str | None = None,
    dpi: int = 120,
) -> Path:
    """PNG of ``metric`` vs ``x``, one line per ``hue`` value (mean over seeds) with a ± band.

    ``df`` is long-format: one row per (hue, seed, x). ``band`` is ``"std"`` (sample std over seeds)
    or ``"sem"`` (standard error); with one seed the band has zero width.
    """
    if band not in ("std", "sem"):
        raise ValueError(f"band must be 'std' or 'sem', got {band!r}")
    missing = [c for c in (x, metric, hue, seed_col) if c not in df.columns]
    if missing:
        raise ValueError(f"plot_learning_curves: missing columns {missing}")
    if df.empty:
        raise ValueError("plot_learning_curves: empty frame")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for name, grp in df.groupby(hue, sort=True, observed=True):
        stats = grp.groupby(x, sort=True)[metric].agg(["mean", "std", "count"])
        std = stats["std"].fillna(0.0).to_numpy()
        spread = std / np.sqrt(stats["count"].to_numpy()) if band == "sem" else std
        xs, mean = stats.index.to_numpy(), stats["mean"].to_numpy()
        (line,) = ax.plot(xs, mean, label=str(name))
        ax.fill_between(xs, mean - spread, mean + spread, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or metric)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if df[hue].nunique() > 4:  # many series: keep the legend off the curves (bbox_inches="tight" keeps it)
        ax.legend(title=hue, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:
        ax.legend(title=hue)
    return save_png(fig, path, dpi)


def _mean_spread(values: pd.Series) -> tuple[float, float]:
    """Mean and sample std (0 for one value) of a numeric series."""
    vals = values.astype(float).to_numpy()
    return float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else 0.0


def plot_suite_panels(
    curves: pd.DataFrame,
    heldout: pd.DataFrame,
    path: str | os.PathLike[str],
    *,
    suite: str = "suite",
    hue: str = "variant",
    seed_col: str = "seed",
    x: str = "iteration",
    metric: str = "train_accuracy",
    title: str | None = None,
    dpi: int = 120,
) -> Path:
    """Small multiples: one row per suite, its training curve beside its held-out before -> after.

    Why not one axis: a main job trains several algorithms on several suites whose accuracies live on
    different scales; nine overlapping series with wide bands on one axis show nothing. Here each
    suite gets its own row (own y scale, shared by its two panels), each algorithm the same colour in
    every row, and the held-out panel shows what the comparison is about: the mean over seeds before
    and after RL with a ± std bar, joined by a line, and the paired delta in the legend.

    ``curves``: long frame with ``suite, hue, seed, x, metric`` (training-rollout accuracy per
    iteration; a ± std band over seeds). ``heldout``: one row per (suite, hue, seed) with ``before``
    and ``after`` held-out accuracy. Either may lack a suite (its panel says so).
    """
    need = {
        "curves": (curves, (suite, hue, seed_col, x, metric)),
        "heldout": (heldout, (suite, hue, "before", "after")),
    }
    for name, (frame, cols) in need.items():
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"plot_suite_panels: {name} lacks columns {missing}")
    suites = list(dict.fromkeys([*curves[suite].tolist(), *heldout[suite].tolist()]))
    if not suites:
        raise ValueError("plot_suite_panels: no suites")
    variants = list(dict.fromkeys([*curves[hue].tolist(), *heldout[hue].tolist()]))
    from matplotlib import ticker

    plt = _pyplot()
    colours = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(variants)}
    fig, axes = plt.subplots(
        len(suites),
        2,
        figsize=(9.5, 2.6 * len(suites) + 0.4),
        gridspec_kw={"width_ratios": [2.2, 1.0]},
        sharey="row",
        squeeze=False,
    )
    for row, name in enumerate(suites):
        ax_c, ax_h = axes[row]
        sub = curves[curves[suite] == name]
        for v, grp in sub.groupby(hue, sort=False, observed=True):
            stats = grp.groupby(x, sort=True)[metric].agg(["mean", "std"])
            xs, mean = stats.index.to_numpy(), stats["mean"].to_numpy()
            std = stats["std"].fillna(0.0).to_numpy()
            ax_c.plot(xs, mean, color=colours[v], label=str(v))
            ax_c.fill_between(xs, mean - std, mean + std, color=colours[v], alpha=0.15, linewidth=0)
        if sub.empty:
            ax_c.text(0.5, 0.5, "no training curve", ha="center", va="center", transform=ax_c.transAxes)
        ax_c.set_title(f"{name}: training rollouts", fontsize="medium", loc="left")
        ax_c.set_ylabel("accuracy")
        ax_c.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # iterations: no 1.5 ticks
        ax_c.grid(True, alpha=0.3)
        held = heldout[heldout[suite] == name]
        n = max(held[hue].nunique(), 1)
        for i, (v, grp) in enumerate(held.groupby(hue, sort=False, observed=True)):
            off = (i - (n - 1) / 2) * 0.08
            (b, b_sd), (a, a_sd) = _mean_spread(grp["before"]), _mean_spread(grp["after"])
            d, d_sd = _mean_spread(grp["after"].astype(float) - grp["before"].astype(float))
            label = f"{v}: {d:+.3f} ± {d_sd:.3f}"
            ax_h.errorbar(
                [off, 1 + off],
                [b, a],
                yerr=[b_sd, a_sd],
                color=colours[v],
                marker="o",
                capsize=3,
                label=label,
            )
        if held.empty:
            ax_h.text(0.5, 0.5, "no held-out eval", ha="center", va="center", transform=ax_h.transAxes)
        else:
            ax_h.legend(
                fontsize="x-small",
                title="after - before",
                title_fontsize="x-small",
                loc="upper left",
                bbox_to_anchor=(1.02, 1.0),
                frameon=False,
            )
        ax_h.set_xticks([0, 1], ["before", "after"])
        ax_h.set_xlim(-0.4, 1.4)
        ax_h.set_title("held-out", fontsize="medium", loc="left")
        ax_h.grid(True, axis="y", alpha=0.3)
    axes[-1][0].set_xlabel(x)
    handles = [plt.Line2D([], [], color=colours[v], label=str(v)) for v in variants]
    axes[0][0].legend(handles=handles, fontsize="small", ncol=min(len(variants), 3), loc="best")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return save_png(fig, path, dpi)


def plot_k_histogram(
    k_values: Sequence[int] | np.ndarray | Mapping[str, Sequence[int] | np.ndarray],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    xlabel: str = "K (agents per event)",
    density: bool = False,
    dpi: int = 120,
) -> Path:
    """PNG histogram of integer K values (one bar per K); a mapping draws grouped bars per series.

    Bars sit on integer K, not on automatic float bins, because K is a count and a bin straddling
    two values would hide which one occurred.
    """
    series = dict(k_values) if isinstance(k_values, Mapping) else {"": k_values}
    arrays = {}
    for name, vals in series.items():
        arr = np.asarray(vals).ravel()
        if arr.size and (
            arr.dtype == bool
            or not np.issubdtype(arr.dtype, np.number)
            or not np.all(np.isfinite(arr))
            or not np.all(arr == np.round(arr))
            or (arr < 0).any()
        ):
            raise ValueError(f"K values must be non-negative integers (series {name!r})")
        arrays[name] = arr.astype(np.int64)
    if not any(a.size for a in arrays.values()):
        raise ValueError("plot_k_histogram: no K values")
    ks = np.unique(np.concatenate([a for a in arrays.values() if a.size]))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    width = 0.8 / len(arrays)
    for i, (name, arr) in enumerate(arrays.items()):
        counts = np.array([(arr == k).sum() for k in ks], dtype=np.float64)
        if density and arr.size:
            counts /= arr.size
        offset = (i - (len(arrays) - 1) / 2) * width
        ax.bar(ks + offset, counts, width=width, label=str(name) if name else None)
    ax.set_xticks(ks)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction" if density else "count")
    if title:
        ax.set_title(title)
    if len(arrays) > 1:
        ax.legend()
    return save_png(fig, path, dpi)


def plot_k_over_training(
    counts: pd.DataFrame,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    dpi: int = 120,
) -> Path:
    """Two panels of the team sizes a router chose while training: mean K per iteration (one line per
    variant, mean ± std over seeds) and the histogram of K over all training events per variant.

    ``counts`` is long: ``variant, seed, iteration, k, count`` (the trainer's ``rollout/k_hist`` per
    iteration). Both panels come from counts, so an iteration with more events weighs more in the
    histogram but each seed weighs the same in the curve.
    """
    missing = [c for c in ("variant", "seed", "iteration", "k", "count") if c not in counts.columns]
    if missing:
        raise ValueError(f"plot_k_over_training: missing columns {missing}")
    if counts.empty or int(counts["count"].sum()) <= 0:
        raise ValueError("plot_k_over_training: no K counts")
    df = counts.assign(kn=counts["k"] * counts["count"])
    per_run = df.groupby(["variant", "seed", "iteration"], sort=True)[["kn", "count"]].sum()
    per_run = (per_run["kn"] / per_run["count"]).rename("mean_k").reset_index()
    plt = _pyplot()
    fig, (ax_c, ax_h) = plt.subplots(1, 2, figsize=(11.0, 4.0))
    variants = sorted(df["variant"].unique())
    ks = np.sort(df["k"].unique())
    width = 0.8 / len(variants)
    for i, name in enumerate(variants):
        stats = per_run[per_run["variant"] == name].groupby("iteration")["mean_k"].agg(["mean", "std"])
        xs, mean, std = stats.index.to_numpy(), stats["mean"].to_numpy(), stats["std"].fillna(0.0).to_numpy()
        (line,) = ax_c.plot(xs, mean, marker="o", label=str(name))
        ax_c.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        sub = df[df["variant"] == name].groupby("k")["count"].sum()
        frac = np.array([sub.get(k, 0) for k in ks], dtype=np.float64) / max(int(sub.sum()), 1)
        ax_h.bar(
            ks + (i - (len(variants) - 1) / 2) * width, frac, width=width, color=line.get_color(), label=name
        )
    ax_c.set_xlabel("iteration")
    ax_c.set_ylabel("mean K of the rollout batch")
    ax_c.grid(True, alpha=0.3)
    ax_c.legend(fontsize="small")
    ax_h.set_xticks(ks)
    ax_h.set_xlabel("K (agents per event)")
    ax_h.set_ylabel("fraction of training events")
    ax_h.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return save_png(fig, path, dpi)
