"""Command line for srpo_envs (wired into ``srpo`` by the lead). Commands:

``serve-retriever``: a Search-R1-compatible ``/retrieve`` server over BM25 or dense retrieval.
``serve-env``: any registered env over HTTP, one session per client (:mod:`srpo_envs.env_server`).
``index build``: index a Search-R1-format corpus (JSONL with ``id`` and ``contents``) once into a
directory that ``--index DIR`` (envs, ``srpo bench eval``, ``serve-retriever``) opens.
"""

from __future__ import annotations

import functools
import logging
import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

import srpo_envs
from srpo_envs import retrievers
from srpo_envs.index_build import build_index, open_index
from srpo_envs.retrievers import ServerLimits
from srpo_envs.tasks.search_data import bundled_corpus_path

if TYPE_CHECKING:
    from srpo_envs.retrievers import Retriever

app = typer.Typer(help="srpo environments: task data and retrieval services.", no_args_is_help=True)


@app.callback()
def _main() -> None:
    """srpo environments: task data and retrieval services."""  # keeps subcommands named even if only one


index_app = typer.Typer(help="Build retrieval indexes for full-size corpora.", no_args_is_help=True)
app.add_typer(index_app, name="index")


class Backend(StrEnum):
    bm25 = "bm25"
    dense = "dense"


