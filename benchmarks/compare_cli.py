"""``srpo bench compare`` / ``ablation`` / ``report`` / ``power``: train variants x seeds, evaluate them,
and decide between them (:mod:`benchmarks.compare`, :mod:`benchmarks.decide`).

Their options are dataclasses (:mod:`benchmarks.options`) turned into commands by
:func:`srpo_common.cli.dataclass_command`, so ``--config FILE`` and ``--set`` work as in ``srpo train``;
``report`` reads saved evaluations only. ``bench quick`` (:mod:`benchmarks.quick_cli`) runs
:func:`run_compare` per suite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks import presets
from benchmarks.model_source import ModelNotAvailable, resolve_model
from benchmarks.options import (
    OPTION_NAMES,
    AblationOptions,
    AlgoCompareOptions,
    CompareOptions,
    PowerOptions,
    dump_options,
    parse_seeds,
    resolved_train,
    with_staleness,
)
from benchmarks.options import layout as options_layout
from benchmarks.presets import COMPARE_DEFAULTS, TRAINING_ENVS, TrainingEnv
from benchmarks.suites import SUITES, get_suite
from learners.config import TrainConfig
from learners.dynamic_sampling import FILTER_SIGNALS
from learners.tracking import parse_loggers
from srpo_common import atomic_write_text
from srpo_common.cli import dataclass_command


def training_env(suite: str) -> TrainingEnv:
    # presets are read when a command runs, not bound at import: a patched or reloaded presets module
    # reaches the run (the names imported above are only re-exports)
    if suite not in presets.TRAINING_ENVS:
        raise typer.BadParameter(
            f"no training env for suite {suite!r}; trainable suites: {', '.join(presets.TRAINING_ENVS)}",
            param_hint="--suite",
        )
    return presets.TRAINING_ENVS[suite]


def print_comparison(result: Any, title: str) -> None:
    from rich.table import Table

    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.report import make_console

    table = Table(title=title)
    for col in result.table.columns:
        table.add_column(str(col), justify="left" if col == "variant" else "right")
    for row in result.table.itertuples(index=False):
        table.add_row(*[str(v) for v in row])
    console = make_console()
    console.print(table)
    print_decisions(result.decisions, title, console)


def print_decisions(decisions: Any, title: str, console: Any = None) -> None:
    """Every variant vs the reference (:mod:`benchmarks.decide`), whole, with how to read it."""
    from rich.table import Table

    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.decide import format_decisions, legend
    from benchmarks.report import make_console

    if decisions is None or decisions.empty:
        return
    shown = format_decisions(decisions)
    table = Table(
        title=f"{title}: decisions (each variant vs the method in 'vs')",
        caption=legend(decisions),
    )
    for col in shown.columns:
        table.add_column(str(col), justify="left" if col in ("variant", "vs", "verdict") else "right")
    for row in shown.itertuples(index=False):
        table.add_row(*[str(v) for v in row])
    (console or make_console()).print(table)


def run_compare(
    model: Path | str,
    out: Path,
    variants: dict[str, dict[str, Any]],
    seeds: list[int],
    suite: str,
    train: dict[str, Any],
    eval_k: int,
    eval_limit: int,
    title: str,
    workers: int = 0,
    ray_address: str | None = None,
    reference: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    keep_checkpoints: bool = False,
    continue_from: Path | None = None,
    experiment: str | None = None,
) -> Any:
    """One comparison; ``env_kwargs`` replace keys of the suite's training env (decision runs: more worlds).
    ``experiment``: the resolved options as an experiment file, written to ``OUT/experiment.toml`` first."""
    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.compare import CompareConfig, check_continuation, reference_of, run_comparison

    env = training_env(suite)
    try:
        model = resolve_model(model)
    except ModelNotAvailable as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    cfg = CompareConfig(
        model=str(model),
        out_dir=str(out),
        variants=variants,
        seeds=tuple(seeds),
        suite=suite,
        workflow=env.workflow,
        env_id=env.env_id,
        env_kwargs={**env.env_kwargs, **(env_kwargs or {})},
        train=train,
        eval_k=eval_k,
        eval_limit=eval_limit,
        workers=workers,
        ray_address=ray_address,
        reference=reference,
        keep_checkpoints=keep_checkpoints,
        continue_from=str(continue_from) if continue_from is not None else None,
    )
    try:  # a wrong --continue-from fails as a usage error, not as a traceback from the runner
        check_continuation(cfg)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--continue-from") from None
    if len(variants) > 1:
        try:  # a typo in --reference fails now, not after the runs
            reference_of(list(variants), reference)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--reference") from None
    # what the runs will train with and which checkout's presets said so, before any minute is spent
    # (compare_config.json is written only at the end)
    settings = ", ".join(f"{k}={v}" for k, v in sorted({**train, **(env_kwargs or {})}.items()))
    typer.echo(f"{suite}: train {settings} (presets: {Path(presets.__file__).resolve()})")
    if experiment is not None:  # `srpo bench <command> --config OUT/experiment.toml` runs this again
        typer.echo(f"wrote {atomic_write_text(Path(out) / 'experiment.toml', experiment)}")
    result = run_comparison(cfg, log=typer.echo)
    print_comparison(result, title)
    for name, path in sorted(result.paths.items()):
        typer.echo(f"wrote {name}: {path}")
    return result


def _training_env_kwargs(suite: str, given: dict[str, Any] | None) -> dict[str, Any]:
    """The training env's kwargs a decision run replaces: the suite's decision worlds
    (:data:`benchmarks.presets.DECISION_ENV_KWARGS`), then each ``--env-kwarg KEY=VALUE`` (or the
    experiment file's ``[compare] env_kwargs``) over them (e.g. ``kb_seed=[3,...,66]``: more training
    worlds). Evaluation keeps the suite's held-out split."""
    return {**presets.DECISION_ENV_KWARGS.get(suite, {}), **(given or {})}


