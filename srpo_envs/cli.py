"""Command line for srpo_envs (wired into ``srpo`` by the lead). Commands:

``serve-retriever``: a Search-R1-compatible ``/retrieve`` server over BM25 or dense retrieval.
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


class Backend(StrEnum):
    bm25 = "bm25"
    dense = "dense"


@app.command("serve-retriever")
def serve_retriever(
    corpus: Path | None = typer.Option(
        None,
        help="Corpus JSONL(.gz) with id/title/text per line. Default: the bundled 22,633-passage corpus.",
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
    max_concurrency: int = typer.Option(4, min=1, help="Backend calls in flight at once."),
    max_pending: int = typer.Option(256, min=1, help="Requests admitted before answering 503 busy."),
    max_queries: int = typer.Option(256, min=1, help="Most queries in one request."),
    threads: int | None = typer.Option(None, min=1, help="BM25 only: Lucene search threads per batch."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
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
    retriever = make_retriever(backend.value, corpus, **kwargs)
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
        )
    finally:
        retriever.close()


if __name__ == "__main__":
    app()
