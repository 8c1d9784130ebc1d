"""Training comparison runner: variants (algorithms or ablations) x seeds -> curves, tables, records.

For every seed the starting model is evaluated once ("before"); every variant is then trained from
it and evaluated again ("after") on the same suite with the same evaluation seeds, so before/after
differences are paired. Outputs under ``out_dir``:

* ``runs/<variant>-s<seed>/`` — each training run (metrics.jsonl, checkpoint, final model);
* ``comparison.csv`` / ``comparison.md`` — before/after accuracy per variant, mean ± std over seeds;
* ``decisions.csv`` / ``decisions.md`` (and ``decisions.json`` for the page) — every variant against the
  reference (``CompareConfig.reference``): the paired difference with its 95% interval, P(improvement),
  a verdict and the minimum detectable difference (:mod:`benchmarks.decide`);
* ``curves.png`` — training accuracy per iteration, one line per variant with a ± band over seeds;
* ``results.json`` — one validated leaderboard record per variant (and one for the start model),
  ``leaderboard.md`` and ``leaderboard.html``.

``benchmarks.presets.ABLATIONS`` holds the built-in SRPO set-normalisation experiment (``sqrt``, ``sum``, ``mean`` and
K=1), runnable as ``srpo bench ablation``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.hf import HFPolicy
from agents.policy import PolicyMap, SamplingParams
from agents.ray_rollout import ensure_ray, shutdown_ray
from benchmarks import decide
from benchmarks.decide import (  # noqa: F401
    START,
    decision_frame,
    decisions_markdown,
    reference_of,
    write_decisions,
)
from benchmarks.evaluate import EvalResult, evaluate
from benchmarks.evidence import record_evidence
from benchmarks.options import RUN_FIELDS
from benchmarks.paper import paper_tables, run_from_result, write_paper
from benchmarks.presets import ABLATIONS, ALGORITHMS  # noqa: F401  (ABLATIONS re-exported)
from benchmarks.report import (
    format_mean_std,
    mean_std,
    plot_k_over_training,
    plot_learning_curves,
    to_markdown,
    write_csv,
)
from benchmarks.strata import strata_frame, strata_markdown, suite_strata, write_strata
from leaderboards.evidence import samples_path
from leaderboards.render import write_leaderboard
from leaderboards.schema import canonical_json, make_record
from learners import checkpoint as ckpt
from learners import metrics_log
from learners.config import flat_to_sections
from learners.trainer import TrainConfig, Trainer
from srpo_common import atomic_write_bytes, atomic_write_text, weights_sha256


@dataclass
class CompareConfig:
    """What to compare and how to measure it."""

    model: str
    out_dir: str = "runs/compare"
    variants: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(ALGORITHMS))
    seeds: tuple[int, ...] = (0, 1)
    suite: str = "quick-math"
    workflow: str = "proposers-aggregator"
    env_id: str = "ProcArith-v0"
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"difficulty": [1, 2], "max_operand": 9})
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides shared by all variants
    eval_k: int = 2
    eval_limit: int | None = 32
    temperature: float = 1.0
    max_new_tokens: int = 48
    workers: int = 0  # 0: every run in this process; N: N runs at a time as Ray tasks
    ray_address: str | None = None  # Ray cluster for the workers (default: $RAY_ADDRESS, else a local Ray)
    # the variant every other one is compared with (None: srpo, else sqrt, else the first variant)
    reference: str | None = None
    margin: float = decide.MARGIN  # a difference inside +-margin (macro score units) is "equivalent"
    # keep each run's last checkpoint (weights, optimizer, RNG: ~30 MB for the tiny models); a rerun in
    # the same out_dir with more iterations continues every run from it instead of starting over
    keep_checkpoints: bool = False
    # a finished comparison (its out_dir) of the same settings but fewer iterations: each run starts from
    # that comparison's exported weights of the same variant and seed at its last iteration and draws the
    # tasks and seeds of the iterations after it; AdamW's moments start at zero (exports keep none)
    continue_from: str | None = None


@dataclass
class ComparisonResult:
    table: pd.DataFrame  # one row per variant (plus the start model)
    runs: pd.DataFrame  # one row per (variant, seed): before/after macro accuracy, seconds
    curves: pd.DataFrame  # long: variant, seed, iteration, train_accuracy, reward_mean
    records: list[Any]
    paths: dict[str, Path]
    # long: variant, seed, iteration, k, count -- the team sizes chosen in each training rollout batch
    k_counts: pd.DataFrame = field(default_factory=pd.DataFrame)
    # every variant against the reference: one row per variant (benchmarks.decide.Decision.row())
    decisions: pd.DataFrame = field(default_factory=pd.DataFrame)


#: Per-iteration trainer metrics averaged over a run's iterations into its row of ``comparison.csv``
#: (column name -> ``metrics.jsonl`` keys, the first one logged wins): how off-policy the updates were
#: and how often clipping acted.
UPDATE_DIAGNOSTICS: dict[str, tuple[str, ...]] = {
    "clip_frac": ("actor/clip_frac",),
    "mean_abs_log_ratio": ("actor/mean_abs_log_ratio",),
    "approx_kl": ("actor/approx_kl",),
    # K of the member rounds (proposers or searchers; a router's K=1 choices included), not of every
    # event: route and aggregate events always have K=1
    "mean_k": (
        "rollout/mean_k_by_type/propose",
        "rollout/mean_k_by_type/search",
        "rollout/mean_k",
    ),
}


def run_diagnostics(metrics: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each :data:`UPDATE_DIAGNOSTICS` metric averaged over the iterations that logged it (NaN if none).

    ``clip_frac`` = 0 everywhere means the ratio never left the clip range, i.e. the comparison ran
    on-policy and the clipped objectives were never exercised -- the number to check beside accuracy.
    """
    out = {}
    for col, keys in UPDATE_DIAGNOSTICS.items():
        vals: list[float] = []
        for key in keys:
            vals = [float(m[key]) for m in metrics if isinstance(m.get(key), int | float)]
            if vals:
                break
        out[col] = float(np.mean(vals)) if vals else float("nan")
    return out