@app.command("serve-retriever")
def serve_retriever(
    corpus: Path | None = typer.Option(
        None,
        help="Corpus JSONL(.gz) with id/title/text per line. Default: the bundled 22,633-passage corpus.",
    ),
    index: Path | None = typer.Option(
        None,
        help="A directory from `srpo index build` (its corpus and backend; --corpus overrides the path).",
    ),
    backend: Backend = typer.Option(Backend.bm25, help="Retrieval backend."),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default: the server has no auth)."),
    port: int = typer.Option(8000, help="TCP port (Search-R1's default is 8000)."),
    model: str | None = typer.Option(
        None, help="Dense only: sentence-transformers path or id (default: bundled MiniLM)."
    ),
    cache_dir: Path | None = typer.Option(
        None, help="Index/embedding cache (default: $SRPO_CACHE_DIR or ~/.cache/srpo)."
    ),
    max_concurrency: int = typer.Option(
        4, min=1, help="Requests searched at once (merged into one backend call by the search thread)."
    ),
    max_pending: int = typer.Option(256, min=1, help="Requests admitted before answering 503 busy."),
    max_queries: int = typer.Option(256, min=1, help="Most queries in one request."),
    threads: int | None = typer.Option(
        None,
        min=1,
        help="BM25 only: Lucene search threads per batch, per worker (default: CPUs / workers, <= 8).",
    ),
    workers: int = typer.Option(
        1,
        min=1,
        help="Server processes on one port, each with its own retriever (JVM) and search thread. "
        "More than 1 spreads HTTP work and searches over cores (one worker keeps ~1.3 cores busy: "
        "on 2 cores 2 workers served 1.5x one, benchmarks/perf/bench_server.py); memory grows per worker.",
    ),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    idle_timeout: float = typer.Option(
        5.0, min=0.001, help="Seconds before an idle connection (no request yet, headers unfinished) closes."
    ),
) -> None:
    """Serve POST /retrieve {"queries", "topk", "return_scores"} and GET /health (Search-R1 format)."""
    from srpo_envs.retrievers.server import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if max_pending < max_concurrency:
        raise typer.BadParameter("--max-pending must be >= --max-concurrency")
    if model is not None and backend is not Backend.dense:
        raise typer.BadParameter("--model only applies to --backend dense")
    if backend is Backend.bm25 and threads is None and workers > 1:
        threads = max(1, min(8, (os.cpu_count() or 1) // workers))
    factory = functools.partial(
        build_retriever,
        backend.value,
        corpus,
        index=index,
        cache_dir=cache_dir,
        model=model,
        threads=threads if backend is Backend.bm25 else None,
    )
    try:
        retriever = factory()  # with workers: builds the index once, up front, and checks the arguments
    except (FileNotFoundError, ValueError) as exc:
        raise typer.BadParameter(
            str(exc), param_hint="--index" if index is not None else "--corpus"
        ) from None
    typer.echo(
        f"{backend.value}: {retriever.num_passages} passages; serving on http://{host}:{port}/retrieve"
        + (f" with {workers} worker processes" if workers > 1 else ""),
        err=True,
    )
    if workers > 1:
        retriever.close()
    try:
        serve(
            retriever if workers == 1 else factory,
            host,
            port,
            workers=workers,
            max_concurrency=max_concurrency,
            max_pending=max_pending,
            limits=ServerLimits(max_queries=max_queries),
            log_level=log_level,
            idle_timeout_s=idle_timeout,
        )
    finally:
        if workers == 1:
            retriever.close()


@app.command("serve-env")
def serve_env(
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default: the server has no auth)."),
    port: int = typer.Option(8100, help="TCP port."),
    max_sessions: int = typer.Option(64, min=1, help="Live sessions at once (another create gets 503)."),
    idle_timeout: float = typer.Option(
        600.0, min=0.001, help="Seconds a session may idle before it is closed (its id then answers 404)."
    ),
    env: list[str] | None = typer.Option(
        None, "--env", help="Serve only this env id (repeatable; default: every registered id)."
    ),
    openenv_env: str | None = typer.Option(
        None,
        "--openenv-env",
        help="The env an OpenEnv client (/ws, /reset, /step) gets when its reset names no env_id "
        "(default: the only --env, when one is given).",
    ),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Serve registered envs over HTTP: sessions with reset/step/state, and OpenEnv's wire protocol (/ws).

    Clients: ``srpo_envs.remote.RemoteEnv(URL, ENV_ID)``, a PettingZoo ParallelEnv; OpenEnv's
    ``GenericEnvClient(base_url=URL)`` (multi-agent actions ``{"actions": {agent: text}}``).
    """
    try:
        from srpo_envs.env_server import serve
    except ImportError as exc:  # fastapi/uvicorn come with the search extra
        raise typer.BadParameter(f"serve-env needs fastapi and uvicorn: pip install 'srpo[search]' ({exc})") from None

    unknown = [e for e in env or [] if e not in srpo_envs.registry]
    if unknown:
        raise typer.BadParameter(f"unknown env ids {unknown}; see `srpo envs`", param_hint="--env")
    if openenv_env is not None and (openenv_env not in srpo_envs.registry or (env and openenv_env not in env)):
        raise typer.BadParameter(f"{openenv_env!r} is not a served env id", param_hint="--openenv-env")
    typer.echo(f"serving {', '.join(env) if env else 'every registered env'} on http://{host}:{port}", err=True)
    serve(
        host,
        port,
        max_sessions=max_sessions,
        idle_timeout_s=idle_timeout,
        env_ids=env,
        log_level=log_level,
        openenv_env_id=openenv_env,
    )


def build_retriever(
    backend: str,
    corpus: Path | None,
    *,
    index: Path | None = None,
    cache_dir: Path | None = None,
    model: str | None = None,
    threads: int | None = None,
) -> Retriever:
    """The retriever ``serve-retriever`` serves (module-level, so a worker process can rebuild it)."""
    if index is not None:
        return open_index(index, corpus, threads=threads)

    kwargs: dict[str, object] = {"cache_dir": cache_dir}
    if backend == Backend.dense:
        kwargs["model"] = model
    elif threads is not None:
        kwargs["threads"] = threads
    # looked up on the package at call time: the seam a test (or a plugin) replaces
    return retrievers.make_retriever(backend, corpus or bundled_corpus_path(cache_dir), **kwargs)


@index_app.command("build")
def index_build(
    corpus: Path = typer.Option(
        ..., help='Corpus JSONL(.gz), Search-R1 format: one {"id", "contents"} (or id/title/text) per line.'
    ),
    out: Path = typer.Option(..., help="Index directory to create (or resume)."),
    backend: Backend = typer.Option(
        Backend.bm25, help="bm25: Lucene via pyserini; dense: embeddings + faiss."
    ),
    batch_size: int = typer.Option(50_000, min=1, help="Passages per shard (the unit of resume)."),
    threads: int | None = typer.Option(
        None, min=1, help="BM25: Lucene indexing threads (default: CPUs, <= 8)."
    ),
    model: str | None = typer.Option(None, help="Dense: sentence-transformers path or id (default: MiniLM)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Index CORPUS into OUT once; open it later with --index OUT (envs, bench eval, serve-retriever)."""

    if not corpus.is_file():
        raise typer.BadParameter(f"{corpus} does not exist", param_hint="--corpus")
    if model is not None and backend is not Backend.dense:
        raise typer.BadParameter("--model only applies to --backend dense")
    try:
        m = build_index(
            corpus,
            out,
            backend=backend.value,
            batch_size=batch_size,
            threads=threads,
            model=model,
            progress=progress,
            log=lambda s: typer.echo(s, err=True),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--corpus") from None
    typer.echo(
        f"{m['backend']} index of {m['num_passages']} passages in {out}: {m['seconds']:.1f}s "
        f"({m['seconds_per_1k_passages']:.3f}s per 1k passages)"
    )


if __name__ == "__main__":
    app()