def _preset_train(suite: str) -> dict[str, Any]:
    """The ``TrainConfig`` overrides every variant starts from: the suite's ``bench quick`` settings
    (:data:`benchmarks.presets.QUICK_SETTINGS`, so ``bench compare --suite S`` reproduces the main job's
    S) with its decision settings over them (:data:`benchmarks.presets.DECISION_TRAIN`: quick-search),
    else the on-policy quick preset. An experiment file's ``[train]``, ``--set train.X=V`` and the shortcut
    options go over them (:func:`benchmarks.options.resolved_train`). ``epochs > 1`` or
    ``minibatches_per_iter > 1`` make the updates off-policy (rho != 1 after the first step), which is
    where clipping and SRPO's set-level ratio act."""
    if suite in presets.QUICK_SETTINGS:
        return {**presets.QUICK_SETTINGS[suite]["train"], **presets.DECISION_TRAIN.get(suite, {})}
    return {**presets.QUICK_TRAIN, "iterations": presets.COMPARE_DEFAULTS["iterations"]}


def _comparison_train(opts: CompareOptions) -> dict[str, Any]:
    """The training overrides of a comparison (presets < ``[train]`` < options), checked before any run:
    a value ``TrainConfig`` refuses is a usage error now, not after the first run's minutes."""
    if opts.filter_signal is not None and opts.filter_signal not in FILTER_SIGNALS:
        raise typer.BadParameter(
            f"--filter-signal must be one of {', '.join(FILTER_SIGNALS)}, got {opts.filter_signal!r}"
        )
    train = resolved_train(opts, _preset_train(opts.suite))
    train = with_logger({k: v for k, v in train.items() if k != "logger"}, train.get("logger"))
    try:
        TrainConfig(model="-", **train)
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(f"[train]: {exc}", param_hint="--set train.*") from None
    return train


def _required_model(opts: CompareOptions) -> str:
    if not opts.model:
        raise typer.BadParameter("give --model (or model in the experiment file's [compare])", param_hint="--model")
    return opts.model


def eval_settings(suite: str, k: int | None, limit: int | None) -> tuple[int, int]:
    """``--eval-k`` / ``--eval-limit`` as given, else the suite's decision eval (``presets.DECISION_EVAL``),
    else its ``bench quick`` eval, else :func:`suite_eval_k`'s default and ``COMPARE_DEFAULTS["eval_limit"]``."""
    quick = presets.DECISION_EVAL.get(suite) or presets.QUICK_SETTINGS.get(suite, {})
    k = k if k is not None else quick.get("eval_k")
    default_limit = presets.COMPARE_DEFAULTS["eval_limit"]
    limit = limit if limit is not None else quick.get("eval_limit", default_limit)
    return suite_eval_k(suite, k), int(limit)


WORKERS_HELP = (
    "train/evaluate this many runs at a time as Ray tasks, each with an equal share of the cores "
    "(0: one after another in this process)"
)
RAY_ADDRESS_HELP = "Ray cluster for --workers (default: $RAY_ADDRESS, else a local Ray)"
REFERENCE_HELP = (
    "variant every other one is compared with in decisions.md/.csv (default: srpo, else the first)"
)


def with_logger(train: dict[str, Any], logger: str | None) -> dict[str, Any]:
    """``train`` with ``--logger`` as its ``logger`` override (checked here: a typo fails before any run)."""
    if logger is None:
        return train

    try:
        return {**train, "logger": ",".join(parse_loggers(logger))}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--logger") from None


