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
* every malformed *text* is a 4xx too: a lone surrogate (not encodable as UTF-8) or JSON nested
  too deep to parse is 422, not a retryable 503;
* the backend is called from **one** thread only (:class:`SearchBatcher`): concurrent requests
  wait in a queue, and the thread drains up to ``max_concurrency`` of them into a single backend
  call (one Lucene ``batch_search``, which Java spreads over its own threads). That keeps the
  throughput of concurrent requests while no two Python threads ever call into the JVM at once -
  pyjnius is not thread-safe, and overlapping calls from a thread pool returned other requests'
  documents and JVM errors. Once ``max_pending`` requests are admitted further ones get 503 +
  ``Retry-After`` instead of piling up;
* connections that sit idle - between requests, and also a new connection that never completes
  its request headers - are closed after ``idle_timeout_s`` (uvicorn alone only times out the
  gap *after* a response, so a silent or trickling client could hold a socket forever);
* any backend failure is a 503 with the exception's type and message, so clients retry; a
  failing batch is retried request by request so one bad request cannot fail its neighbours.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import h11
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from uvicorn.protocols.http.h11_impl import H11Protocol

from srpo_envs.retrievers.base import Passage, Retriever, ServerLimits

log = logging.getLogger(__name__)

#: Seconds an idle connection is kept open (between requests, or before a request's headers are in).
DEFAULT_IDLE_TIMEOUT_S = 5.0
#: Responses with more passages than this are JSON-encoded off the event loop (~0.1 s for 10k).
_RENDER_INLINE_MAX_PASSAGES = 256


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
    except RecursionError:  # valid JSON, but nested deeper than the parser's stack allows
        raise _HTTPError(422, "request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise _HTTPError(422, 'request body must be a JSON object like {"queries": [...], "topk": 3}')
    try:
        req = RetrieveRequest.model_validate(payload)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
        raise _HTTPError(422, f"invalid request: {msgs}") from None
    except RecursionError:
        raise _HTTPError(422, "request body is nested too deeply") from None
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
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON's "\ud800" escape decodes to a lone surrogate
            raise _HTTPError(
                422, f"queries[{i}] is not valid Unicode (lone surrogate at {exc.start})"
            ) from None
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


class _Job:
    __slots__ = ("future", "queries", "topk")

    def __init__(self, queries: list[str], topk: int) -> None:
        self.queries, self.topk = queries, topk
        self.future: Future[list[list[Passage]]] = Future()


class SearchBatcher:
    """The one thread that calls the backend, batching whatever requests are waiting (dynamic batching).

    :meth:`submit` queues a request and returns a future. The thread takes the oldest request plus
    every other one already waiting, up to ``max_batch_requests``, and answers each group with the
    same ``topk`` by a single ``retriever.search`` over the concatenated queries (requests with
    different ``topk`` are not merged, so every answer is exactly what the request alone gets -
    tie-breaking at the cut-off can depend on ``k``). While a batch runs the next one fills up,
    so batches grow with load and a lone request waits for nobody.

    Why one thread rather than a lock around a thread pool: a lock alone would serialise one
    query at a time; batching turns N concurrent one-query requests into one call that the
    backend parallelises itself (Lucene's Java threads, a batched encoder), and the JVM is only
    ever entered from this thread.
    """

    def __init__(self, retriever: Retriever, max_batch_requests: int) -> None:
        if max_batch_requests < 1:
            raise ValueError("max_batch_requests must be >= 1")
        self.retriever = retriever
        self.max_batch_requests = max_batch_requests
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.batches = 0
        self.batched_requests = 0
        self.largest_batch = 0

    def submit(self, queries: list[str], topk: int) -> Future[list[list[Passage]]]:
        """Queue one request; the future resolves to its results (or the backend's exception)."""
        job = _Job(queries, topk)
        with self._lock:
            if self._closed:
                raise RuntimeError("the search thread is stopped")
            if self._thread is None:  # started on first use, so an app that never serves owns no thread
                self._thread = threading.Thread(target=self._run, name="srpo-search", daemon=True)
                self._thread.start()
            self._queue.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after the batch in progress; requests still queued fail with RuntimeError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self.max_batch_requests:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                batch.append(job)
            try:
                self._search_batch(batch)
            except BaseException as exc:  # a bug here must not kill the thread and hang every later request
                log.exception("search thread failed on a batch")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
        while True:  # fail what arrived after close() instead of leaving callers waiting forever
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(RuntimeError("retrieval server is shutting down"))

    def _search_batch(self, batch: list[_Job]) -> None:
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        self.batches += 1
        self.batched_requests += len(live)
        self.largest_batch = max(self.largest_batch, len(live))
        by_topk: dict[int, list[_Job]] = {}
        for job in live:
            by_topk.setdefault(job.topk, []).append(job)
        for topk, jobs in by_topk.items():
            try:
                results = self.retriever.search([q for job in jobs for q in job.queries], topk)
                if len(results) != sum(len(job.queries) for job in jobs):
                    raise RuntimeError(f"backend returned {len(results)} result lists for the batch")
            except BaseException as exc:  # noqa: BLE001 - a backend failure must reach its callers
                if len(jobs) == 1:
                    jobs[0].future.set_exception(exc)
                else:  # find the request that fails; the others still get their answers
                    for job in jobs:
                        self._search_one(job)
                continue
            start = 0
            for job in jobs:
                job.future.set_result(results[start : start + len(job.queries)])
                start += len(job.queries)

    def _search_one(self, job: _Job) -> None:
        try:
            job.future.set_result(self.retriever.search(job.queries, job.topk))
        except BaseException as exc:  # noqa: BLE001
            job.future.set_exception(exc)


def create_app(
    retriever: Retriever,
    *,
    max_concurrency: int = 4,
    max_pending: int = 256,
    limits: ServerLimits | None = None,
    batching: bool = True,
) -> FastAPI:
    """Build the FastAPI app.

    ``max_concurrency`` = most requests searched at once: with ``batching`` (the default) the most
    requests merged into one backend call by the single search thread; ``max_pending`` = requests
    admitted (searching + waiting) before new ones get 503.

    ``batching=False`` is the old path, kept to measure against (``benchmarks/bench_server.py``)
    and for backends that are thread-safe without a lock: each request is its own backend call on
    a pool of ``max_concurrency`` threads. BM25 then serialises those calls on its JVM lock.
    """
    if max_concurrency < 1 or max_pending < max_concurrency:
        raise ValueError("need max_concurrency >= 1 and max_pending >= max_concurrency")
    lim = limits or ServerLimits()
    batcher = SearchBatcher(retriever, max_concurrency) if batching else None
    # Without batching: long-lived threads, because each thread that calls into the JVM attaches to
    # it and a thread that exits without detaching leaks its Java-side state.
    executor = (
        None
        if batching
        else ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="srpo-retrieve")
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if batcher is not None:
            await asyncio.to_thread(batcher.close)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="srpo retriever", description=__doc__, lifespan=lifespan)
    state: dict[str, Any] = {"pending": 0, "served": 0, "failed": 0, "started": time.time()}

    @app.exception_handler(Exception)
    async def _backstop(request: Request, exc: Exception) -> JSONResponse:  # never a bare 500
        log.exception("unhandled error in retriever server")
        return _error(503, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        info: dict[str, Any] = {
            "status": "ok",
            "backend": retriever.name,
            "num_passages": retriever.num_passages,
            "max_concurrency": max_concurrency,
            "batching": batching,
            "pending": state["pending"],
            "served": state["served"],
            "failed": state["failed"],
            "uptime_s": round(time.time() - state["started"], 1),
            "cpu_s": round(time.process_time(), 3),  # this process, all threads (Java's too)
            "limits": asdict(lim),
        }
        if batcher is not None:
            info["batches"] = batcher.batches
            info["largest_batch"] = batcher.largest_batch
        return info

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
        topk = req.topk or lim.default_topk  # _parse has already resolved None to the default
        try:
            if batcher is not None:
                results = await asyncio.wrap_future(batcher.submit(req.queries, topk))
            else:
                assert executor is not None
                results = await asyncio.get_running_loop().run_in_executor(
                    executor, retriever.search, req.queries, topk
                )
        except Exception as exc:
            state["failed"] += 1
            log.exception("retrieval backend failed")
            return _error(503, f"retrieval backend failed: {type(exc).__name__}: {str(exc)[:500]}")
        finally:
            state["pending"] -= 1
        if sum(len(hits) for hits in results) > _RENDER_INLINE_MAX_PASSAGES:
            content = await asyncio.to_thread(_render, results, req.return_scores)
        else:
            content = _render(results, req.return_scores)
        state["served"] += 1
        return Response(content=content, media_type="application/json")

    return app


class _H11IdleTimeout(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for a request's headers to arrive.

    uvicorn arms ``timeout_keep_alive`` only after a response and cancels it on the next byte, so a
    connection that never sends a request - or sends one byte at a time - was never closed. Here a
    timer of the same length runs from connection start (and from each response's end) until a
    request's headers are complete; if it fires first, the connection is closed.
    """

    _header_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.timeout_keep_alive, self._headers_overdue)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_overdue(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # headers are in; the request is the app's now
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _uvicorn_config(app: FastAPI, host: str, port: int, log_level: str, idle_timeout_s: float) -> Any:
    import uvicorn

    if not idle_timeout_s > 0:
        raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=_H11IdleTimeout,
        timeout_keep_alive=idle_timeout_s,  # type: ignore[arg-type]  # uvicorn types it int, uses a float
    )


class BackgroundServer:
    """Run an app with uvicorn in a daemon thread (tests, benchmarks, in-process RL runs).

    ``port=0`` lets the OS pick a free port; ``url`` reports the bound one. Use as a context
    manager, or call :meth:`stop` - it asks uvicorn to exit and joins the thread.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        *,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        import uvicorn

        self._server = uvicorn.Server(_uvicorn_config(app, host, port, log_level, idle_timeout_s))
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
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    batching: bool = True,
) -> None:
    """Serve ``retriever`` in the foreground until interrupted (what ``serve-retriever`` runs)."""
    import uvicorn

    app = create_app(
        retriever, max_concurrency=max_concurrency, max_pending=max_pending, limits=limits, batching=batching
    )
    uvicorn.Server(_uvicorn_config(app, host, port, log_level, idle_timeout_s)).run()
