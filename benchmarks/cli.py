"""``srpo bench ...``: evaluate a local model on a benchmark suite (wired into ``srpo`` by the lead).

``eval`` loads one model directory as a shared policy for every role, runs
:func:`benchmarks.evaluate.evaluate` with a resumable cache under the output directory, prints the
table and writes ``eval.json`` (summary + everything needed to reproduce), the per-sample records
(``eval_samples.parquet`` / ``.csv``) and, with ``--algorithm``, a validated leaderboard record.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks import presets
from benchmarks.options import (
    OPTION_NAMES,
    AlgoCompareOptions,
    CompareOptions,
    PowerOptions,
    dump_options,
    resolved_train,
    with_staleness,
)
from benchmarks.options import layout as options_layout
from benchmarks.presets import (  # noqa: F401  (re-exported: the presets' old home)
    BUNDLED_COLUMNS_MODEL,
    BUNDLED_MODEL,
    BUNDLED_SEARCH_MODEL,
    COMPARE_DEFAULTS,
    QUICK_SETTINGS,
    QUICK_SUITES,
    QUICK_TRAIN,
    QUICK_WORKERS,
    TRAINING_ENVS,
    TrainingEnv,
)
from learners.dynamic_sampling import FILTER_SIGNALS
from srpo_common import atomic_write_text, parse_kv, weights_sha256
from srpo_common.cli import dataclass_command

app = typer.Typer(help="Benchmarks: evaluate models on the benchmark suites.", no_args_is_help=True)


@app.callback()
def bench() -> None:
    """Benchmarks: evaluate models on the benchmark suites (a callback keeps this a command group)."""
    warn_other_checkout()


def warn_other_checkout(cwd: Path | None = None) -> str | None:
    """Warn (stderr) when the working directory lies in a srpo checkout other than the one whose code
    runs, and return the warning. The ``srpo`` command imports the package from wherever
    ``pip install -e`` last ran (``.ci/run`` on a clean clone re-points it there), so preset edits made
    in this checkout would silently not reach the run: the likely reason a quick-search lr edit once
    left ``compare_config.json`` at 1e-4."""
    code_root = Path(presets.__file__).resolve().parent.parent
    here = (cwd or Path.cwd()).resolve()
    for root in (here, *here.parents):
        if (root / "pyproject.toml").is_file() and (root / "benchmarks" / "presets.py").is_file():
            if root == code_root:
                return None
            msg = (
                f"warning: srpo runs the code in {code_root}, not this checkout {root}: edits here do not "
                "reach the run (`pip install -e .` here, or run `python -m srpo_cli` from here)"
            )
            typer.echo(msg, err=True)
            return msg
    return None


def _parse_env_kwargs(items: list[str] | None) -> dict[str, Any]:
    """``--env-kwarg KEY=VALUE`` pairs (:func:`srpo_common.parse_kv`) as a usage error when malformed."""
    try:
        return parse_kv(items, option="--env-kwarg")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command("eval")
def eval_cmd(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Model directory (transformers format), hub id owner/name (cached, or downloaded), or "
            "openai:NAME, a model served over the OpenAI-compatible API at --base-url (openai: alone: the "
            "server's only model).",
        ),
    ],
    suite: Annotated[
        str,
        typer.Option(
            help="Suite: math, math-routed, search, search-routed, quick-math, quick-columns, "
            "quick-columns-routed, quick-search."
        ),
    ] = "quick-math",
    workflow: Annotated[
        str | None, typer.Option(help="Env workflow (default: the suite's, e.g. proposers-aggregator).")
    ] = None,
    k: Annotated[
        int | None,
        typer.Option(
            "--k", min=1, help="Samples per problem (Avg@k, pass@k); default: the suite's (16 for math)."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most N problems per dataset.")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: MODEL/eval/<suite>-<workflow>-k<k>).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Run seed (sampling seeds derive from it).")] = 0,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated seeds (overrides --seed): one eval each, then ± and CIs over them."
        ),
    ] = None,
    method: Annotated[
        str | None, typer.Option(help="Row name in paper tables (default: --algorithm, else MODEL's name).")
    ] = None,
    index: Annotated[
        Path | None, typer.Option(help="Search suites: a `srpo index build` directory to retrieve from.")
    ] = None,
    retriever_url: Annotated[
        str | None, typer.Option(help="Search suites: a Search-R1-compatible /retrieve server URL.")
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (<= 0: greedy).")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens per response.")] = 256,
    chunk_size: Annotated[int, typer.Option(min=1, help="Problems per rollout batch and cache file.")] = 16,
    datasets: Annotated[
        list[str] | None, typer.Option("--dataset", help="Evaluate only this dataset (repeatable).")
    ] = None,
    env_kwarg: Annotated[
        list[str] | None, typer.Option("--env-kwarg", help="Extra env kwarg KEY=VALUE (repeatable).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="torch device (default: cpu).")] = None,
    backend: Annotated[str, typer.Option(help="Generation backend: hf (transformers) or vllm.")] = "hf",
    vllm_dtype: Annotated[
        str,
        typer.Option(
            help="--backend vllm: the engine's dtype: auto (vLLM's choice: bf16/fp16 for a float32 "
            "checkpoint), float32 (the hf backend's numerics), bfloat16, float16."
        ),
    ] = "auto",
    workers: Annotated[
        int, typer.Option(min=0, help="Ray rollout workers, each with its own model copy (0: this process).")
    ] = 0,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Join this Ray cluster for --workers (default: $RAY_ADDRESS, else a local Ray)."),
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Resumable sample cache (default: OUT/cache).")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not cache or resume.")] = False,
    algorithm: Annotated[
        str | None, typer.Option(help="Also write a leaderboard record.json under this algorithm name.")
    ] = None,
    model_id: Annotated[
        str | None, typer.Option(help="Model id for the record (default: MODEL's name).")
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    base_url: Annotated[
        list[str] | None,
        typer.Option(
            "--base-url",
            help="openai: models: the API root, e.g. http://127.0.0.1:8000/v1; ROLE=URL gives a role its own "
            "server (repeatable; one plain URL serves the other roles).",
        ),
    ] = None,
    api: Annotated[str, typer.Option(help="openai: models: auto, chat or completions.")] = "auto",
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="openai: models: tokenise prompts here and send ids (exact prompt ids; token counts "
            "for servers that return none)."
        ),
    ] = None,
    max_concurrency: Annotated[int, typer.Option(min=1, help="openai: models: requests in flight.")] = 8,
    api_key_env: Annotated[
        str, typer.Option(help="openai: models: the environment variable holding the API key.")
    ] = "OPENAI_API_KEY",
) -> None:
    """Evaluate MODEL (shared by every role) on a suite; print the table and write results."""
    from agents.policy import PolicyMap, SamplingParams
    from benchmarks.evaluate import evaluate, print_table
    from benchmarks.suites import get_suite

    try:
        the_suite = get_suite(suite)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="--suite") from None
    workflow = workflow or the_suite.default_workflow
    for ds in the_suite.datasets:
        if workflow not in ds.workflows:
            raise typer.BadParameter(
                f"{workflow!r} does not apply to dataset {ds.name!r}; choose one of {', '.join(ds.workflows)}",
                param_hint="--workflow",
            )
    from agents.openai_policy import parse_model_spec
    from benchmarks.model_source import ModelNotAvailable, resolve_model

    served = parse_model_spec(model)  # openai:NAME: a served model, no local weights
    if served is not None:
        if not base_url:
            raise typer.BadParameter("an openai: model needs --base-url URL", param_hint="--base-url")
        if workers > 0 or backend != "hf":
            raise typer.BadParameter("an openai: model is generated by its server: drop --workers/--backend")
    try:
        model_dir = resolve_model(model) if served is None else Path(model)
    except ModelNotAvailable as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    k = k if k is not None else (the_suite.default_k or 4)
    seed_list = _seeds(seeds) if seeds is not None else [seed]
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise typer.BadParameter(f"--seeds must be distinct integers, got {seeds!r}", param_hint="--seeds")
    extra_env = _parse_env_kwargs(env_kwarg)
    if index is not None or retriever_url is not None:
        if any(ds.family != "search" for ds in the_suite.datasets):
            raise typer.BadParameter("--index/--retriever-url apply to search suites only")
        if index is not None and retriever_url is not None:
            raise typer.BadParameter("pass --index or --retriever-url, not both")
        if index is not None:
            from srpo_envs.index_build import read_manifest

            try:
                read_manifest(index)
            except (FileNotFoundError, ValueError) as exc:
                raise typer.BadParameter(str(exc), param_hint="--index") from None
            extra_env["index"] = str(index.resolve())
        else:
            extra_env["retriever_url"] = retriever_url
    local = served is None and Path(model).expanduser().is_dir()
    base = model_dir if local else Path("runs") / model.replace("/", "--").replace(":", "--")
    out_dir = out if out is not None else base / "eval" / f"{the_suite.name}-{workflow}-k{k}"
    try:
        sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    if backend not in ("hf", "vllm"):
        raise typer.BadParameter(f"--backend must be hf or vllm, got {backend!r}", param_hint="--backend")
    weights = weights_sha256(model_dir) if served is None else None
    collector_factory = None
    if served is not None:
        from agents.openai_policy import served_policies

        try:
            policy = served_policies(
                served,
                base_url or [],
                cache_dir=None if no_cache else (cache_dir or out_dir / "cache"),
                api=api,
                tokenizer=tokenizer,
                max_concurrency=max_concurrency,
                api_key_env=api_key_env,
            )
        except ValueError as exc:  # a malformed URL; a server that fails or serves another model is an
            # OpenAIServerError: srpo's external-service exit status, naming the server (srpo_cli.app)
            raise typer.BadParameter(str(exc), param_hint="--base-url") from None
    elif workers > 0:  # the model lives in the Ray workers only; the driver keeps a stand-in for identities
        from agents.engines import engine_factory, engine_gpus
        from agents.ray_rollout import RemotePolicy, RolloutWorkerPool

        factory = engine_factory(backend, model_dir, device=device if backend == "hf" else None)
        pool = RolloutWorkerPool(factory, workers, ray_address=ray_address, num_gpus=engine_gpus(backend))
        policy = RemotePolicy(str(model_dir), eval_cache_key=weights)

        def collector_factory(env_fn, _policies, sampling):  # noqa: ANN001, ANN202 - evaluate's protocol
            return pool.collector(env_fn, sampling)
    else:  # in this process (agents.engines: the choice training rollouts make too)
        from agents.engines import local_engine

        policy = local_engine(backend, model_dir, **({"dtype": vllm_dtype} if backend == "vllm" else {"device": device}))
    name = method or algorithm or (model_dir.resolve().name if local else model)
    identity = weights or (str(model_dir.resolve()) if served is None else None)
    results = []
    for run_seed in seed_list:
        seed_dir = out_dir if len(seed_list) == 1 else out_dir / f"seed{run_seed}"
        result = evaluate(
            policy if isinstance(policy, PolicyMap) else PolicyMap.shared(policy),
            the_suite,
            workflow,
            k,
            sampling=sampling,
            limit=limit,
            seed=run_seed,
            cache_dir=None if no_cache else (cache_dir or out_dir / "cache"),
            env_kwargs=extra_env,
            progress=progress,
            chunk_size=chunk_size,
            datasets=datasets,
            cache_key=identity,  # served models: the policies' eval_cache_key (server URL, model, api)
            collector_factory=collector_factory,
        )
        result.run_info["model"] = (
            {"path": str(model_dir.resolve()), "weights_sha256": weights, "device": device}
            if served is None
            else {"served": model, "base_url": list(base_url or []), "api": api, "weights_sha256": None}
        )
        result.run_info["rollout"] = {"backend": backend if served is None else "openai", "workers": workers}
        result.run_info["method"] = name
        print_table(result)
        if workflow == "routed":
            typer.echo(f"team size K per attempt (counts):\n{result.k_histogram().to_string()}")
        paths = result.save(seed_dir)
        typer.echo(f"wrote {paths['json']}")
        typer.echo(f"wrote {paths['parquet']} and {paths['csv']}")
        if "k_histogram" in paths:
            typer.echo(f"wrote {paths['k_histogram']}")
        results.append(result)
    if len(results) > 1:
        from benchmarks.paper import paper_tables, run_from_result, write_paper

        runs = [run_from_result(r, name) for r in results]
        pt = paper_tables(runs)
        typer.echo(pt.markdown())
        for kind, path in write_paper(pt, out_dir, runs).items():
            typer.echo(f"wrote {kind}: {path}")
        if algorithm is not None:
            typer.echo("a leaderboard record holds one seed: writing it for the first seed only")
            result = results[0]
    if algorithm is not None:
        from benchmarks.evidence import record_evidence
        from leaderboards.schema import dump_record_json
        from srpo_common import atomic_write_text

        record = result.to_record(  # the per-sample evidence goes to OUT/samples/<sha256>.jsonl
            algorithm,
            model_id=model_id or (model_dir.resolve().name if served is None else model),
            weights_sha256=weights,
            **record_evidence([result], out_dir),
        )
        path = atomic_write_text(out_dir / "record.json", dump_record_json(record))
        typer.echo(f"wrote {path} ({record.short_hash})")


def _training_env(suite: str) -> TrainingEnv:
    # presets are read when a command runs, not bound at import: a patched or reloaded presets module
    # reaches the run (the names imported above are only re-exports)
    if suite not in presets.TRAINING_ENVS:
        raise typer.BadParameter(
            f"no training env for suite {suite!r}; trainable suites: {', '.join(presets.TRAINING_ENVS)}",
            param_hint="--suite",
        )
    return presets.TRAINING_ENVS[suite]


def _print_comparison(result: Any, title: str) -> None:
    from rich.table import Table

    from benchmarks.report import make_console

    table = Table(title=title)
    for col in result.table.columns:
        table.add_column(str(col), justify="left" if col == "variant" else "right")
    for row in result.table.itertuples(index=False):
        table.add_row(*[str(v) for v in row])
    console = make_console()
    console.print(table)
    _print_decisions(result.decisions, title, console)


def _print_decisions(decisions: Any, title: str, console: Any = None) -> None:
    """Every variant vs the reference (:mod:`benchmarks.decide`), whole, with how to read it."""
    from rich.table import Table

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


_KEEP_CHECKPOINTS_HELP = (
    "Keep each run's last checkpoint (~30 MB per run for the tiny models): rerunning the same command with "
    "a larger --iterations in the same --out continues every run instead of starting over."
)


_CONTINUE_FROM_HELP = (
    "A finished comparison (its --out) of the same settings but fewer iterations: each run starts from its "
    "run of the same variant and seed there (exported weights, fresh AdamW moments) and trains the "
    "iterations after it; gains are still measured against --model."
)


def _run_compare(
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
    from benchmarks.compare import CompareConfig, check_continuation, reference_of, run_comparison
    from benchmarks.model_source import ModelNotAvailable, resolve_model

    env = _training_env(suite)
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
    _print_comparison(result, title)
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
    from learners.trainer import TrainConfig

    if opts.filter_signal is not None and opts.filter_signal not in FILTER_SIGNALS:
        raise typer.BadParameter(
            f"--filter-signal must be one of {', '.join(FILTER_SIGNALS)}, got {opts.filter_signal!r}"
        )
    train = resolved_train(opts, _preset_train(opts.suite))
    train = _with_logger({k: v for k, v in train.items() if k != "logger"}, train.get("logger"))
    try:
        TrainConfig(model="-", **train)
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(f"[train]: {exc}", param_hint="--set train.*") from None
    return train


def _required_model(opts: CompareOptions) -> str:
    if not opts.model:
        raise typer.BadParameter("give --model (or model in the experiment file's [compare])", param_hint="--model")
    return opts.model



def _eval_settings(suite: str, k: int | None, limit: int | None) -> tuple[int, int]:
    """``--eval-k`` / ``--eval-limit`` as given, else the suite's decision eval (``presets.DECISION_EVAL``),
    else its ``bench quick`` eval, else :func:`_eval_k`'s default and ``COMPARE_DEFAULTS["eval_limit"]``."""
    quick = presets.DECISION_EVAL.get(suite) or presets.QUICK_SETTINGS.get(suite, {})
    k = k if k is not None else quick.get("eval_k")
    default_limit = presets.COMPARE_DEFAULTS["eval_limit"]
    limit = limit if limit is not None else quick.get("eval_limit", default_limit)
    return _eval_k(suite, k), int(limit)


