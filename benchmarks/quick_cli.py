"""``srpo bench quick``: the main job. Each CPU-scale suite from its warm start (bundled, given, or
built by its SFT recipe): SRPO, GRPO and MAPPO (or the suite's ``algos``) x seeds, before/after tables,
decisions against the reference, and one merged ``leaderboard.html`` / ``curves.png`` for the whole job.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from agents.ray_rollout import ensure_ray, shutdown_ray
from benchmarks import compare_cli, presets
from benchmarks.compare_cli import RAY_ADDRESS_HELP, REFERENCE_HELP, WORKERS_HELP, training_env
from benchmarks.options import parse_seeds
from benchmarks.presets import ALGORITHMS, QUICK_SUITES, QUICK_WORKERS
from learners.config import TrainConfig
from learners.sft import warm_start
from srpo_common import atomic_write_text


def quick_cmd(
    out: Path = typer.Option(Path("runs/quick"), help="output directory"),
    model: Path | None = typer.Option(
        None, help="math warm start (default: the bundled mini-sft, else built from scratch)"
    ),
    search_model: Path | None = typer.Option(
        None,
        help="search warm start of the search suites (default: the suite's bundled one, mini-search-worlds-sft "
        "or, routed, mini-search-worlds-routed-sft; else built from scratch)",
    ),
    columns_model: Path | None = typer.Option(
        None, help="column-addition warm start (default: the bundled mini-columns-sft, else built)"
    ),
    suites: str = typer.Option(",".join(QUICK_SUITES), help="comma-separated CPU-scale suites"),
    seeds: str | None = typer.Option(
        None,
        help="comma-separated training seeds of every suite (default: per suite, presets.QUICK_SEEDS or its own)",
    ),
    iterations: int | None = typer.Option(None, help="RL iterations per run (default: per suite)"),
    eval_limit: int | None = typer.Option(None, help="eval problems per dataset (default: per suite)"),
    workers: int = typer.Option(QUICK_WORKERS, min=0, help=WORKERS_HELP),
    ray_address: str | None = typer.Option(None, help=RAY_ADDRESS_HELP),
    reference: str = typer.Option("srpo", help=REFERENCE_HELP),
) -> None:
    """The main job: warm-started tiny models -> SRPO, GRPO, MAPPO per suite (the search team: SRPO) ->
    tables, records, page, and each algorithm decided against the reference and the start (decisions.md /
    decisions.csv per suite)."""
    import contextlib
    import time

    start = time.perf_counter()
    names = [x.strip() for x in suites.split(",") if x.strip()]
    checked: dict[str, dict[str, Any]] = {}
    for name in names:  # every suite's name and settings checked before any suite starts
        training_env(name)
        checked[name] = quick_settings(name)
    with contextlib.ExitStack() as stack:
        if workers > 0:  # one Ray for every suite's runs (each compare would otherwise start its own)
            from benchmarks.compare import worker_threads

            ensure_ray(ray_address, num_cpus=workers * worker_threads(workers))
            stack.callback(shutdown_ray)
        results = _quick_suites(
            checked,
            out,
            model,
            search_model,
            columns_model,
            seeds,
            iterations,
            eval_limit,
            workers,
            ray_address,
            reference,
        )
    for name, path in sorted(merge_quick_outputs(out, results).items()):
        typer.echo(f"wrote {name}: {path}")
    typer.echo(f"bench quick finished in {time.perf_counter() - start:.0f}s")


def _quick_suites(
    suites: dict[str, dict[str, Any]],
    out: Path,
    model: Path | None,
    search_model: Path | None,
    columns_model: Path | None,
    seeds: str | None,
    iterations: int | None,
    eval_limit: int | None,
    workers: int,
    ray_address: str | None,
    reference: str | None = None,
) -> dict[str, Any]:
    """Each suite of ``bench quick`` (name -> its checked :func:`quick_settings`) from its warm start: its
    algorithms x seeds, before/after."""

    results: dict[str, Any] = {}
    for name, settings in suites.items():
        env = presets.TRAINING_ENVS[name]
        given = given_warm_start(env.recipe, model, search_model, columns_model)
        warm = given or (
            env.bundled_model
            if (env.bundled_model / "config.json").exists()
            else _build_model(out / f"model-{env.recipe}", env.recipe)
        )
        typer.echo(f"{name}: warm start {warm}")
        train = {**settings["train"], "iterations": iterations or settings["train"]["iterations"]}
        results[name] = compare_cli.run_compare(
            warm,
            out / name,
            {algo: ALGORITHMS[algo] for algo in settings.get("algos", ALGORITHMS)},
            parse_seeds(seeds) if seeds is not None else list(settings.get("seeds", presets.QUICK_SEEDS)),
            name,
            train,
            settings["eval_k"],
            eval_limit or settings["eval_limit"],
            f"{name}: held-out Avg@{settings['eval_k']} before -> after RL (mean ± std over seeds)",
            workers,
            ray_address,
            reference,
            env_kwargs=settings.get("env_kwargs"),
        )
    return results


def given_warm_start(
    recipe: str, model: Path | None, search_model: Path | None, columns_model: Path | None
) -> Path | None:
    """The ``bench quick`` option that names a suite's warm start, by its recipe's family: every search
    recipe (search, search-worlds, search-worlds-routed) takes ``--search-model``, every column recipe
    ``--columns-model``, the math recipe ``--model``; any other (``gym``: quick-gym) has no option, and
    its suite starts from its bundled warm start (else one built from its recipe)."""
    if recipe.startswith("search"):
        return search_model
    if recipe.startswith("columns"):
        return columns_model
    return model if recipe == "math" else None


_QUICK_SETTING_KEYS = frozenset({"train", "eval_k", "eval_limit", "seeds", "algos", "env_kwargs"})


def quick_settings(suite: str) -> dict[str, Any]:
    """``presets.QUICK_SETTINGS[suite]``, refused with a one-line error when it holds a key ``bench quick``
    would silently ignore (an ``lr`` beside ``train`` instead of inside it never reaches the run), a
    ``train`` key that is no ``TrainConfig`` field, or an ``algos`` entry that is no main-job algorithm.
    ``algos`` (default: every one of :data:`ALGORITHMS`) and ``env_kwargs`` (over the suite's training
    env) let a suite spend the job's budget where it decides something."""
    settings = presets.QUICK_SETTINGS[suite]
    stray = sorted(set(settings) - _QUICK_SETTING_KEYS)
    unknown = sorted(set(settings["train"]) - {f.name for f in dataclasses.fields(TrainConfig)})
    algos = sorted(set(settings.get("algos", ALGORITHMS)) - set(ALGORITHMS))
    problems = [
        *([f"keys {stray} are not read (RL settings go under 'train')"] if stray else []),
        *([f"train keys {unknown} are no TrainConfig fields"] if unknown else []),
        *([f"algos {algos} are not among {sorted(ALGORITHMS)}"] if algos else []),
    ]
    if problems:
        raise typer.BadParameter(f"benchmarks/presets.py QUICK_SETTINGS[{suite!r}]: " + "; ".join(problems))
    return settings


