"""The fixed-K table of a search team: held-out accuracy at each team size K, by hop and by how many
searchers a question needs, for a scripted reading team and for a model.

    python -m benchmarks.search_team [--model DIR] [--suite quick-search-team] [--max-k 5] [--k 2]
                                     [--limit N] [--json out.json]
    python -m benchmarks.search_team --router-k COMPARE_DIR   # a trained router's K by question need

Why: a set-level method only has something to learn where the team's size changes what it can reach.
Before any RL, this table says whether a suite's team is such a team: on which questions a K=1 team
cannot reach what a larger one reaches, and on which extra members only cost.

* **oracle**: :meth:`agents.scripted.ScriptedTeam.search_teacher` with ``p_correct=1``, one episode per
  question: every searcher queries the name the question (or a read passage, or the aggregator's
  request) gives, and the aggregator answers when the gold answer is in the retrieved text. It uses
  only what it has read, so its accuracy at K is what the searchers' sources put in reach at that size.
* **model** (``--model``): the policy playing every role, ``--k`` samples per question (sampling at
  temperature 1, 48 new tokens: the suites' evaluation), through :func:`benchmarks.evaluate.evaluate`.

Each team plays the suite's held-out questions in the ``parallel`` workflow with ``n_searchers=K`` (every
search event has exactly K members) and no member cost. A question's *need* is
:attr:`srpo_envs.search.MultiTurnSearchEnv.needed_searchers`: with ``searcher_sources="by-kind"`` the
position of the furthest source holding one of its gold passages. Intervals: 95% percentile bootstrap
over questions (:func:`benchmarks.metrics.bootstrap_ci`; a question's k samples stay together).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from agents.policy import PolicyMap, SamplingParams
from agents.scripted import ScriptedTeam
from benchmarks.evaluate import evaluate, team_k
from benchmarks.metrics import bootstrap_ci
from benchmarks.suites import get_suite
from srpo_common import atomic_write_text
from srpo_envs.search import KB_SOURCES, MultiTurnSearchEnv, passage_kind

SUITE = "quick-search-team"


def question_needs(tasks: Sequence[Any]) -> dict[str, int]:
    """Task id -> searchers needed under ``by-kind`` sources (1 + the furthest gold passage's source)."""
    out = {}
    for task in tasks:
        kinds = [passage_kind(pid) for pid in task.meta["gold_passage_ids"]]
        out[task.id] = 1 + max(KB_SOURCES.index(k) for k in kinds if k is not None)
    return out


def _env_kwargs(suite: str, team_size: int) -> dict[str, Any]:
    (ds,) = get_suite(suite).datasets
    return {**dict(ds.env_kwargs), "n_searchers": team_size, "member_cost": 0.0}


def oracle_rows(suite: str, team_size: int, limit: int | None = None) -> list[dict[str, Any]]:
    """One row per held-out question: the scripted reading team's episode at ``team_size`` searchers."""
    (ds,) = get_suite(suite).datasets
    tasks = ds.load_tasks(limit)
    env = MultiTurnSearchEnv(dataset="kb", tasks=tasks, split=ds.split, **_env_kwargs(suite, team_size))
    team = ScriptedTeam.search_teacher(env, p_correct=1.0, seed=0)
    rows = []
    for i, task in enumerate(tasks):
        for _ in team.play(env, seed=i, task_index=i):
            pass
        rows.append({"problem_id": task.id, "sample_idx": 0, "correct": bool(env.outcome["correct"])})
    return rows


def model_rows(
    model: str, suite: str, team_size: int, k: int, limit: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """One row per (question, sample): the model's team at ``team_size`` searchers."""
    from agents.hf import HFPolicy  # torch and transformers (~2.5 s): only a --model table needs them

    result = evaluate(
        PolicyMap.shared(HFPolicy(model)),
        suite,
        "parallel",
        k,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=48),
        limit=limit,
        seed=seed,
        env_kwargs=_env_kwargs(suite, team_size),
        progress=False,
    )
    return result.samples[["problem_id", "sample_idx", "correct"]].to_dict("records")


def fixed_k_table(rows: pd.DataFrame, hops: dict[str, int], needs: dict[str, int]) -> pd.DataFrame:
    """Accuracy (%) with its interval per (team, K) and per stratum: all, each hop, each need."""
    out = []
    rows = rows.assign(hop=rows["problem_id"].map(hops), need=rows["problem_id"].map(needs))
    strata = [("all", None)] + [(f"{h}-hop", ("hop", h)) for h in sorted(set(hops.values()))]
    strata += [(f"needs {n}", ("need", n)) for n in sorted(set(needs.values()))]
    for (team, size), grp in rows.groupby(["team", "K"], sort=True):
        for name, sel in strata:
            part = grp if sel is None else grp[grp[sel[0]] == sel[1]]
            per_q = part.groupby("problem_id")["correct"].mean().to_numpy(dtype=float)
            _, low, high = bootstrap_ci(per_q)
            out.append({"team": team, "K": int(size), "stratum": name, "questions": len(per_q),
                        "accuracy": 100 * float(per_q.mean()), "low": 100 * low, "high": 100 * high})  # fmt: skip
    return pd.DataFrame(out)


#: The mean team size the paper reports for its trained router (searchers per search event).
PAPER_MEAN_K = 1.638


def _difference_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``mean(a) - mean(b)`` (independent samples: each resampled
    apart, which :func:`benchmarks.metrics.bootstrap_ci`'s one-sample resampling does not do)."""
    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return x.mean(axis=axis) - y.mean(axis=axis)

    ci = bootstrap((a, b), diff, confidence_level=0.95, n_resamples=2000, method="percentile",
                   random_state=0).confidence_interval  # fmt: skip
    return float(ci.low), float(ci.high)


def router_k(samples: pd.DataFrame, needs: dict[str, int]) -> dict[str, Any]:
    """The routed team's size by what its questions need, from a routed eval's samples (``ks``: the
    episode's event sizes; its team size is the largest).

    Returns the mean K overall and per need (with a bootstrap interval over questions, a question's
    samples and seeds averaged first), and the difference between questions that need more than one
    searcher and those that need one, with its interval: a router that conditions on the question
    sends more searchers where they are needed (difference > 0); one that learned a single K does not."""
    frame = samples.assign(K=[team_k(list(v)) for v in samples["ks"]], need=samples["problem_id"].map(needs))
    per_q = frame.groupby("problem_id").agg(K=("K", "mean"), need=("need", "first"))
    out: dict[str, Any] = {"mean_k": float(frame["K"].mean()), "attempts": len(frame), "by_need": {}}
    for need, grp in per_q.groupby("need"):
        _, low, high = bootstrap_ci(grp["K"].to_numpy(dtype=float))
        out["by_need"][int(need)] = {"questions": len(grp), "mean_k": float(grp["K"].mean()), "low": low, "high": high}
    one, more = per_q.loc[per_q["need"] == 1, "K"].to_numpy(float), per_q.loc[per_q["need"] > 1, "K"].to_numpy(float)
    if len(one) > 1 and len(more) > 1:
        low, high = _difference_interval(more, one)
        out["more_minus_one"] = {"diff": float(more.mean() - one.mean()), "low": low, "high": high}
    return out


def router_k_report(compare_dir: str, needs: dict[str, int]) -> str:
    """:func:`router_k` for every method of a ``srpo bench compare`` output (its ``evals/<method>/seed*/``
    samples), as a markdown table beside the paper's mean K."""
    rows = []
    for method_dir in sorted(p for p in (Path(compare_dir) / "evals").iterdir() if p.is_dir()):
        files = sorted(method_dir.glob("seed*/eval_samples.parquet"))
        if not files:
            continue
        stats = router_k(pd.concat([pd.read_parquet(f) for f in files], ignore_index=True), needs)
        by = stats["by_need"]
        cells = [f"{by[n]['mean_k']:.2f} [{by[n]['low']:.2f}, {by[n]['high']:.2f}]" for n in sorted(by)]
        d = stats.get("more_minus_one")
        diff = f"{d['diff']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]" if d else "n/a"
        rows.append(f"| {method_dir.name} ({len(files)} seeds) | {stats['mean_k']:.2f} | " + " | ".join(cells) + f" | {diff} |")
    needs_seen = sorted(set(needs.values()))
    head = "| method | mean K (paper 1.638) | " + " | ".join(f"K, needs {n}" for n in needs_seen)
    head += " | K(needs > 1) - K(needs 1) |"
    return "\n".join([head, "|:---|---:|" + "---:|" * (len(needs_seen) + 1), *rows])


def markdown(table: pd.DataFrame) -> str:
    """Teams x K rows, strata as columns: ``acc [low, high]``; the header gives each stratum's questions."""
    strata = list(dict.fromkeys(table["stratum"]))
    sizes = table.drop_duplicates("stratum").set_index("stratum")["questions"]
    head = "| team | K | " + " | ".join(f"{s} ({sizes[s]})" for s in strata) + " |"
    lines = [head, "|:---|---:|" + "---:|" * len(strata)]
    for (team, size), grp in table.groupby(["team", "K"], sort=False):
        cells = grp.set_index("stratum")
        vals = [f"{cells.at[s, 'accuracy']:.1f} [{cells.at[s, 'low']:.1f}, {cells.at[s, 'high']:.1f}]" for s in strata]
        lines.append(f"| {team} | {size} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=SUITE, help="a one-dataset search suite (its held-out split)")
    parser.add_argument("--model", help="also evaluate this model (every role) at each K")
    parser.add_argument("--max-k", type=int, default=5, help="team sizes 1..max-k")
    parser.add_argument("--k", type=int, default=2, help="the model's samples per question")
    parser.add_argument("--limit", type=int, help="the first N held-out questions")
    parser.add_argument("--seed", type=int, default=0, help="the model's eval seed")
    parser.add_argument("--json", help="write the table (and per-sample rows) here")
    parser.add_argument("--router-k", metavar="COMPARE_DIR",
                        help="instead: the routed team's K by need in a `srpo bench compare` output")  # fmt: skip
    args = parser.parse_args(argv)
    if args.max_k < 1 or args.k < 1:
        parser.error("--max-k and --k must be >= 1")
    suite = get_suite(args.suite)
    if len(suite.datasets) != 1 or suite.datasets[0].dataset != "kb":
        parser.error(f"--suite {args.suite}: need a suite of one invented-world dataset")
    tasks = suite.datasets[0].load_tasks(args.limit)
    hops = {t.id: int(t.meta["hops"]) for t in tasks}
    needs = question_needs(tasks)
    if args.router_k:
        print(router_k_report(args.router_k, needs))
        return 0
    rows, seconds = [], {}
    for size in range(1, args.max_k + 1):
        started = time.perf_counter()
        rows += [{"team": "oracle", "K": size, **r} for r in oracle_rows(args.suite, size, args.limit)]
        if args.model:
            rows += [
                {"team": "model", "K": size, **r}
                for r in model_rows(args.model, args.suite, size, args.k, args.limit, args.seed)
            ]
        seconds[size] = round(time.perf_counter() - started, 1)
        print(f"K={size}: {seconds[size]} s", file=sys.stderr, flush=True)
    table = fixed_k_table(pd.DataFrame(rows), hops, needs)
    print(markdown(table))
    if args.json:
        payload = {"suite": args.suite, "model": args.model, "k": args.k, "limit": args.limit,
                   "seed": args.seed, "seconds": seconds, "table": table.to_dict("records"), "rows": rows}  # fmt: skip
        atomic_write_text(args.json, json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