_PRESET_HELP = "default: the suite's bench quick setting (benchmarks/presets.py), else the quick preset"
_EVAL_K_HELP = (
    "eval samples per problem (default: the suite's presets.DECISION_EVAL k, else its bench quick k, "
    "else 16 for math suites, else 2)"
)
_EVAL_LIMIT_HELP = (
    "eval problems per dataset (default: the suite's presets.DECISION_EVAL limit, else its bench quick "
    "limit, else 32)"
)
_ROWS_HELP = "rows per minibatch (an iteration's rows / this = optimizer steps; replaces the preset's split)"
_EPOCHS_HELP = "passes over each rollout batch (> 1: off-policy updates; default: the suite's preset)"
_MINIBATCHES_HELP = "split each rollout batch into this many minibatches (overrides --rows-per-batch)"
_CLIP_HELP = "ratio clip range shared by every variant (default: TrainConfig's 0.2)"
_FILTER_SIGNAL_HELP = (
    "dynamic sampling keeps a group whose rewards differ (reward) or whose outcomes differ (correct, "
    "DAPO's rule); default: the suite's preset, else TrainConfig's reward"
)
_TRAIN_ENV_KWARG_HELP = (
    "training env kwarg KEY=VALUE over the suite's (repeatable; VALUE is JSON when it parses, e.g. "
    "kb_seed=[3,4,5]); evaluation stays on the suite's held-out split"
)
_WORKERS_HELP = (
    "train/evaluate this many runs at a time as Ray tasks, each with an equal share of the cores "
    "(0: one after another in this process)"
)
_RAY_ADDRESS_HELP = "Ray cluster for --workers (default: $RAY_ADDRESS, else a local Ray)"
_SEEDS_HELP = "comma-separated seeds (default: the suite's presets.DECISION_SEEDS, else {})"
_REFERENCE_HELP = (
    "variant every other one is compared with in decisions.md/.csv (default: srpo, else the first)"
)
_LOGGER_HELP = (
    "each run's metrics also to these (comma-separated; TrainConfig.logger, learners/tracking.py): console, "
    "tensorboard, wandb (offline unless WANDB_MODE is set), mlflow (the run's mlflow.db unless "
    "MLFLOW_TRACKING_URI is set); runs/<variant>-s<seed>/metrics.jsonl is always written"
)


