"""A Search-R1-compatible retrieval server (FastAPI) over any :class:`Retriever`.

Wire format (identical to Search-R1's ``retrieval_server.py``, so its training code and ours can
share one server)::

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    -> {"result": [[{"document": {"id", "title", "text", "contents"}, "score": 1.23}, ...], ...]}

With ``return_scores`` false each inner list holds the bare ``document`` objects. ``contents`` is
Search-R1's ``'"title"\\ntext'``; ``title``/``text`` are added for clients that want them split.

Hardening, because a policy under RL emits arbitrary strings and a trainer fires many requests:

* every malformed request is a clear 4xx (400 invalid JSON, 413 body too large, 422 wrong types,
  no/too many queries, blank or over-long query, ``topk`` out of ``1..max_topk``, too many
  results requested in total), never a 500;
* retrieval runs on a fixed pool of ``max_concurrency`` long-lived worker threads (long-lived
  because each thread that calls into the JVM attaches to it, and a thread that exits without
  detaching leaks its Java-side state - so no idle-timeout thread pools), and once
  ``max_pending`` requests are admitted further ones get 503 + ``Retry-After`` instead of piling up;
* any backend failure is a 503 with the exception's type and message, so clients retry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from srpo_envs.retrievers.base import Passage, Retriever, ServerLimits

log = logging.getLogger(__name__)


class RetrieveRequest(BaseModel):
    """The Search-R1 request body. Strict types: ``"5"``/``5.0``/``true`` are not a ``topk``."""

    model_config = ConfigDict(strict=True, extra="ignore")

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing (413) as soon as it exceeds ``limit`` - before buffering it all."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _HTTPError(413, f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _HTTPError(413, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes, limits: ServerLimits) -> RetrieveRequest:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _HTTPError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _HTTPError(422, 'request body must be a JSON object like {"queries": [...], "topk": 3}')
    try:
        req = RetrieveRequest.model_validate(payload)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
        raise _HTTPError(422, f"invalid request: {msgs}") from None
    n = len(req.queries)
    if n == 0:
        raise _HTTPError(422, "queries must be a non-empty list of strings")
    if n > limits.max_queries:
        raise _HTTPError(422, f"too many queries: {n} > {limits.max_queries}; split the batch")
    for i, q in enumerate(req.queries):
        if not q.strip():
            raise _HTTPError(422, f"queries[{i}] is empty or whitespace")
        if len(q) > limits.max_query_chars:
            raise _HTTPError(
                422, f"queries[{i}] has {len(q)} characters; the limit is {limits.max_query_chars}"
            )
    topk = limits.default_topk if req.topk is None else req.topk
    if not 1 <= topk <= limits.max_topk:
        raise _HTTPError(422, f"topk must be in 1..{limits.max_topk}, got {topk}")
    if n * topk > limits.max_results:
        raise _HTTPError(
            422, f"queries x topk = {n * topk} exceeds {limits.max_results}; lower topk or split"
        )
    return req.model_copy(update={"topk": topk})


def _render(results: list[list[Passage]], with_scores: bool) -> bytes:
    if with_scores:
        body = [[{"document": p.to_document(), "score": p.score} for p in hits] for hits in results]
    else:
        body = [[p.to_document() for p in hits] for hits in results]
    return json.dumps({"result": body}, ensure_ascii=False).encode("utf-8")


def create_app(
    retriever: Retriever,
    *,
    max_concurrency: int = 4,
    max_pending: int = 256,
    limits: ServerLimits | None = None,
) -> FastAPI:
    """Build the FastAPI app. ``max_concurrency`` = backend calls in flight at once (worker threads);
    ``max_pending`` = requests admitted (running + waiting) before new ones get 503.
    """
    if max_concurrency < 1 or max_pending < max_concurrency:
        raise ValueError("need max_concurrency >= 1 and max_pending >= max_concurrency")
    lim = limits or ServerLimits()
    executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="srpo-retrieve")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="srpo retriever", description=__doc__, lifespan=lifespan)
    state: dict[str, Any] = {"pending": 0, "served": 0, "failed": 0, "started": time.time()}

    @app.exception_handler(Exception)
    async def _backstop(request: Request, exc: Exception) -> JSONResponse:  # never a bare 500
        log.exception("unhandled error in retriever server")
        return _error(503, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "backend": retriever.name,
            "num_passages": retriever.num_passages,
            "max_concurrency": max_concurrency,
            "pending": state["pending"],
            "served": state["served"],
            "failed": state["failed"],
            "uptime_s": round(time.time() - state["started"], 1),
            "limits": asdict(lim),
        }

    @app.post(
        "/retrieve",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}},
            }
        },
    )
    async def retrieve(request: Request) -> Response:
        try:
            req = _parse(await _read_body(request, lim.max_body_bytes), lim)
        except _HTTPError as exc:
            return _error(exc.status, exc.message, exc.headers)
        if state["pending"] >= max_pending:
            return _error(503, f"server busy: {max_pending} requests in flight", {"Retry-After": "1"})
        state["pending"] += 1
        try:
            topk = req.topk or lim.default_topk  # _parse has already resolved None to the default

            def work() -> bytes:  # JSON encoding too runs off the event loop: a big response takes ~0.1 s
                return _render(retriever.search(req.queries, topk), req.return_scores)

            content = await asyncio.get_running_loop().run_in_executor(executor, work)
        except Exception as exc:
            state["failed"] += 1
            log.exception("retrieval backend failed")
            return _error(503, f"retrieval backend failed: {type(exc).__name__}: {str(exc)[:500]}")
        finally:
            state["pending"] -= 1
        state["served"] += 1
        return Response(content=content, media_type="application/json")

    return app


class BackgroundServer:
    """Run an app with uvicorn in a daemon thread (tests, benchmarks, in-process RL runs).

    ``port=0`` lets the OS pick a free port; ``url`` reports the bound one. Use as a context
    manager, or call :meth:`stop` - it asks uvicorn to exit and joins the thread.
    """

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not main thread
        self._thread = threading.Thread(target=self._server.run, name="srpo-retriever-server", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"retriever server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    max_concurrency: int = 4,
    max_pending: int = 256,
    limits: ServerLimits | None = None,
    log_level: str = "info",
) -> None:
    """Serve ``retriever`` in the foreground until interrupted (what ``serve-retriever`` runs)."""
    import uvicorn

    app = create_app(retriever, max_concurrency=max_concurrency, max_pending=max_pending, limits=limits)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
