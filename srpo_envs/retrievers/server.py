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
* ``serve(..., workers=N)`` (``serve-retriever --workers N``) runs N such servers as processes on
  one listening socket under uvicorn's multiprocess supervisor (a worker that dies is replaced).
  Each builds its own retriever - its own JVM and search thread - so the processes search in
  parallel without sharing a JVM, and the HTTP work is spread over cores instead of contending
  for one Python GIL. The OS spreads new connections over the workers;
* connections that sit idle - between requests, and also a new connection that never completes
  its request headers - are closed after ``idle_timeout_s`` (uvicorn alone only times out the
  gap *after* a response, so a silent or trickling client could hold a socket forever);
* any backend failure is a 503 with the exception's type and message, so clients retry; a
  failing batch is retried request by request so one bad request cannot fail its neighbours.

Speed, because at one query per request the HTTP layer costs as much as the search (a warm Lucene
answers a query in ~0.3-0.5 ms of CPU; FastAPI + uvicorn's pure-Python h11 spent ~0.4 ms per
request, this path ~0.1 ms): ``POST /retrieve`` is answered by a plain ASGI handler ahead of
FastAPI's routing and middleware (the route stays declared, so ``/docs`` and ``/openapi.json``
describe it, and every other path goes through FastAPI as usual); uvicorn parses HTTP with
``httptools`` (C; its event loop is ``uvloop`` if that is installed, asyncio's otherwise); JSON is
parsed and rendered with ``orjson`` (whatever orjson and the standard library would read
differently is parsed by the standard library, so errors read exactly as before); and the search
thread hands a whole batch's answers back to the event loop in one wake-up instead of one per
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import pickle
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import h11
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # C HTTP parser; without it uvicorn's pure-Python h11 (about 3x the CPU per request) is used
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency of the search extra
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from srpo_envs.retrievers.base import Passage, Retriever, ServerLimits

log = logging.getLogger(__name__)

#: Seconds an idle connection is kept open (between requests, or before a request's headers are in).
DEFAULT_IDLE_TIMEOUT_S = 5.0
#: Responses with more passages than this are JSON-encoded off the event loop (~0.1 s for 10k).
_RENDER_INLINE_MAX_PASSAGES = 256
#: Request bodies with more ``[``/``{`` than this are parsed by ``json``, not orjson (see :func:`_loads`);
#: far below ``json``'s recursion limit, far above any real request's nesting.
_ORJSON_MAX_BRACKETS = 64


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


def _error_body(message: str) -> bytes:
    """``{"detail": message}`` as JSON; ASCII-escaped, so even a lone surrogate in it renders."""
    return json.dumps({"detail": message}).encode("ascii")


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


async def _read_asgi_body(scope: dict[str, Any], receive: Any, limit: int) -> bytes | None:
    """:func:`_read_body` for a raw ASGI request; None if the client disconnected meanwhile."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise _HTTPError(413, f"request body is {value.decode()} bytes; the limit is {limit}")
            break
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _HTTPError(413, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _loads(body: bytes) -> Any:
    """Parse JSON with orjson where it agrees with the standard library, else with ``json``.

    orjson refuses some text ``json`` accepts (a ``\\ud800`` escape, NaN, integers beyond 64 bits)
    and accepts nesting ``json`` refuses (100k levels: ``json`` raises RecursionError, which is our
    422). Bodies with many brackets and whatever orjson refuses go to ``json``, so every answer and
    every error message is what ``json`` gives, at orjson's speed for ordinary requests.
    """
    if body.count(b"[") + body.count(b"{") > _ORJSON_MAX_BRACKETS:
        return json.loads(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def _parse(body: bytes, limits: ServerLimits) -> RetrieveRequest:
    try:
        payload = _loads(body)
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
    return orjson.dumps({"result": body})


class _Job:
    """One request for the search thread; ``future`` belongs to ``loop``, and only that loop's
    thread may resolve it (:func:`_deliver` hands the answer over)."""

    __slots__ = ("future", "loop", "queries", "topk")

    def __init__(self, queries: list[str], topk: int, loop: asyncio.AbstractEventLoop) -> None:
        self.queries, self.topk, self.loop = queries, topk, loop
        self.future: asyncio.Future[list[list[Passage]]] = loop.create_future()


#: (job, succeeded, results or exception): what the search thread hands back, a batch at a time.
_Outcome = tuple[_Job, bool, Any]


def _settle(outcomes: list[_Outcome]) -> None:
    """Resolve the futures of a batch - run on their loop (see :func:`_deliver`)."""
    for job, ok, value in outcomes:
        if not job.future.done():  # cancelled while it was searched
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)


def _deliver(outcomes: list[_Outcome]) -> None:
    """Hand a batch's answers back to their event loops, one wake-up per loop per batch.

    Waking an event loop from another thread (``call_soon_threadsafe``) costs a pipe write, a
    thread switch and a loop iteration; ``asyncio.wrap_future`` on a thread future paid that once
    per request, this pays it once per batch.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].loop, []).append(outcome)
    for loop, items in by_loop.items():
        # RuntimeError: the loop is closed - the server stopped and nobody waits any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, items)


