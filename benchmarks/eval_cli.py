"""``srpo bench eval``: evaluate one model on a benchmark suite.

The model (a directory, a hub id, or ``openai:NAME`` served over the OpenAI-compatible API) plays every
role; :func:`benchmarks.evaluate.evaluate` runs with a resumable cache under the output directory; the
command prints the table and writes ``eval.json`` (summary + everything needed to reproduce), the
per-sample records (``eval_samples.parquet`` / ``.csv``) and, with ``--algorithm``, a validated
leaderboard record. Several ``--seeds`` add the paper tables over them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from agents.engines import engine_factory, engine_gpus, local_engine
from agents.openai_policy import parse_model_spec, served_policies
from agents.policy import PolicyMap, SamplingParams
from agents.ray_rollout import RemotePolicy, RolloutWorkerPool
from benchmarks.model_source import ModelNotAvailable, resolve_model
from benchmarks.options import parse_seeds
from benchmarks.suites import get_suite
from leaderboards.schema import dump_record_json
from srpo_common import atomic_write_text, parse_kv, weights_sha256
from srpo_envs.index_build import read_manifest


def _parse_env_kwargs(items: list[str] | None) -> dict[str, Any]:
    """``--env-kwarg KEY=VALUE`` pairs (:func:`srpo_common.parse_kv`) as a usage error when malformed."""
    try:
        return parse_kv(items, option="--env-kwarg")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None



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
    # pandas (and scipy) load here, not at start-up: +0.2 s on every srpo command otherwise
    from benchmarks.evaluate import evaluate, print_table

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
    seed_list = parse_seeds(seeds) if seeds is not None else [seed]
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise typer.BadParameter(f"--seeds must be distinct integers, got {seeds!r}", param_hint="--seeds")
    extra_env = _parse_env_kwargs(env_kwarg)
    if index is not None or retriever_url is not None:
        if any(ds.family != "search" for ds in the_suite.datasets):
            raise typer.BadParameter("--index/--retriever-url apply to search suites only")
        if index is not None and retriever_url is not None:
            raise typer.BadParameter("pass --index or --retriever-url, not both")
        if index is not None:
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

        factory = engine_factory(backend, model_dir, device=device if backend == "hf" else None)
        pool = RolloutWorkerPool(factory, workers, ray_address=ray_address, num_gpus=engine_gpus(backend))
        policy = RemotePolicy(str(model_dir), eval_cache_key=weights)

        def collector_factory(env_fn, _policies, sampling):  # noqa: ANN001, ANN202 - evaluate's protocol
            return pool.collector(env_fn, sampling)
    else:  # in this process (agents.engines: the choice training rollouts make too)

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

        record = result.to_record(  # the per-sample evidence goes to OUT/samples/<sha256>.jsonl
            algorithm,
            model_id=model_id or (model_dir.resolve().name if served is None else model),
            weights_sha256=weights,
            **record_evidence([result], out_dir),
        )
        path = atomic_write_text(out_dir / "record.json", dump_record_json(record))
        typer.echo(f"wrote {path} ({record.short_hash})")