def suite_eval_k(suite: str, k: int | None) -> int:
    """``--k`` as given, else the suite's paper default (16 for math) or the quick default (2)."""

    if k is not None:
        return k
    try:
        suite_k = get_suite(suite).default_k
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="--suite") from None
    return suite_k or int(COMPARE_DEFAULTS["eval_k"])


def _default_seeds(suite: str, given: str | None, fallback: str) -> list[int]:
    """``--seeds`` as given, else the suite's power-sized default (:data:`presets.DECISION_SEEDS`), else
    ``fallback``."""
    if given is not None:
        return parse_seeds(given)
    n = presets.DECISION_SEEDS.get(suite)
    return list(range(n)) if n else parse_seeds(fallback)


def _experiment(opts: CompareOptions, seeds: list[int], train: dict[str, Any], k: int, limit: int) -> str:
    """The resolved options of a comparison as an experiment file (seeds, eval and [train] spelled out)."""
    resolved = dataclasses.replace(opts, seeds=",".join(map(str, seeds)), eval_k=k, eval_limit=limit)
    return dump_options(resolved, train, header="srpo bench experiment file (benchmarks/options.py): --config THIS")


def _compare_command(cls: type[CompareOptions], **kwargs: Any) -> Any:
    """:func:`srpo_common.cli.dataclass_command` of a comparison's options (``--config``/``--set`` too)."""
    return dataclass_command(
        cls, names={**OPTION_NAMES, **kwargs.pop("names", {})}, exclude=("train", *kwargs.pop("exclude", ())),
        layout=lambda: options_layout(cls), **kwargs,
    )  # fmt: skip


_SUITE_HELP = f"suite to train for and evaluate on: {', '.join(TRAINING_ENVS)}"


def _compare_from_options(
    opts: CompareOptions, variants: dict[str, Any], default_seeds: Any, title: str
) -> None:
    """Run ``variants`` as a comparison from its options (compare and ablation differ only in these)."""
    model = _required_model(opts)
    train = _comparison_train(opts)
    seeds = _default_seeds(opts.suite, opts.seeds, default_seeds)
    k, limit = eval_settings(opts.suite, opts.eval_k, opts.eval_limit)
    run_compare(
        model,
        opts.out,
        with_staleness(variants, opts),
        seeds,
        opts.suite,
        train,
        k,
        limit,
        title,
        opts.workers,
        opts.ray_address,
        opts.reference,
        env_kwargs=_training_env_kwargs(opts.suite, opts.env_kwargs),
        keep_checkpoints=opts.keep_checkpoints,
        continue_from=opts.continue_from,
        experiment=_experiment(opts, seeds, train, k, limit),
    )


def _named_variants(
    text: str, pick: Callable[[list[str]], dict[str, dict[str, Any]]], option: str
) -> dict[str, dict[str, Any]]:
    """``--algos`` / ``--norms`` (comma-separated names) -> their variants by ``pick``; a name ``pick``
    refuses is a usage error on ``option``."""
    try:
        return pick([n.strip() for n in text.split(",") if n.strip()])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


@_compare_command(AlgoCompareOptions, helps={"suite": _SUITE_HELP})
def compare_cmd(opts: AlgoCompareOptions) -> None:
    """Train each algorithm for each seed from MODEL and compare before/after accuracy; decide each
    algorithm against the reference (decisions.md / decisions.csv)."""
    _required_model(opts)  # a missing --model is reported before an unknown algorithm
    variants = _named_variants(opts.algos, presets.algorithm_variants, "--algos")
    _compare_from_options(opts, variants, COMPARE_DEFAULTS["seeds"], f"{opts.suite}: algorithms")


@_compare_command(
    AblationOptions,
    defaults={"out": Path("runs/ablation")},
    helps={"suite": _SUITE_HELP, "reference": "variant the others are compared with (default: sqrt)"},
)
def ablation_cmd(opts: AblationOptions) -> None:
    """The SRPO set-normalisation ablation: sqrt (default), sum, mean and K=1, each decided against
    the reference (decisions.md / decisions.csv)."""
    _required_model(opts)  # a missing --model is reported before an unknown normalisation
    variants = _named_variants(opts.norms, presets.ablation_variants, "--norms")
    _compare_from_options(opts, variants, COMPARE_DEFAULTS["ablation_seeds"], "SRPO normalisation ablation")