def _with_logger(train: dict[str, Any], logger: str | None) -> dict[str, Any]:
    """``train`` with ``--logger`` as its ``logger`` override (checked here: a typo fails before any run)."""
    if logger is None:
        return train
    from learners.tracking import parse_loggers

    try:
        return {**train, "logger": ",".join(parse_loggers(logger))}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--logger") from None


def _eval_k(suite: str, k: int | None) -> int:
    """``--k`` as given, else the suite's paper default (16 for math) or the quick default (2)."""
    from benchmarks.suites import get_suite

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
        return _seeds(given)
    n = presets.DECISION_SEEDS.get(suite)
    return list(range(n)) if n else _seeds(fallback)


def _seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


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
    k, limit = _eval_settings(opts.suite, opts.eval_k, opts.eval_limit)
    _run_compare(
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


@app.command("compare")
@_compare_command(AlgoCompareOptions, helps={"suite": _SUITE_HELP})
def compare_cmd(opts: AlgoCompareOptions) -> None:
    """Train each algorithm for each seed from MODEL and compare before/after accuracy; decide each
    algorithm against the reference (decisions.md / decisions.csv)."""
    _required_model(opts)  # a missing --model is reported before an unknown algorithm
    names = [a.strip() for a in opts.algos.split(",") if a.strip()]
    try:
        variants = presets.algorithm_variants(names)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--algos") from None
    _compare_from_options(opts, variants, COMPARE_DEFAULTS["seeds"], f"{opts.suite}: algorithms")


@app.command("ablation")
@_compare_command(
    CompareOptions,
    defaults={"out": Path("runs/ablation")},
    helps={"suite": _SUITE_HELP, "reference": "variant the others are compared with (default: sqrt)"},
)
def ablation_cmd(opts: CompareOptions) -> None:
    """The SRPO set-normalisation ablation: sqrt (default), sum, mean and K=1, each decided against
    the reference (decisions.md / decisions.csv)."""
    from benchmarks.presets import ABLATIONS

    _compare_from_options(
        opts, dict(ABLATIONS), COMPARE_DEFAULTS["ablation_seeds"], "SRPO normalisation ablation"
    )


@app.command("report")
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
    reference: Annotated[str | None, typer.Option(help=_REFERENCE_HELP)] = None,
) -> None:
    """Print the paper's table layout (methods x benchmarks + Avg., ± over seeds, bootstrap CIs)
    from the per-sample records saved under RUN_DIRS; write it as markdown, CSV and a bar plot."""
    from benchmarks.decide import decision_frame, write_decisions  # light: no torch import
    from benchmarks.paper import load_runs, paper_tables, write_paper
    from benchmarks.strata import strata_frame, strata_markdown, suite_strata, write_strata
    from benchmarks.suites import SUITES

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
    _print_decisions(decisions, pt.suite)
    if not by_hop.empty:
        typer.echo(strata_markdown(by_hop, pt.suite))
    written = {
        **write_paper(pt, out or run_dirs[0], runs),
        **write_decisions(decisions, out or run_dirs[0], pt.suite),
        **write_strata(by_hop, out or run_dirs[0], pt.suite),
    }
    for kind, path in written.items():
        typer.echo(f"wrote {kind}: {path}")