class SearchBatcher:
    """The one thread that calls the backend, batching whatever requests are waiting (dynamic batching).

    :meth:`submit` queues a request and returns an ``asyncio`` future. The thread takes the oldest
    request plus every other one already waiting, up to ``max_batch_requests``, and answers each
    group with the same ``topk`` by a single ``retriever.search`` over the concatenated queries (requests with
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

    def submit(self, queries: list[str], topk: int) -> asyncio.Future[list[list[Passage]]]:
        """Queue one request from a coroutine; the future (of the running loop) resolves to its
        results or the backend's exception."""
        job = _Job(queries, topk, asyncio.get_running_loop())
        self._put(job)
        return job.future

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the search thread is stopped")
            if self._thread is None:  # started on first use, so an app that never serves owns no thread
                self._thread = threading.Thread(target=self._run, name="srpo-search", daemon=True)
                self._thread.start()
            self._queue.put(job)

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
            outcomes: list[_Outcome] = []
            try:
                self._search_batch(batch, outcomes)
            except BaseException as exc:  # a bug here must not kill the thread and hang every later request
                log.exception("search thread failed on a batch")
                answered = {id(job) for job, _, _ in outcomes}
                outcomes += [(job, False, exc) for job in batch if id(job) not in answered]
            _deliver(outcomes)
        shutdown = RuntimeError("retrieval server is shutting down")
        late: list[_Outcome] = []
        while True:  # fail what arrived after close() instead of leaving callers waiting forever
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and not job.future.done():
                late.append((job, False, shutdown))
        _deliver(late)

    def _search_batch(self, batch: list[_Job], outcomes: list[_Outcome]) -> None:
        """Search ``batch``, appending one outcome per job that is still wanted to ``outcomes``."""
        # done() = cancelled; read across threads, so at worst a cancelled job is searched for nothing
        live = [job for job in batch if not job.future.done()]
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
                    outcomes.append((jobs[0], False, exc))
                else:  # find the request that fails; the others still get their answers
                    outcomes.extend(self._search_one(job) for job in jobs)
                continue
            start = 0
            for job in jobs:
                outcomes.append((job, True, results[start : start + len(job.queries)]))
                start += len(job.queries)

    def _search_one(self, job: _Job) -> _Outcome:
        try:
            return job, True, self.retriever.search(job.queries, job.topk)
        except BaseException as exc:  # noqa: BLE001
            return job, False, exc


