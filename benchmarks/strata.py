"""Held-out results by stratum of the problems: a search question's hops (1 or 2).

A suite's macro score averages over its problems, so a gain on the easy stratum can hide that the
hard one did not move (on the knowledge-base suites, two-hop questions: read the bridge entity's
name, search for it, read again). Every task that carries the stratum key in its ``meta`` (the
knowledge-base tasks' ``hops``) is labelled with it; for each method and stratum this module reports
accuracy, tool calls, team size K and the share of attempts that retrieved every gold passage
(mean ± std over training seeds: what the team found beside what it answered) and what training gained over
the start model on exactly that stratum's problems, with the paired interval of
:mod:`benchmarks.decide` (same eval seeds, same problems). Pure functions over the runners' sample
frames; ``bench compare`` / ``ablation`` write ``by_hop.csv`` / ``by_hop.md`` with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import decide
from benchmarks.evaluate import evidence_found, team_k
from benchmarks.report import format_mean_std, mean_std, to_markdown, write_csv
from benchmarks.suites import get_suite
from srpo_common import atomic_write_text

#: The task ``meta`` key strata are read from, and how a stratum is named in tables.
STRATUM_KEY = "hops"
STRATUM_NAME = "hop"


def problem_strata(
    tasks_by_dataset: Mapping[str, Sequence[Any]], key: str = STRATUM_KEY
) -> dict[tuple[str, str], str]:
    """``(dataset, problem_id) -> label`` (e.g. ``"2-hop"``) for every task whose ``meta`` has ``key``.

    Empty when no task has it (the table is then not written): strata are a property of the data,
    never guessed from the question text."""
    out: dict[tuple[str, str], str] = {}
    for dataset, tasks in tasks_by_dataset.items():
        for task in tasks:
            value = (getattr(task, "meta", None) or {}).get(key)
            if value is not None:
                out[(str(dataset), str(task.id))] = f"{value}-{STRATUM_NAME}"
    return out


def suite_strata(suite: str, limit: int | None = None) -> dict[tuple[str, str], str]:
    """:func:`problem_strata` of the problems a run of ``suite`` evaluates (the first ``limit`` per
    dataset); only search datasets are read (math tasks carry no hops, and loading them costs)."""

    datasets = [d for d in get_suite(suite).datasets if d.family == "search"]
    return problem_strata({d.name: d.load_tasks(limit) for d in datasets})


def _label_column(samples: pd.DataFrame, strata: Mapping[tuple[str, str], str]) -> pd.Series:
    keys = zip(samples["dataset"].astype(str), samples["problem_id"].astype(str), strict=True)
    return pd.Series([strata.get(k) for k in keys], index=samples.index, dtype=object)


def _mean_k(samples: pd.DataFrame) -> float:
    """Team size per attempt (:func:`benchmarks.evaluate.team_k`), NaN without ``ks``."""
    if "ks" not in samples or samples.empty:
        return math.nan
    return float(np.mean([team_k(list(v)) for v in samples["ks"]]))


def strata_frame(
    samples: Mapping[str, Mapping[int, pd.DataFrame]],
    strata: Mapping[tuple[str, str], str],
    baseline: str | None = decide.START,
    margin: float = decide.MARGIN,
) -> pd.DataFrame:
    """One row per (method, stratum): problems, accuracy, tool calls, K and gold evidence found
    (:func:`benchmarks.evaluate.evidence_found`; NaN for runs saved without it), each mean and std over seeds,
    and, for every method but ``baseline``, its paired gain over ``baseline`` on that stratum (Δ and
    its 95% interval in score units, verdict, MDE), as :func:`benchmarks.decide.decide` computes it.

    ``samples`` is ``method -> seed -> per-sample frame`` (``benchmarks.decide.decision_frame``'s
    input). Samples of problems without a stratum are left out; empty when none has one.
    """
    if not strata:
        return pd.DataFrame()
    labelled: dict[str, dict[int, pd.DataFrame]] = {
        m: {s: df.assign(_stratum=_label_column(df, strata)) for s, df in by_seed.items()}
        for m, by_seed in samples.items()
    }
    labels = sorted(
        {lab for by_seed in labelled.values() for df in by_seed.values() for lab in df["_stratum"].dropna()}
    )
    rows = []
    for label in labels:
        sub = {
            m: {s: df[df["_stratum"] == label] for s, df in by_seed.items()}
            for m, by_seed in labelled.items()
        }
        matrices = decide.score_matrices(sub)
        for method, by_seed in sub.items():
            seeds = sorted(by_seed)
            acc = mean_std([float(by_seed[s]["correct"].mean()) for s in seeds])
            tools = mean_std([float(by_seed[s]["tool_calls"].mean()) for s in seeds])
            ks = mean_std([_mean_k(by_seed[s]) for s in seeds])
            found = mean_std([evidence_found(by_seed[s]) for s in seeds])
            row: dict[str, Any] = {
                "method": method,
                "stratum": label,
                "problems": int(by_seed[seeds[0]]["problem_id"].nunique()),
                "seeds": len(seeds),
                "accuracy": acc[0],
                "accuracy_std": acc[1],
                "tool_calls": tools[0],
                "tool_calls_std": tools[1],
                "mean_k": ks[0],
                "mean_k_std": ks[1],
                "evidence": found[0],
                "evidence_std": found[1],
            }
            if baseline is not None and baseline in matrices and method != baseline:
                gain = decide.decide(
                    matrices[method], matrices[baseline], variant=method, reference=baseline, margin=margin
                ).row()
                row.update(
                    {
                        "gain": gain["delta"],
                        "gain_low": gain["low"],
                        "gain_high": gain["high"],
                        "gain_verdict": gain["verdict"],
                        "gain_mde": gain["mde"],
                    }
                )
            rows.append(row)
    return pd.DataFrame(rows)


def _pt(x: float, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def strata_markdown(frame: pd.DataFrame, title: str) -> str:
    """The table as markdown: accuracy in percent ± std over seeds, gains with their 95% interval."""

    gains = frame.reindex(columns=["gain", "gain_low", "gain_high", "gain_verdict"])  # NaN: no gain
    shown = pd.DataFrame(
        {
            "method": frame["method"],
            STRATUM_NAME: frame["stratum"],
            "problems": frame["problems"],
            "EM (%)": [
                f"{_pt(a)} ± {_pt(s)}" for a, s in zip(frame["accuracy"], frame["accuracy_std"], strict=True)
            ],
            "tool calls": [
                format_mean_std(a, s, digits=2)
                for a, s in zip(frame["tool_calls"], frame["tool_calls_std"], strict=True)
            ],
            "K": [
                "-" if math.isnan(a) else format_mean_std(a, s, digits=2)
                for a, s in zip(frame["mean_k"], frame["mean_k_std"], strict=True)
            ],
            "gold found (%)": [
                "-" if math.isnan(a) else f"{_pt(a)} ± {_pt(s)}"
                for a, s in zip(frame["evidence"], frame["evidence_std"], strict=True)
            ],
            "gain over start (pt)": [
                "" if pd.isna(g) else f"{_pt(g, True)} [{_pt(lo, True)}, {_pt(hi, True)}] {v}"
                for g, lo, hi, v in gains.itertuples(index=False)
            ],
            "seeds": frame["seeds"],
        }
    )
    legend = (
        f"EM, tool calls, K per attempt and gold found (attempts that retrieved every gold passage of their "
        f"question): mean ± std over training seeds; gain: paired by eval seed and "
        f"problem on that {STRATUM_NAME}'s problems only, 95% interval and verdict as in decisions.md."
    )
    return f"## {title}: held-out results by {STRATUM_NAME}\n\n{to_markdown(shown)}\n\n{legend}\n"


def write_strata(frame: pd.DataFrame, out: str | Path, title: str) -> dict[str, Path]:
    """``by_hop.csv`` (every number) and ``by_hop.md``; nothing when the suite has no strata."""
    if frame.empty:
        return {}

    out = Path(out)
    return {
        f"by_{STRATUM_NAME}_csv": write_csv(frame, out / f"by_{STRATUM_NAME}.csv"),
        f"by_{STRATUM_NAME}_md": atomic_write_text(
            out / f"by_{STRATUM_NAME}.md", strata_markdown(frame, title)
        ),
    }