def k_counts_of(metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rollout/k_hist`` of every iteration as long rows (iteration, k, count)."""
    rows = []
    for m in metrics:
        for k, n in (m.get("rollout/k_hist") or {}).items():
            rows.append({"iteration": int(m["iteration"]), "k": int(k), "count": int(n)})
    return rows


#: Row name of the starting model in tables (the decision tables' baseline, :data:`benchmarks.decide.START`).
START_LABEL = START


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def _weights_key(policies: PolicyMap) -> str:
    """sha256 over every distinct policy's parameters (names, dtypes, shapes, bytes), in memory."""
    import hashlib

    import torch

    h = hashlib.sha256()
    seen: set[int] = set()
    for policy in policies.policies:
        model = getattr(policy, "model", None)
        if model is None or id(model) in seen:
            continue
        seen.add(id(model))
        for key, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().to("cpu").contiguous()
            h.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _macro_accuracy(result: EvalResult) -> float:
    return float(result.macro["avg@k"])


def _run_eval(cfg: CompareConfig, policies: PolicyMap, seed: int, label: str) -> EvalResult:
    """Evaluate ``policies`` on the suite; cached per sample under OUT/cache, keyed by the weights
    actually evaluated (a trained policy has no file to hash, so its parameters are hashed in
    memory): a rerun resumes."""
    out = Path(cfg.out_dir)
    result = evaluate(
        policies,
        cfg.suite,
        cfg.workflow,
        cfg.eval_k,
        sampling=SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
        limit=cfg.eval_limit,
        seed=seed,
        progress=False,
        cache_dir=out / "cache",
        cache_key=_weights_key(policies),
    )
    result.run_info["method"] = label
    result.save(out / "evals" / _safe(label) / f"seed{seed}")
    return result


@dataclass
class RunOutput:
    """What one (variant, seed) job hands back: its row of ``comparison.csv`` (without the "before"
    columns, which come from the start model's evaluation), curve and K rows, and its evaluation."""

    run: dict[str, Any]
    curves: list[dict[str, Any]]
    k_rows: list[dict[str, Any]]
    result: EvalResult


#: CompareConfig fields a continuation may change; every other one must equal the source comparison's
_CONTINUATION_FREE = ("out_dir", "seeds", "variants", "workers", "ray_address", "reference", "margin",
                      "keep_checkpoints", "continue_from", "train")  # fmt: skip


def continuation_of(cfg: CompareConfig, name: str, seed: int) -> tuple[int, Path]:
    """``(iterations, run directory)`` of the run of ``name`` and ``seed`` in ``cfg.continue_from``.

    A :class:`ValueError` (one line) unless that comparison ran the same suite, start model, env, eval
    and training settings (iterations aside, which must be fewer than ours) and exported this run."""
    src = Path(str(cfg.continue_from))
    if src.resolve() == Path(cfg.out_dir).resolve():
        raise ValueError(f"{src} is also the output directory: write the continuation to another one")
    try:
        theirs = json.loads((src / "compare_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{src}: no compare_config.json (not a finished comparison to continue)") from None
    ours = json.loads(json.dumps(asdict(cfg), default=str))
    differ = sorted(k for k in ours if k not in _CONTINUATION_FREE and theirs.get(k) != ours[k])
    their_train, our_train = dict(theirs.get("train", {})), dict(cfg.train)
    before, after = their_train.pop("iterations", None), our_train.pop("iterations", None)
    their_train.pop("logger", None), our_train.pop("logger", None)  # where metrics go, not what runs compute
    differ += sorted(
        f"train.{k}" for k in set(their_train) | set(our_train) if their_train.get(k) != our_train.get(k)
    )
    if name in theirs.get("variants", {}) and theirs["variants"][name] != cfg.variants[name]:
        differ.append(f"variants.{name}")
    if differ:
        raise ValueError(f"{src} was run with other settings (differs in {differ})")
    if not isinstance(before, int) or not isinstance(after, int) or after <= before:
        raise ValueError(f"{src} ran {before} iterations: continue it with --iterations > {before}")
    run = src / "runs" / f"{name}-s{seed}"
    if not (run / "final" / "config.json").is_file():
        raise ValueError(f"{src}: no exported run of {name} seed {seed} ({run / 'final'})")
    return before, run


def check_continuation(cfg: CompareConfig) -> None:
    """:func:`continuation_of` every run of ``cfg`` (nothing without ``continue_from``): a wrong source
    fails before the first minute is spent."""
    if cfg.continue_from:
        for name in cfg.variants:
            for seed in cfg.seeds:
                continuation_of(cfg, name, seed)


def variant_train_config(
    cfg: CompareConfig, name: str, overrides: Mapping[str, Any], seed: int, source: Path | None = None
) -> TrainConfig:
    """The ``TrainConfig`` of variant ``name`` at ``seed``: the comparison's run fields, then its sampling
    settings, ``eval_every=0``/``save_every=0``, ``cfg.train`` (any TrainConfig field) and the variant's
    overrides, each over the one before."""
    fixed = sorted(set(cfg.train) & set(RUN_FIELDS))
    if fixed:
        raise ValueError(f"train.{fixed[0]} is set by the comparison itself (its --model/--out/--suite/--seeds)")
    settings = {
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "eval_every": 0,
        "save_every": 0,
        **cfg.train,
        **overrides,
    }
    return TrainConfig(
        model=str(source / "final") if source is not None else cfg.model,
        out_dir=str(Path(cfg.out_dir) / "runs" / f"{name}-s{seed}"),
        env_id=cfg.env_id,
        env_kwargs={"workflow": cfg.workflow, **cfg.env_kwargs},
        seed=seed,
        **settings,
    )


def train_and_evaluate(
    cfg: CompareConfig, name: str, overrides: Mapping[str, Any], seed: int, torch_threads: int = 0
) -> RunOutput:
    """Train ``name`` with ``seed`` from ``cfg.model``, then evaluate it: one job of a comparison.

    Self-contained (it reads only ``cfg`` and the model directory, writes only under its own run
    directory and the shared per-sample cache), so jobs can run in any order and in other processes
    (Ray tasks with ``cfg.workers``). ``torch_threads`` > 0 sets torch's intra-op threads first.
    """
    if torch_threads > 0:
        import torch

        torch.set_num_threads(torch_threads)
    t0 = time.perf_counter()
    start, source = continuation_of(cfg, name, seed) if cfg.continue_from else (0, None)
    train_cfg = variant_train_config(cfg, name, overrides, seed, source)
    if cfg.keep_checkpoints:  # one checkpoint, after the last iteration
        train_cfg = replace(train_cfg, save_every=train_cfg.iterations)
    kept = cfg.keep_checkpoints and ckpt.find_checkpoint(train_cfg.out_dir) is not None
    # a kept checkpoint is resumed (another config, not just more iterations, or one past --iterations is an error)
    trainer = Trainer(train_cfg, log=None, start_from=train_cfg.out_dir if kept else None)
    if not kept:
        trainer.start_fresh()  # a kept checkpoint of other settings must not be resumed later
        if source is not None:  # the source run's weights (cfg.model) and its curve up to `start`
            trainer.continue_from(source, start)
    history = trainer.train()
    t1 = time.perf_counter()
    metrics = metrics_log.read_metrics(trainer.metrics_path)  # what the run logged, one row per iteration
    result = _run_eval(cfg, trainer.policies, seed, name)
    del trainer
    _release()
    curves = [
        {
            "variant": name,
            "seed": seed,
            "iteration": h["iteration"],
            "train_accuracy": h["train_accuracy"],
            "reward_mean": h["reward_mean"],
        }
        for h in history
        if "train_accuracy" in h
    ]
    run = {
        "variant": name,
        "seed": seed,
        "after": _macro_accuracy(result),
        "train_s": round(t1 - t0, 1),
        "eval_s": round(time.perf_counter() - t1, 1),
        **run_diagnostics(metrics),
    }
    k_rows = [{"variant": name, "seed": seed, **r} for r in k_counts_of(metrics)]
    return RunOutput(run, curves, k_rows, result)


def _release() -> None:
    """Give a finished job's memory back before the worker process takes the next job: collect the
    reference cycles torch modules and optimizers form, then return glibc's freed heap to the OS."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def evaluate_start(cfg: CompareConfig, seed: int, torch_threads: int = 0) -> EvalResult:
    """The start model's evaluation with ``seed``'s eval seed: the "before" of every run of that seed.

    A job like :func:`train_and_evaluate` (self-contained, any process): with ``cfg.workers`` the start
    evaluations share the Ray pool with the runs instead of running one after another in the driver
    while the workers wait (10 seeds x 256 problems x k=4 were ~5 min of a decision table's wall time).
    The samples do not depend on the process or its thread count (seeded per request).
    """
    if torch_threads > 0:
        import torch

        torch.set_num_threads(torch_threads)

    result = _run_eval(cfg, PolicyMap.shared(HFPolicy(cfg.model)), seed, START_LABEL)
    _release()
    return result


def _jobs(cfg: CompareConfig, say: Callable[[str], None]) -> Iterator[tuple[tuple[str, int], Any]]:
    """Every job's output as it finishes, keyed ``("start", seed)`` for the start model's evaluations
    (:func:`evaluate_start`, first) and ``(variant, seed)`` for the runs (:func:`train_and_evaluate`):
    in this process one after another, or with ``cfg.workers`` > 0 as Ray tasks, at most ``workers``
    at a time, each with an equal share of this machine's cores as torch threads (a 2.4M-parameter
    model uses two threads poorly; two runs side by side use two cores well). Worker processes are
    reused (``max_calls=0``): a fresh process per job spent ~6 s importing torch, transformers and the
    suite before its first step (12 short jobs on 2 workers: 56 s, reused 18 s); each job drops its run
    before returning (:func:`_release`), so a worker holds one run's memory at a time."""
    starts = [("start", seed) for seed in cfg.seeds]
    runs = [(name, seed) for name in cfg.variants for seed in cfg.seeds]
    if cfg.workers <= 0:
        start = PolicyMap.shared(HFPolicy(cfg.model))
        for key in starts:
            yield key, _run_eval(cfg, start, key[1], START_LABEL)
        del start
        for name, seed in runs:
            yield (name, seed), train_and_evaluate(cfg, name, cfg.variants[name], seed)
        return

    threads = worker_threads(cfg.workers)
    started_here = not _ray_initialized()
    ray = ensure_ray(cfg.ray_address, num_cpus=cfg.workers * threads)
    remote_start = ray.remote(num_cpus=threads, max_calls=0)(evaluate_start)
    remote_run = ray.remote(num_cpus=threads, max_calls=0)(train_and_evaluate)
    say(
        f"{len(starts)} start-model evaluations and {len(runs)} runs on {cfg.workers} Ray workers "
        f"({threads} torch thread(s) each)"
    )
    try:
        pending = {remote_start.remote(cfg, key[1], threads): key for key in starts}
        pending.update(
            {
                remote_run.remote(cfg, name, cfg.variants[name], seed, threads): (name, seed)
                for name, seed in runs
            }
        )
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            key = pending.pop(done[0])
            yield key, ray.get(done[0])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            shutdown_ray()


def worker_threads(workers: int) -> int:
    """Torch threads of each of ``workers`` concurrent runs: an equal share of this machine's cores."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _ray_initialized() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


def run_comparison(cfg: CompareConfig, log: Callable[[str], None] | None = print) -> ComparisonResult:
    """Train every variant for every seed from ``cfg.model``; evaluate before and after.

    The start model's evaluations (one per seed) and the (variant, seed) runs are the jobs of
    :func:`_jobs`: here one after another, or on Ray workers (``cfg.workers``)."""
    say = log or (lambda s: None)
    check_continuation(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    evals: dict[tuple[str, int], EvalResult] = {}
    outputs: dict[tuple[str, int], RunOutput] = {}
    waiting: list[tuple[str, int]] = []  # runs done before their seed's start evaluation
    for key, res in _jobs(cfg, say):
        if key[0] == "start":
            evals[key] = res
            say(f"start model, eval seed {key[1]}: {cfg.suite} avg@{cfg.eval_k} = {_macro_accuracy(res):.3f}")
        else:
            outputs[key] = res
            evals[key] = res.result
            waiting.append(key)
        for name, seed in [k for k in waiting if ("start", k[1]) in evals]:
            waiting.remove((name, seed))
            out_run = outputs[(name, seed)]
            before = _macro_accuracy(evals[("start", seed)])
            out_run.run = {"before": before, "delta": out_run.run["after"] - before, **out_run.run}
            diag = out_run.run
            say(
                f"{name} seed {seed}: {before:.3f} -> {diag['after']:.3f} (train {diag['train_s']:.0f}s; "
                f"clip_frac {diag['clip_frac']:.3f}, |L_e| {diag['mean_abs_log_ratio']:.4f}, "
                f"approx_kl {diag['approx_kl']:.5f})"
            )
    ordered = [outputs[(name, seed)] for name in cfg.variants for seed in cfg.seeds]  # job order, always
    column_order = ["variant", "seed", "before", "after", "delta", "train_s", "eval_s", *UPDATE_DIAGNOSTICS]
    runs_df = pd.DataFrame([o.run for o in ordered])[column_order]
    curves_df = pd.DataFrame([c for o in ordered for c in o.curves])
    k_df = pd.DataFrame(
        [r for o in ordered for r in o.k_rows], columns=["variant", "seed", "iteration", "k", "count"]
    )
    table = _summary_table(cfg, runs_df, evals)
    paths = _write_outputs(cfg, out, table, runs_df, curves_df)
    if (
        cfg.workflow == "routed" and not k_df.empty
    ):  # the router chooses K: its mean and histogram over training

        paths["k_counts"] = write_csv(k_df, out / "k_over_training.csv")
        paths["k_over_training"] = plot_k_over_training(
            k_df,
            out / "k_over_training.png",
            title=f"{cfg.suite}: K of every training event (route/aggregate events have K=1)",
        )
    paper_runs = [
        run_from_result(evals[(name, s)], START_LABEL if name == "start" else name, s)
        for name in ["start", *cfg.variants]
        for s in cfg.seeds
    ]
    paper = paper_tables(paper_runs)
    say(paper.markdown())
    paths.update({f"paper_{k}": v for k, v in write_paper(paper, out, paper_runs).items()})
    decisions = decisions_of(cfg, evals)
    paths.update(write_decisions(decisions, out, cfg.suite))
    by_stratum = strata_frame(
        _samples_by_method(cfg, evals), suite_strata(cfg.suite, cfg.eval_limit), margin=cfg.margin
    )
    if not by_stratum.empty:
        say(strata_markdown(by_stratum, cfg.suite))
        paths.update(write_strata(by_stratum, out, cfg.suite))
    records = _records(cfg, evals)
    paths.update(write_records(out, records, decisions={cfg.suite: decisions.to_dict(orient="records")}))
    return ComparisonResult(table, runs_df, curves_df, records, paths, k_df, decisions)


def _samples_by_method(
    cfg: CompareConfig, evals: Mapping[tuple[str, int], EvalResult]
) -> dict[str, dict[int, pd.DataFrame]]:
    """``method -> seed -> held-out samples``, the start model first under :data:`START_LABEL`."""
    return {
        START_LABEL if n == "start" else n: {s: evals[(n, s)].samples for s in cfg.seeds}
        for n in ["start", *cfg.variants]
    }


def decisions_of(cfg: CompareConfig, evals: Mapping[tuple[str, int], EvalResult]) -> pd.DataFrame:
    """Every variant against the reference, then against the start model (what training gained), on
    the runs' held-out samples, paired by seed and problem."""
    return decision_frame(_samples_by_method(cfg, evals), cfg.reference, cfg.margin, baseline=START_LABEL)


def _summary_table(
    cfg: CompareConfig, runs: pd.DataFrame, evals: Mapping[tuple[str, int], EvalResult]
) -> pd.DataFrame:
    k = cfg.eval_k
    rows = []
    starts = [_macro_accuracy(evals[("start", s)]) for s in cfg.seeds]
    datasets = list(evals[("start", cfg.seeds[0])].table.index)
    # how the team worked on the held-out problems, beside accuracy: searches (search suites) and the
    # router's K (routed suites), macro over datasets, mean ± std over seeds
    team_cols = {
        label: col
        for label, col, shown in (
            ("eval tool calls", "tool_calls_per_problem", True),
            ("eval K", "mean_k", cfg.workflow == "routed"),
        )
        if shown and any(float(np.nan_to_num(r.macro.get(col, 0.0))) > 0 for r in evals.values())
    }

    def team(name: str) -> dict[str, str]:
        return {
            label: format_mean_std(*mean_std([evals[(name, s)].macro[col] for s in cfg.seeds]), digits=2)
            for label, col in team_cols.items()
        }

    rows.append(
        {
            "variant": "start (SFT)",
            "before": format_mean_std(*mean_std(starts)),
            "after": "",
            "delta": "",
            **team("start"),
            **{
                f"{d} avg@{k}": format_mean_std(
                    *mean_std([evals[("start", s)].table.loc[d, "avg@k"] for s in cfg.seeds])
                )
                for d in datasets
            },
        }
    )
    for name in cfg.variants:
        sub = runs[runs["variant"] == name]
        rows.append(
            {
                "variant": name,
                "before": format_mean_std(*mean_std(sub["before"])),
                "after": format_mean_std(*mean_std(sub["after"])),
                "delta": format_mean_std(*mean_std(sub["delta"])),
                "train s": format_mean_std(*mean_std(sub["train_s"]), digits=0),
                "clip_frac": format_mean_std(*mean_std(sub["clip_frac"])),
                "mean |L_e|": format_mean_std(*mean_std(sub["mean_abs_log_ratio"]), digits=4),
                "approx_kl": format_mean_std(*mean_std(sub["approx_kl"]), digits=5),
                "train K": format_mean_std(*mean_std(sub["mean_k"]), digits=2),
                **team(name),
                **{
                    f"{d} avg@{k}": format_mean_std(
                        *mean_std([evals[(name, s)].table.loc[d, "avg@k"] for s in cfg.seeds])
                    )
                    for d in datasets
                },
            }
        )
    return pd.DataFrame(rows)


def _write_outputs(
    cfg: CompareConfig, out: Path, table: pd.DataFrame, runs: pd.DataFrame, curves: pd.DataFrame
) -> dict[str, Path]:
    paths = {
        "comparison_csv": write_csv(runs, out / "comparison.csv"),
        "comparison_md": atomic_write_text(out / "comparison.md", to_markdown(table) + "\n"),
        "config": atomic_write_text(
            out / "compare_config.json", json.dumps(asdict(cfg), indent=2, default=str) + "\n"
        ),
    }
    if not curves.empty:
        paths["curves"] = plot_learning_curves(
            curves,
            out / "curves.png",
            metric="train_accuracy",
            x="iteration",
            hue="variant",
            seed_col="seed",
            title=f"{cfg.workflow}: training accuracy (mean ± std over {len(cfg.seeds)} seeds)",
            ylabel="team accuracy on training rollouts",
        )
    return paths


def _records(cfg: CompareConfig, evals: Mapping[tuple[str, int], EvalResult]) -> list[Any]:
    """One leaderboard record per variant: per-dataset metrics averaged over seeds."""

    weights = weights_sha256(cfg.model)
    records = []
    for name in ["start", *cfg.variants]:
        results = [evals[(name, s)] for s in cfg.seeds]
        # per-dataset metrics averaged over seeds, their ± over seeds, and the per-sample evidence file
        # (OUT/samples/<sha256>.jsonl) that `srpo leaderboard validate` regrades
        from_samples = record_evidence(results, Path(cfg.out_dir))
        info = results[0].run_info
        config: dict[str, Any] = {"compare": asdict(cfg), "variant": cfg.variants.get(name, {"algo": "none"})}
        if name in cfg.variants:  # the variant's resolved training config, in the experiment-file sections

            run = asdict(variant_train_config(cfg, name, cfg.variants[name], cfg.seeds[0]))
            config["train"] = flat_to_sections({k: v for k, v in run.items() if k not in ("out_dir", "seed")})
        records.append(
            make_record(
                suite=cfg.suite,
                k=cfg.eval_k,
                **from_samples,
                algorithm=cfg.variants.get(name, {}).get("algo", "sft") if name != "start" else "sft",
                workflow=cfg.workflow,
                name=f"{name} ({Path(cfg.model).name})",
                # trained variants were evaluated with in-memory weights (one set per seed, not saved):
                # only the start model's record may name the weights file it was evaluated with
                model_id=Path(cfg.model).name if name == "start" else f"{Path(cfg.model).name}+{name}",
                weights_sha256=weights if name == "start" else None,
                config=config,
                dataset_sha256=info["dataset_sha256"],
                version=info.get("package_version"),
                commit=info.get("git_commit"),
            )
        )
    return records


def _with_records(row: dict[str, Any], suite: str, records: Sequence[Any]) -> dict[str, Any]:
    """A page decision row plus the record hashes of its variant and reference (``variant_record``,
    ``reference_record``; None when not among ``records``), so the page ranks those records by it
    (:func:`leaderboards.render.evidence_ranks`). Records are named ``<variant> (<model>)`` by
    :func:`_records`, the start model ``start (<model>)``."""

    def record_of(variant: Any) -> str | None:
        label = "start" if variant == decide.START else variant
        found = [r.record_hash for r in records if r.suite == suite and r.name.rsplit(" (", 1)[0] == label]
        return found[0] if len(found) == 1 else None

    return {**row, "variant_record": record_of(row.get("variant")), "reference_record": record_of(row.get("reference"))}


def write_records(
    out: Path,
    records: Sequence[Any],
    sample_dirs: Sequence[Path] = (),
    decisions: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Path]:
    """``results.json`` (the records as one canonical-JSON list, written atomically) and the pages.

    Each record's evidence file must end up in ``out/samples/`` (where ``srpo leaderboard validate``
    and ``reproduce`` look for it, beside results.json); it is copied there from ``sample_dirs``.
    ``decisions`` (suite -> rows of :func:`decisions_of`) goes to ``decisions.json`` beside it and onto
    the pages as plain data (the leaderboard package imports no benchmark code).
    """

    for rec in records:
        if rec.evidence is None:
            continue
        target = samples_path(out, rec.evidence.samples_sha256)
        sources = [samples_path(d, rec.evidence.samples_sha256) for d in sample_dirs]
        source = next((src for src in sources if src.is_file()), None)
        if not target.is_file() and source is not None:
            atomic_write_bytes(target, source.read_bytes())
        if not target.is_file():
            raise FileNotFoundError(f"evidence file of record {rec.name!r} not found: {target}")

    payload = "[\n" + ",\n".join(canonical_json(r.model_dump(mode="json")) for r in records) + "\n]\n"
    paths = {"results": atomic_write_text(out / "results.json", payload)}
    decisions = {
        suite: [_with_records(decide.jsonable_row(r), suite, records) for r in rows]
        for suite, rows in (decisions or {}).items()
        if rows
    }
    if decisions:
        paths["decisions_json"] = atomic_write_text(
            out / "decisions.json", json.dumps(decisions, indent=1, sort_keys=True, allow_nan=False) + "\n"
        )
    written = write_leaderboard(list(records), out, decisions=decisions or None)
    paths.update({f"leaderboard_{k}": Path(v) for k, v in written.items()})
    return paths
