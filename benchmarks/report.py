"""Report writers: tables as markdown / CSV / LaTeX and PNG figures (learning curves, K histograms).

Markdown and LaTeX are rendered here rather than via ``DataFrame.to_markdown`` / ``to_latex`` because
those need optional packages (tabulate, jinja2) that are not dependencies of srpo, and because the
cell escaping must be right for text that comes from run configs. All files are written atomically
(temp file in the same directory + ``os.replace``) so a crashed run never leaves half a table.
Matplotlib is imported lazily with the Agg backend, so importing this module needs no display.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "format_mean_std",
    "plot_k_histogram",
    "plot_learning_curves",
    "to_latex",
    "to_markdown",
    "write_csv",
    "write_latex",
    "write_markdown",
    "write_tables",
]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes` (``\\n`` line endings on every OS)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


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


def _save_png(fig: object, path: str | os.PathLike[str], dpi: int) -> Path:
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
    return _save_png(fig, path, dpi)


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
    return _save_png(fig, path, dpi)