def merge_quick_outputs(out: Path, results: dict[str, Any]) -> dict[str, Path]:
    """Top-level files of ``bench quick``: every suite's records, one leaderboard, one curves figure."""
    import pandas as pd

    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.compare import decisions_markdown, write_records
    from benchmarks.report import plot_suite_panels, to_markdown, write_csv

    records = [r for res in results.values() for r in res.records]
    decisions = {name: res.decisions.to_dict(orient="records") for name, res in results.items()}
    # each suite's evidence files sit in OUT/<suite>/samples/; results.json needs them in OUT/samples/
    paths = write_records(out, records, sample_dirs=[out / name for name in results], decisions=decisions)
    md = "".join(f"## {name}\n\n{to_markdown(res.table)}\n\n" for name, res in results.items())
    paths["comparison_md"] = atomic_write_text(out / "comparison.md", md)
    frames = [res.decisions.assign(suite=name) for name, res in results.items() if not res.decisions.empty]
    if frames:
        paths["decisions_csv"] = write_csv(pd.concat(frames, ignore_index=True), out / "decisions.csv")
        paths["decisions_md"] = atomic_write_text(
            out / "decisions.md",
            "\n".join(
                decisions_markdown(f.drop(columns="suite"), name)
                for name, f in zip(
                    [n for n, r in results.items() if not r.decisions.empty], frames, strict=True
                )
            ),
        )
    curves = [res.curves.assign(suite=name) for name, res in results.items() if not res.curves.empty]
    heldout = [res.runs.assign(suite=name) for name, res in results.items() if not res.runs.empty]
    if curves or heldout:  # one row per suite: training curve beside held-out before -> after
        paths["curves"] = plot_suite_panels(
            pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=_CURVE_COLUMNS),
            pd.concat(heldout, ignore_index=True) if heldout else pd.DataFrame(columns=_HELDOUT_COLUMNS),
            out / "curves.png",
            title="bench quick: training-rollout accuracy and held-out accuracy before -> after RL "
            "(mean ± std over seeds)",
        )
    return paths


_CURVE_COLUMNS = ["suite", "variant", "seed", "iteration", "train_accuracy"]
_HELDOUT_COLUMNS = ["suite", "variant", "seed", "before", "after"]


def _build_model(out: Path, recipe: str = "math") -> Path:
    """init-tiny + the shipped checkpoint's SFT recipe (``learners.presets.RECIPES``); 25-70 min on 2 cores."""
    warm_start(out, recipe, log=typer.echo)
    return out
