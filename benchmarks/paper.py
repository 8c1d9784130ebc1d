"""The SRPO paper's table layout from saved eval records: methods x benchmarks, ± over seeds, CIs.

Every number is recomputed from the per-sample records (``eval_samples.parquet``) that
:meth:`benchmarks.evaluate.EvalResult.save` writes, so ``srpo bench report RUN_DIRS...`` prints the
same table from a finished run directory as the command that produced it.

Layout (one table per metric: ``Avg@k`` and ``Pass@k`` for math, EM for search):

* rows are methods (an algorithm, a variant, the start model);
* columns are the benchmarks in suite order, then ``Avg.`` -- the macro average (each benchmark
  weighs the same);
* a cell is ``mean ± std [low, high]``: mean and sample std over seeds (:func:`seed_summary`), and a
  95% percentile bootstrap CI over *problems* (:func:`bootstrap_ci`; :func:`bootstrap_macro_ci`,
  stratified by benchmark, for ``Avg.``) of the per-problem score averaged over seeds. The ± says
  how much a rerun moves the number; the CI says how much a different draw of problems would.

A cost table sits beside it (the paper reports cost; so do we): mean K (team size per attempt),
team tokens and tool calls per problem, the truncation rate of agent-to-agent inputs, with ± over
seeds. Outputs: ``paper.md``, ``paper.csv`` (long format, one row per method/metric/benchmark) and
``paper.png`` (grouped bars with the CIs as error bars).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.decide import START
from benchmarks.evaluate import team_k
from benchmarks.metrics import bootstrap_ci, bootstrap_macro_ci, per_problem, seed_summary
from benchmarks.report import _pyplot, plot_k_histogram, save_png, to_markdown, write_csv
from srpo_common import atomic_write_text

__all__ = ["EvalRun", "PaperTables", "load_runs", "paper_tables", "run_from_result", "write_paper"]

MACRO = "Avg."
#: Seeds, bootstrap resamples and confidence used everywhere a CI is printed.
N_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass
class EvalRun:
    """One evaluation of one method with one seed: the per-sample records and what they evaluate."""

    method: str
    seed: int
    suite: str
    workflow: str
    k: int
    datasets: list[str]
    samples: pd.DataFrame
    path: Path | None = None


def run_from_result(result: Any, method: str, seed: int | None = None) -> EvalRun:
    """An :class:`EvalRun` of an in-memory :class:`benchmarks.evaluate.EvalResult`."""
    return EvalRun(
        method=method,
        seed=int(seed if seed is not None else result.run_info["config"]["seed"]),
        suite=result.suite,
        workflow=result.workflow,
        k=int(result.k),
        datasets=[str(d) for d in result.table.index],
        samples=result.samples,
    )


def _eval_files(root: Path) -> list[Path]:
    """Every ``eval.json`` under ``root``, through symlinked directories too: seeds of one comparison run
    at different times are merged by linking their eval directories into one tree (``Path.rglob`` does
    not follow directory links before Python 3.13). A link back up the tree is entered once."""
    found, visited = [], set()
    for here, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(here)
        if real in visited:
            dirs[:] = []
            continue
        visited.add(real)
        dirs.sort()
        if "eval.json" in files:
            found.append(Path(here) / "eval.json")
    return found


def load_runs(paths: Sequence[str | Path]) -> list[EvalRun]:
    """Every saved eval under ``paths`` (``eval.json`` files, found recursively, through symlinked
    directories; one file reached twice counts once) as :class:`EvalRun`.

    The method is ``run_info.method`` when the writer set it (``bench eval --method``, compare),
    else the model directory's name; the seed is the eval seed of the run's config.
    """
    found: list[Path] = []
    for p in paths:
        root = Path(p)
        if root.is_file() and root.name.endswith(".json"):
            found.append(root)
        elif root.is_dir():
            found += _eval_files(root)
        else:
            raise FileNotFoundError(f"{root}: no such run directory")
    first: dict[Path, Path] = {}
    for f in found:  # a file reached twice (linked, or named twice) counts once, at its first place
        first.setdefault(f.resolve(), f)
    found = list(first.values())
    runs = []
    for path in found:
        summary = json.loads(path.read_text(encoding="utf-8"))
        samples_path = path.with_name(path.stem + "_samples.parquet")
        if not samples_path.is_file():
            raise FileNotFoundError(f"{path}: per-sample records {samples_path.name} are missing")
        info = summary.get("run_info", {})
        model = (info.get("model") or {}).get("path") or "model"
        runs.append(
            EvalRun(
                method=str(info.get("method") or Path(model).name),
                seed=int(info.get("config", {}).get("seed", 0)),
                suite=str(summary["suite"]),
                workflow=str(summary["workflow"]),
                k=int(summary["k"]),
                # suite order (the summary's dataset map is saved with sorted keys)
                datasets=[d["name"] for d in info.get("config", {}).get("datasets", [])]
                or list(summary["datasets"]),
                samples=pd.read_parquet(samples_path),
                path=path,
            )
        )
    if not runs:
        raise FileNotFoundError(f"no eval.json under {', '.join(map(str, paths))}")
    # the start model's runs first wherever its directory sorts (a stable sort keeps the others' order):
    # every table built from these runs then reads before -> after
    runs.sort(key=lambda r: r.method != START)
    return runs


@dataclass
class PaperTables:
    """``long``: one row per (method, metric, benchmark) with mean, std, n_seeds, ci_low, ci_high.
    ``tables``: metric label -> wide table of formatted cells (rows methods, columns benchmarks + Avg.).
    ``cost``: the cost table (formatted)."""

    suite: str
    k: int
    long: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    cost: pd.DataFrame
    datasets: list[str]
    methods: list[str]
    notes: list[str] = field(default_factory=list)
    k_hist: pd.DataFrame | None = None  # method x K counts, when K varies

    def markdown(self) -> str:
        parts = [f"# {self.suite}: {len(self.methods)} method(s), k={self.k}\n"]
        for label, table in self.tables.items():
            parts.append(f"## {label}\n\n{to_markdown(table)}\n")
        parts.append(f"## Cost\n\n{to_markdown(self.cost)}\n")
        if self.k_hist is not None:
            parts.append(f"## Team size K per attempt (counts, all seeds)\n\n{to_markdown(self.k_hist)}\n")
        parts.append(
            "Cells: mean ± std over seeds [95% bootstrap CI over problems of the seed-averaged score]; "
            f"{MACRO} = macro average over benchmarks (each weighs the same).\n"
        )
        parts.append("".join(f"- {n}\n" for n in self.notes))
        return "\n".join(parts)


def _check(runs: Sequence[EvalRun]) -> tuple[str, int, list[str], list[str]]:
    if not runs:
        raise ValueError("no eval runs")
    suites = {r.suite for r in runs}
    ks = {r.k for r in runs}
    if len(suites) > 1 or len(ks) > 1:
        raise ValueError(f"runs mix suites {sorted(suites)} or k {sorted(ks)}; report them separately")
    datasets = runs[0].datasets
    for r in runs:
        if r.datasets != datasets:
            raise ValueError(f"{r.method} seed {r.seed} evaluated {r.datasets}, others {datasets}")
    seen: set[tuple[str, int]] = set()
    for r in runs:
        if (r.method, r.seed) in seen:
            raise ValueError(f"two runs of method {r.method!r} with seed {r.seed}")
        seen.add((r.method, r.seed))
    methods = list(dict.fromkeys(r.method for r in runs))
    return suites.pop(), ks.pop(), datasets, methods


def _cell(mean: float, std: float, low: float, high: float, scale: float, digits: int) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


def paper_tables(
    runs: Sequence[EvalRun],
    *,
    percent: bool = True,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> PaperTables:
    """The paper layout of ``runs`` (one suite, one k; any number of methods and seeds)."""
    suite, k, datasets, methods = _check(runs)
    ks = sorted({1, k})
    metrics = [("avg@k", f"Avg@{k}" if k > 1 else "Accuracy")]
    if k > 1:
        metrics.append((f"pass@{k}", f"Pass@{k}"))
    if suite.startswith("search") or suite == "quick-search":
        metrics = [("avg@k", f"EM (Avg@{k})" if k > 1 else "EM")]
    problems = []
    for r in runs:
        pp = per_problem(r.samples, ks=ks)
        pp["method"], pp["seed"] = r.method, r.seed
        problems.append(pp)
    pp_all = pd.concat(problems, ignore_index=True)
    long_rows: list[dict[str, Any]] = []
    scale, digits = (100.0, 1) if percent else (1.0, 3)
    tables: dict[str, pd.DataFrame] = {}
    for col, label in metrics:
        per_seed = pp_all.groupby(["method", "seed", "dataset"], observed=True)[col].mean().reset_index()
        macro_seed = per_seed.groupby(["method", "seed"], observed=True)[col].mean().reset_index()
        by_ds = seed_summary(per_seed, col, by=("method", "dataset"))
        by_macro = seed_summary(macro_seed, col, by=("method",))
        wide: dict[str, dict[str, str]] = {}
        for m in methods:
            # per-problem score averaged over this method's seeds: the unit the bootstrap resamples
            avg = pp_all[pp_all["method"] == m].groupby(["dataset", "problem_id"], observed=True)[col].mean()
            avg = avg.reset_index()
            row: dict[str, str] = {}
            for ds in datasets:
                s = by_ds[(by_ds["method"] == m) & (by_ds["dataset"] == ds)].iloc[0]
                vals = avg.loc[avg["dataset"] == ds, col].to_numpy()
                _, lo, hi = bootstrap_ci(vals, n_resamples=n_resamples, confidence=confidence, seed=seed)
                long_rows.append(_long(m, label, ds, s, lo, hi))
                row[ds] = _cell(s["mean"], s["std"], lo, hi, scale, digits)
            s = by_macro[by_macro["method"] == m].iloc[0]
            _, lo, hi = bootstrap_macro_ci(
                avg, col, n_resamples=n_resamples, confidence=confidence, seed=seed
            )
            long_rows.append(_long(m, label, MACRO, s, lo, hi))
            row[MACRO] = _cell(s["mean"], s["std"], lo, hi, scale, digits)
            wide[m] = row
        table = pd.DataFrame.from_dict(wide, orient="index")[[*datasets, MACRO]]
        table.index.name = "method"
        tables[label + (" (%)" if percent else "")] = table.reset_index()
    cost = _cost_table(runs, methods)
    n_seeds = {m: sum(r.method == m for r in runs) for m in methods}
    notes = [f"seeds per method: {', '.join(f'{m}={n}' for m, n in n_seeds.items())}"]
    if any(n < 2 for n in n_seeds.values()):
        notes.append("a method with one seed has std 0 by definition: the ± needs >= 2 seeds")
    hist = k_histograms(runs)
    k_hist = None
    if any(len(np.unique(v)) > 1 for v in hist.values()):
        values = sorted({int(x) for v in hist.values() for x in v})
        k_hist = pd.DataFrame(
            [{"method": m, **{f"K={x}": int((v == x).sum()) for x in values}} for m, v in hist.items()]
        )
    return PaperTables(suite, k, pd.DataFrame(long_rows), tables, cost, datasets, methods, notes, k_hist)


def _long(method: str, metric: str, dataset: str, s: pd.Series, lo: float, hi: float) -> dict[str, Any]:
    return {
        "method": method,
        "metric": metric,
        "benchmark": dataset,
        "mean": float(s["mean"]),
        "std": float(s["std"]),
        "n_seeds": int(s["n_seeds"]),
        "ci_low": float(lo),
        "ci_high": float(hi),
    }


def _cost_table(runs: Sequence[EvalRun], methods: list[str]) -> pd.DataFrame:
    """Mean K, team tokens, tool calls per problem and truncation rate (macro over benchmarks), ± seeds."""

    rows = []
    for r in runs:
        s = r.samples
        per_ds = s.groupby("dataset", observed=True)
        inputs = per_ds["inputs"].sum() if "inputs" in s else None
        cut = per_ds["inputs_truncated"].sum() if "inputs_truncated" in s else None
        trunc = (cut / inputs.replace(0, np.nan)).mean() if inputs is not None else math.nan
        rows.append(
            {
                "method": r.method,
                "seed": r.seed,
                "mean K": per_ds["ks"].apply(lambda v: float(np.mean([team_k(list(x)) for x in v]))).mean(),
                "tokens/problem": per_ds["team_tokens"].mean().mean(),
                "tool calls/problem": per_ds["tool_calls"].mean().mean(),
                "trunc rate": float(trunc) if trunc == trunc else math.nan,
            }
        )
    df = pd.DataFrame(rows)
    out = []
    for m in methods:
        sub = df[df["method"] == m]
        row: dict[str, Any] = {"method": m}
        for col in ("mean K", "tokens/problem", "tool calls/problem", "trunc rate"):
            vals = sub[col].to_numpy(dtype=float)
            if np.isnan(vals).any():
                row[col] = "-"
                continue
            std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
            digits = 3 if col == "trunc rate" else (2 if col != "tokens/problem" else 1)
            row[col] = f"{float(np.mean(vals)):.{digits}f} ± {std:.{digits}f}"
        out.append(row)
    return pd.DataFrame(out)


def k_histograms(runs: Sequence[EvalRun]) -> dict[str, np.ndarray]:
    """Method -> the team size K of every sample (all seeds, all benchmarks), for a K histogram."""

    out: dict[str, list[int]] = {}
    for r in runs:
        out.setdefault(r.method, []).extend(team_k(list(x)) for x in r.samples["ks"])
    return {m: np.asarray(v, dtype=np.int64) for m, v in out.items()}


def plot_paper(pt: PaperTables, path: str | Path, *, dpi: int = 120) -> Path:
    """Grouped bars: benchmarks (+ Avg.) on x, one bar per method, the bootstrap CI as error bars."""
    plt = _pyplot()
    label = next(iter(pt.tables)).removesuffix(" (%)")
    data = pt.long[pt.long["metric"] == label]
    cols = [*pt.datasets, MACRO]
    x = np.arange(len(cols))
    width = 0.8 / max(1, len(pt.methods))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cols) * max(1, len(pt.methods)) / 2), 4.0))
    for i, m in enumerate(pt.methods):
        sub = data[data["method"] == m].set_index("benchmark").reindex(cols)
        mean = sub["mean"].to_numpy() * 100
        err = np.vstack([mean - sub["ci_low"].to_numpy() * 100, sub["ci_high"].to_numpy() * 100 - mean])
        ax.bar(
            x + (i - (len(pt.methods) - 1) / 2) * width,
            mean,
            width,
            yerr=np.clip(err, 0, None),
            capsize=2,
            label=m,
        )
    ax.set_xticks(x)
    ax.set_xticklabels(cols, rotation=30, ha="right")
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{label} (%)")
    ax.set_title(f"{pt.suite}: {label} per benchmark (95% bootstrap CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path, dpi)


def write_paper(
    pt: PaperTables, out_dir: str | Path, runs: Sequence[EvalRun] | None = None
) -> dict[str, Path]:
    """``paper.md``, ``paper.csv``, ``paper.png`` (and ``k_histogram.png`` when K varies) in ``out_dir``."""
    out = Path(out_dir)
    paths = {
        "markdown": atomic_write_text(out / "paper.md", pt.markdown()),
        "csv": write_csv(pt.long, out / "paper.csv"),
        "plot": plot_paper(pt, out / "paper.png"),
    }
    if runs is not None:
        hist = k_histograms(runs)
        if any(len(np.unique(v)) > 1 for v in hist.values()) or any(r.workflow == "routed" for r in runs):
            paths["k_histogram"] = plot_k_histogram(
                hist, out / "k_histogram.png", title=f"{pt.suite}: team size K per attempt"
            )
    return paths
