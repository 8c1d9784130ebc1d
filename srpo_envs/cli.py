"""Command line for srpo_envs (wired into ``srpo`` by the lead). Commands:

``serve-retriever``: a Search-R1-compatible ``/retrieve`` server over BM25 or dense retrieval.
``index build``: index a Search-R1-format corpus (JSONL with ``id`` and ``contents``) once into a
directory that ``--index DIR`` (envs, ``srpo bench eval``, ``serve-retriever``) opens.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path

import typer

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
    threads: int | None = typer.Option(None, min=1, help="BM25 only: Lucene search threads per batch."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    idle_timeout: float = typer.Option(
        5.0, min=0.001, help="Seconds before an idle connection (no request yet, headers unfinished) closes."
    ),
) -> None:
    """Serve POST /retrieve {"queries", "topk", "return_scores"} and GET /health (Search-R1 format)."""
    from srpo_envs.retrievers import ServerLimits, make_retriever
    from srpo_envs.retrievers.server import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if max_pending < max_concurrency:
        raise typer.BadParameter("--max-pending must be >= --max-concurrency")
    kwargs: dict[str, object] = {"cache_dir": cache_dir}
    if backend is Backend.dense:
        kwargs["model"] = model
    elif threads is not None:
        kwargs["threads"] = threads
    if model is not None and backend is not Backend.dense:
        raise typer.BadParameter("--model only applies to --backend dense")
    if index is not None:
        from srpo_envs.index_build import open_index

        try:
            retriever = open_index(index, corpus)
        except (FileNotFoundError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--index") from None
    else:
        from srpo_envs.tasks.search_data import bundled_corpus_path

        retriever = make_retriever(backend.value, corpus or bundled_corpus_path(cache_dir), **kwargs)
    typer.echo(
        f"{backend.value}: {retriever.num_passages} passages; serving on http://{host}:{port}/retrieve",
        err=True,
    )
    try:
        serve(
            retriever,
            host,
            port,
            max_concurrency=max_concurrency,
            max_pending=max_pending,
            limits=ServerLimits(max_queries=max_queries),
            log_level=log_level,
            idle_timeout_s=idle_timeout,
        )
    finally:
        retriever.close()


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
    from srpo_envs.index_build import build_index

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