class _RetrieverApp(FastAPI):
    """FastAPI, with ``POST /retrieve`` answered by a plain ASGI handler ahead of the routing.

    FastAPI's per-request machinery (middleware stack, routing, dependency solving, an exit stack,
    a ``Response`` object) was most of the server's own CPU time at one query per request. The
    route is still declared on the app - ``/docs`` and ``/openapi.json`` describe it, and it
    answers when the app is mounted under a prefix - and every other path goes through FastAPI.
    """

    retrieve_asgi: Callable[[dict[str, Any], Any, Any], Awaitable[None]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            self.retrieve_asgi is not None
            and scope["type"] == "http"
            and scope["path"] == "/retrieve"
            and scope["method"] == "POST"
        ):
            await self.retrieve_asgi(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(
    retriever: Retriever,
    *,
    max_concurrency: int = 4,
    max_pending: int = 256,
    limits: ServerLimits | None = None,
    batching: bool = True,
    close_retriever: bool = False,
) -> FastAPI:
    """Build the FastAPI app.

    ``max_concurrency`` = most requests searched at once: with ``batching`` (the default) the most
    requests merged into one backend call by the single search thread; ``max_pending`` = requests
    admitted (searching + waiting) before new ones get 503.

    ``batching=False`` is the old path, kept to measure against (``benchmarks/perf/bench_server.py``)
    and for backends that are thread-safe without a lock: each request is its own backend call on
    a pool of ``max_concurrency`` threads. BM25 then serialises those calls on its JVM lock.

    ``close_retriever``: close the retriever when the app shuts down (the app owns it, as a
    worker process of :func:`serve` does).
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
        if close_retriever:
            await asyncio.to_thread(retriever.close)

    app = _RetrieverApp(title="srpo retriever", description=__doc__, lifespan=lifespan)
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
            "pid": os.getpid(),  # which worker answered, with serve(workers=N)
            "limits": asdict(lim),
        }
        if batcher is not None:
            info["batches"] = batcher.batches
            info["largest_batch"] = batcher.largest_batch
        return info

    async def answer(body: bytes) -> tuple[int, bytes, dict[str, str] | None]:
        """Status, JSON body and extra headers for one ``/retrieve`` request body."""
        try:
            req = _parse(body, lim)
        except _HTTPError as exc:
            return exc.status, _error_body(exc.message), exc.headers
        if state["pending"] >= max_pending:
            return 503, _error_body(f"server busy: {max_pending} requests in flight"), {"Retry-After": "1"}
        state["pending"] += 1
        topk = req.topk or lim.default_topk  # _parse has already resolved None to the default
        try:
            if batcher is not None:
                results = await batcher.submit(req.queries, topk)
            else:
                assert executor is not None
                results = await asyncio.get_running_loop().run_in_executor(
                    executor, retriever.search, req.queries, topk
                )
        except Exception as exc:
            state["failed"] += 1
            log.exception("retrieval backend failed")
            return 503, _error_body(f"retrieval backend failed: {type(exc).__name__}: {str(exc)[:500]}"), None
        finally:
            state["pending"] -= 1
        if sum(len(hits) for hits in results) > _RENDER_INLINE_MAX_PASSAGES:
            content = await asyncio.to_thread(_render, results, req.return_scores)
        else:
            content = _render(results, req.return_scores)
        state["served"] += 1
        return 200, content, None

    async def retrieve_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``POST /retrieve`` as a plain ASGI app (see :class:`_RetrieverApp`)."""
        try:
            body = await _read_asgi_body(scope, receive, lim.max_body_bytes)
            if body is None:  # the client hung up before sending its whole request
                return
            status, content, headers = await answer(body)
        except _HTTPError as exc:
            status, content, headers = exc.status, _error_body(exc.message), exc.headers
        except Exception as exc:  # what FastAPI's exception handler (_backstop) does for the other routes
            log.exception("unhandled error in retriever server")
            status, content, headers = 503, _error_body(f"internal error: {type(exc).__name__}: {exc}"), None
        raw_headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
        if headers:
            raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": content})

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
        """Search-R1 retrieval (see the description above for the request and response format)."""
        try:
            status, content, headers = await answer(await _read_body(request, lim.max_body_bytes))
        except _HTTPError as exc:
            status, content, headers = exc.status, _error_body(exc.message), exc.headers
        return Response(content=content, status_code=status, headers=headers, media_type="application/json")

    app.retrieve_asgi = retrieve_asgi
    return app


def _no_delay(transport: asyncio.Transport) -> None:
    """Turn Nagle's algorithm off on a TCP connection, whoever made the listening socket.

    asyncio does it only for sockets whose ``proto`` reads ``IPPROTO_TCP``; a listening socket that
    uvicorn's supervisor hands to its worker processes reads ``proto`` 0, so without this every
    small response waited for the client's delayed ACK (~40 ms a request with ``workers`` > 1).
    """
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _HeaderDeadline:
    """A deadline for a request's headers to arrive, mixed into uvicorn's HTTP protocols.

    uvicorn arms ``timeout_keep_alive`` only after a response and cancels it on the next byte, so a
    connection that never sends a request - or sends one byte at a time - was never closed. Here a
    timer of the same length runs from connection start (and from each response's end after which no
    request is the app's) until a request's headers are complete; if it fires first, the connection
    is closed. The protocol says when it is idle (:meth:`_idle`) and calls :meth:`_arm` /
    :meth:`_disarm` where its parser sees a response end / headers complete.
    """

    _header_deadline: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    timeout_keep_alive: float
    transport: asyncio.Transport

    def _idle(self) -> bool:
        raise NotImplementedError

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.timeout_keep_alive, self._headers_overdue)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_overdue(self) -> None:
        self._header_deadline = None
        if self._idle() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        _no_delay(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]