def report_cmd(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories (bench eval --seeds / compare / ablation outputs).")
    ],
    out: Annotated[
        Path | None, typer.Option(help="Where paper.md/.csv/.png go (default: the first RUN_DIR).")
    ] = None,
    absolute: Annotated[
        bool, typer.Option("--absolute", help="Print rates as fractions instead of percent.")
    ] = False,
    reference: Annotated[str | None, typer.Option(help=REFERENCE_HELP)] = None,
) -> None:
    """Print the paper's table layout (methods x benchmarks + Avg., ± over seeds, bootstrap CIs)
    from the per-sample records saved under RUN_DIRS; write it as markdown, CSV and a bar plot."""
    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.decide import decision_frame, write_decisions
    from benchmarks.paper import load_runs, paper_tables, write_paper
    from benchmarks.strata import strata_frame, strata_markdown, suite_strata, write_strata

    try:
        runs = load_runs(run_dirs)
        pt = paper_tables(runs, percent=not absolute)
        by_method: dict[str, dict[int, Any]] = {}
        for r in runs:
            by_method.setdefault(r.method, {})[r.seed] = r.samples
        decisions = decision_frame(by_method, reference)
        # a suite this version does not know has no strata to read (its runs still get every table)
        by_hop = strata_frame(by_method, suite_strata(pt.suite) if pt.suite in SUITES else {})
    except (FileNotFoundError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN_DIRS") from None
    typer.echo(pt.markdown())
    print_decisions(decisions, pt.suite)
    if not by_hop.empty:
        typer.echo(strata_markdown(by_hop, pt.suite))
    written = {
        **write_paper(pt, out or run_dirs[0], runs),
        **write_decisions(decisions, out or run_dirs[0], pt.suite),
        **write_strata(by_hop, out or run_dirs[0], pt.suite),
    }
    for kind, path in written.items():
        typer.echo(f"wrote {kind}: {path}")


@_compare_command(
    PowerOptions,
    names={"from_dir": "--from"},
    # a pilot trains the suite's preset and its decision worlds: the options below are compare's
    exclude=("reference", "keep_checkpoints", "continue_from"),
    defaults={"suite": "quick-columns-routed", "out": Path("runs/power"), "seeds": "0,1,2"},
    helps={
        "suite": "suite the comparison will run on",
        "model": "warm start (default: the suite's bundled one)",
        "out": "where the pilot runs and power.md go",
        "seeds": "pilot training seeds",
    },
)
def power_cmd(opts: PowerOptions) -> None:
    """A short pilot (two algorithms x a few seeds), then the seeds x problems x k needed to detect
    1, 2 and 5 points and the minimum detectable difference (power.md)."""
    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.evidence import suite_problems
    from benchmarks.power import power_report

    suite, out, from_dir, eval_k, eval_limit = opts.suite, opts.out, opts.from_dir, opts.eval_k, opts.eval_limit
    names = [v.strip() for v in opts.variants.split(",") if v.strip()]
    if len(names) != 2:
        raise typer.BadParameter(f"give two variants, got {names}", param_hint="--variants")
    if len(opts.staleness_arms()) > 1:
        raise typer.BadParameter("a pilot trains two variants: one --max-staleness and one --staleness-correction")
    if from_dir is None:
        try:
            variants = presets.algorithm_variants(names)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--variants") from None
        env = training_env(suite)
        train = _comparison_train(opts)
        seeds = parse_seeds(opts.seeds or "0,1,2")
        k, limit = eval_settings(suite, eval_k, eval_limit)
        run_compare(
            opts.model or env.bundled_model,
            out,
            with_staleness(variants, opts),
            seeds,
            suite,
            train,
            k,
            limit,
            f"{suite}: power pilot",
            opts.workers,
            opts.ray_address,
            env_kwargs=_training_env_kwargs(suite, opts.env_kwargs),
            experiment=_experiment(opts, seeds, train, k, limit),
        )
        from_dir = out  # the pilot saved every eval under OUT/evals/<variant>/seed<S>/
    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.paper import load_runs

    samples: dict[str, dict[int, Any]] = {n: {} for n in names}
    try:
        for r in load_runs([from_dir / "evals"] if (from_dir / "evals").is_dir() else [from_dir]):
            if r.method in samples:
                samples[r.method][r.seed] = r.samples
    except (FileNotFoundError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--from") from None
    missing = [n for n, s in samples.items() if not s]
    if missing:
        raise typer.BadParameter(f"no evals of {missing} under {from_dir}", param_hint="--from")
    whole = sum(suite_problems(suite).values())
    pilot = len(next(iter(next(iter(samples.values())).values())).groupby(["dataset", "problem_id"]))
    try:
        report = power_report(suite, samples, names, problems=sorted({pilot, whole}))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds / --from") from None
    text = report.markdown()
    typer.echo(text)
    out.mkdir(parents=True, exist_ok=True)
    typer.echo(f"wrote {atomic_write_text(out / 'power.md', text)}")