@app.command("power")
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
    from benchmarks.evidence import suite_problems
    from benchmarks.power import power_report
    from srpo_common import atomic_write_text

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
        env = _training_env(suite)
        train = _comparison_train(opts)
        seeds = _seeds(opts.seeds or "0,1,2")
        k, limit = _eval_settings(suite, eval_k, eval_limit)
        _run_compare(
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


@app.command("quick")
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
    workers: int = typer.Option(QUICK_WORKERS, min=0, help=_WORKERS_HELP),
    ray_address: str | None = typer.Option(None, help=_RAY_ADDRESS_HELP),
    reference: str = typer.Option("srpo", help=_REFERENCE_HELP),
) -> None:
    """The main job: warm-started tiny models -> SRPO, GRPO, MAPPO per suite -> tables, records, page,
    and each algorithm decided against the reference (decisions.md / decisions.csv per suite)."""
    import contextlib
    import time

    start = time.perf_counter()
    names = [x.strip() for x in suites.split(",") if x.strip()]
    for name in names:
        _training_env(name)
    with contextlib.ExitStack() as stack:
        if workers > 0:  # one Ray for every suite's runs (each compare would otherwise start its own)
            from agents.ray_rollout import ensure_ray, shutdown_ray
            from benchmarks.compare import worker_threads

            ensure_ray(ray_address, num_cpus=workers * worker_threads(workers))
            stack.callback(shutdown_ray)
        results = _quick_suites(
            names,
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
    for name, path in sorted(_merge_quick_outputs(out, results).items()):
        typer.echo(f"wrote {name}: {path}")
    typer.echo(f"bench quick finished in {time.perf_counter() - start:.0f}s")


def _quick_suites(
    names: list[str],
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
    """Each suite of ``bench quick`` from its warm start: SRPO, GRPO and MAPPO x seeds, before/after."""
    from benchmarks.presets import ALGORITHMS

    results: dict[str, Any] = {}
    for name in names:
        env = presets.TRAINING_ENVS[name]
        given = _given_warm_start(env.recipe, model, search_model, columns_model)
        warm = given or (
            env.bundled_model
            if (env.bundled_model / "config.json").exists()
            else _build_model(out / f"model-{env.recipe}", env.recipe)
        )
        typer.echo(f"{name}: warm start {warm}")
        settings = _quick_settings(name)
        train = {**settings["train"], "iterations": iterations or settings["train"]["iterations"]}
        results[name] = _run_compare(
            warm,
            out / name,
            dict(ALGORITHMS),
            _seeds(seeds) if seeds is not None else list(settings.get("seeds", presets.QUICK_SEEDS)),
            name,
            train,
            settings["eval_k"],
            eval_limit or settings["eval_limit"],
            f"{name}: held-out Avg@{settings['eval_k']} before -> after RL (mean ± std over seeds)",
            workers,
            ray_address,
            reference,
        )
    return results


def _given_warm_start(
    recipe: str, model: Path | None, search_model: Path | None, columns_model: Path | None
) -> Path | None:
    """The ``bench quick`` option that names a suite's warm start, by its recipe's family: every search
    recipe (search, search-worlds, search-worlds-routed) takes ``--search-model``, every column recipe
    ``--columns-model``, the math recipe ``--model``."""
    if recipe.startswith("search"):
        return search_model
    if recipe.startswith("columns"):
        return columns_model
    return model


_QUICK_SETTING_KEYS = frozenset({"train", "eval_k", "eval_limit", "seeds"})


def _quick_settings(suite: str) -> dict[str, Any]:
    """``presets.QUICK_SETTINGS[suite]``, refused with a one-line error when it holds a key ``bench quick``
    would silently ignore (an ``lr`` beside ``train`` instead of inside it never reaches the run) or a
    ``train`` key that is no ``TrainConfig`` field."""
    import dataclasses

    from learners.trainer import TrainConfig

    settings = presets.QUICK_SETTINGS[suite]
    stray = sorted(set(settings) - _QUICK_SETTING_KEYS)
    unknown = sorted(set(settings["train"]) - {f.name for f in dataclasses.fields(TrainConfig)})
    if stray or unknown:
        raise typer.BadParameter(
            f"benchmarks/presets.py QUICK_SETTINGS[{suite!r}]: "
            + (f"keys {stray} are not read (RL settings go under 'train'); " if stray else "")
            + (f"train keys {unknown} are no TrainConfig fields" if unknown else ""),
        )
    return settings


def _merge_quick_outputs(out: Path, results: dict[str, Any]) -> dict[str, Path]:
    """Top-level files of ``bench quick``: every suite's records, one leaderboard, one curves figure."""
    import pandas as pd

    from benchmarks.compare import decisions_markdown, write_records
    from benchmarks.report import plot_suite_panels, to_markdown, write_csv
    from srpo_common import atomic_write_text

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
    from learners.sft import warm_start

    warm_start(out, recipe, log=typer.echo)
    return out