class _H11IdleTimeout(_HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol with :class:`_HeaderDeadline`."""

    def _idle(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._idle():  # headers are in; the request is the app's now
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._idle():
            self._arm()


if HttpToolsProtocol is not None:

    class _HttpToolsIdleTimeout(_HeaderDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol (C parser) with :class:`_HeaderDeadline`."""

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete  # no request is the app's

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._disarm()  # headers are in; the request is the app's now

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # self.cycle is the newest request: unfinished if a pipelined one was just started
            if not self.transport.is_closing() and self.cycle.response_complete:
                self._arm()


def _protocol(http: str) -> type[asyncio.Protocol]:
    """The uvicorn HTTP protocol class for ``http``: "httptools" (C parser; the default when it is
    installed), "h11" (pure Python), or "auto"."""
    if http == "auto":
        http = "h11" if HttpToolsProtocol is None else "httptools"
    if http == "httptools":
        if HttpToolsProtocol is None:
            raise ValueError("http='httptools' needs the httptools package (pip install httptools)")
        return _HttpToolsIdleTimeout
    if http == "h11":
        return _H11IdleTimeout
    raise ValueError(f"http must be 'auto', 'httptools' or 'h11', got {http!r}")


def _uvicorn_config(
    app: Any,
    host: str,
    port: int,
    log_level: str,
    idle_timeout_s: float,
    http: str = "auto",
    **extra: Any,
) -> Any:
    import uvicorn

    if not idle_timeout_s > 0:
        raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=_protocol(http),  # loop="auto": uvloop when installed
        timeout_keep_alive=idle_timeout_s,  # type: ignore[arg-type]  # uvicorn types it int, uses a float
        **extra,
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
        http: str = "auto",
    ) -> None:
        import uvicorn

        self._server = uvicorn.Server(_uvicorn_config(app, host, port, log_level, idle_timeout_s, http))
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
    retriever: Retriever | Callable[[], Retriever],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    workers: int = 1,
    max_concurrency: int = 4,
    max_pending: int = 256,
    limits: ServerLimits | None = None,
    log_level: str = "info",
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    batching: bool = True,
) -> None:
    """Serve in the foreground until interrupted (what ``serve-retriever`` runs).

    ``retriever``: a built retriever, or a zero-argument factory for one. ``workers`` > 1 runs that
    many server processes on one socket (see the module docstring); each calls the factory, which
    must then be picklable (a module-level function, or a ``functools.partial`` of one), because
    the workers are started with ``spawn`` - a forked JVM is not usable. The ``max_*`` limits apply
    per worker. A retriever this function built from a factory is closed when it returns.
    """
    import uvicorn

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    app_kwargs: dict[str, Any] = {
        "max_concurrency": max_concurrency,
        "max_pending": max_pending,
        "limits": limits,
        "batching": batching,
    }
    if workers == 1:
        owned = not isinstance(retriever, Retriever)
        built = retriever() if not isinstance(retriever, Retriever) else retriever
        try:
            app = create_app(built, **app_kwargs)
            uvicorn.Server(_uvicorn_config(app, host, port, log_level, idle_timeout_s)).run()
        finally:
            if owned:
                built.close()
        return
    if isinstance(retriever, Retriever):
        raise TypeError("workers > 1 needs a retriever factory (each worker process builds its own)")
    factory = functools.partial(_worker_app, retriever, app_kwargs)
    try:
        pickle.dumps(factory)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing here
        raise TypeError(f"workers > 1 needs a picklable retriever factory: {exc}") from None
    from uvicorn.supervisors import Multiprocess

    config = _uvicorn_config(factory, host, port, log_level, idle_timeout_s, factory=True, workers=workers)
    sock = config.bind_socket()
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()


def _worker_app(factory: Callable[[], Retriever], app_kwargs: dict[str, Any]) -> FastAPI:
    """The app of one :func:`serve` worker process: its own retriever, closed when it stops."""
    return create_app(factory(), close_retriever=True, **app_kwargs)
