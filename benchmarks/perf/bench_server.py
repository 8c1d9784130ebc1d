"""Load test of the retrieval server: latency percentiles and throughput before/after dynamic batching.

Starts the server as a separate process on loopback (so client threads and the server do not share
a GIL), loads it from ``--clients`` connections - ``wrk`` for ``--seconds`` where it is on PATH, else
``--requests`` POST /retrieve calls from Python threads (``--client``) - and prints p50/p90/p99
latency, req/s and q/s, the error count, and the server's CPU time per request for each variant:

* ``after``  - the server as shipped (``serve-retriever``): one search thread drains concurrent
  requests into one backend call (``create_app(batching=True)``); one row per ``--workers`` count
  (``after x2`` = two server processes on one port, each with its own JVM and search thread);
* ``before`` - the old path: each request its own backend call on a pool of ``--max-concurrency``
  threads (``batching=False``; BM25 now serialises those calls on its JVM lock, as a plain lock would);
* ``before-src`` - optional, ``--before-src DIR``: the ``serve-retriever`` of another checkout
  (e.g. ``git archive <rev> | tar -x -C DIR``), to measure the code before the fix as it was.

It also calls the backend directly in-process on the same queries - one query per call, and
``--clients`` queries per call - and prints the server's q/s as a ratio of that (the target is
>= 0.8x with 16+ clients at one query per request). Bounded in count and time: it stops issuing
requests after ``--max-seconds`` whatever is left. Exit status 1 if any request failed.

How it keeps the comparison fair, because client, server and Lucene share the machine's cores:

* **A cheap client.** ``wrk`` (C, one event-loop thread, pre-encoded bodies cycled by a generated
  Lua script that checks every response's status and ``result`` field) spends ~0.03 ms of CPU per
  request; the Python client - one persistent ``http.client.HTTPConnection`` per thread, bodies
  encoded up front, every response parsed - ~0.25 ms, about a third of the server's own cost, taken
  from the server being measured on a 2-core machine (one ``httpx`` client per thread cost several
  times more). The client's own CPU time per request is printed in every row.
* **Both sides warm.** The JVM compiles Lucene's hot paths during the first several thousand
  searches (its compiler thread took ~1.5 s of CPU in a cold server's first 5 s under load), and a
  retrieval server runs for hours, so the direct baseline and every server are first run on
  ``--warmup`` queries, one per call / request, before anything is timed. With several workers
  each JVM gets only its share of them: at 10,000 two workers still spent ~2x the CPU per request
  of one, at 30,000 the same.
* **Like with like.** The same queries, ``topk`` and ``return_scores``; the ratio is the server's
  q/s at ``--queries-per-request`` (default 1) over the direct q/s at one query per call.
* The 1-minute load average is printed before and after each row: other work on the machine
  lowers every number, so compare rows measured at a similar load.

    python -m benchmarks.perf.bench_server                      # 16 clients, BM25, bundled corpus, wrk if found
    python -m benchmarks.perf.bench_server --client python      # 5,000 requests from Python threads
    python -m benchmarks.perf.bench_server --modes after --workers 1,2,3 --requests 10000
    python -m benchmarks.perf.bench_server --modes after --url http://host:8000  # against a server you started
    git archive HEAD~1 | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python -m benchmarks.perf.bench_server --before-src /tmp/old
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(
    backend: str = "bm25",
    cache_dir: str | None = None,
    corpus: str | None = None,
    max_concurrency: int = 4,
    ready_timeout: float = 600.0,
    *,
    batching: bool = True,
    workers: int = 1,
    src: str | None = None,
) -> Iterator[tuple[str, int]]:
    """Start a server in a child process, yield ``(base URL, pid)`` once /health answers, stop it.

    With ``batching`` it is the shipped ``serve-retriever`` command (``--workers``: that many
    server processes under one supervisor); without, this module's ``--serve --no-batching``.
    ``src``: run ``serve-retriever`` from that source tree (put first on ``PYTHONPATH``) instead
    of this one; ``batching`` and ``workers`` then do not apply (that tree's server does what it does).
    """
    port = free_port()
    env = dict(os.environ)
    if src is not None or batching:
        cmd = [sys.executable, "-m", "srpo_envs.cli", "serve-retriever", "--backend", backend]
        cmd += ["--port", str(port), "--max-concurrency", str(max_concurrency), "--log-level", "warning"]
        if src is None:
            cmd += ["--workers", str(workers), "--max-pending", str(max(256, max_concurrency))]
        else:
            env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    else:
        cmd = [sys.executable, "-m", "benchmarks.perf.bench_server", "--serve", "--backend", backend]
        cmd += ["--port", str(port), "--max-concurrency", str(max_concurrency)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    if corpus:
        cmd += ["--corpus", corpus]
    log = tempfile.NamedTemporaryFile(prefix="srpo-server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=src)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {proc.returncode}:\n{Path(log.name).read_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {ready_timeout:.0f}s")
            time.sleep(0.2)
        pids: set[int] = set()
        while workers > 1 and src is None and len(pids) < workers:  # /health answers once ONE is up
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(pids)} of {workers} workers answered")
            with contextlib.suppress(httpx.HTTPError):  # a new connection each time: any worker may take it
                pids.add(httpx.get(f"{url}/health", timeout=1.0).json()["pid"])
            time.sleep(0.05)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


def _make_backend(backend: str, corpus: str | None, cache_dir: str | None) -> Any:
    from srpo_envs.retrievers import make_retriever
    from srpo_envs.tasks.search_data import bundled_corpus_path

    return make_retriever(backend, corpus or bundled_corpus_path(cache_dir), cache_dir=cache_dir)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children: a server and its workers."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _serve(args: argparse.Namespace) -> int:
    """The child process of :func:`running_server` for the unbatched ``before`` row."""
    from srpo_envs.retrievers.server import serve

    retriever = _make_backend(args.backend, args.corpus, args.cache_dir)
    try:
        serve(
            retriever,
            "127.0.0.1",
            args.port,
            max_concurrency=args.max_concurrency,
            max_pending=max(256, args.max_concurrency),
            log_level="warning",
            batching=False,
        )
    finally:
        retriever.close()
    return 0


def direct_qps(
    backend: str,
    corpus: str | None,
    cache_dir: str | None,
    queries: list[str],
    n: int,
    topk: int,
    batch: int,
    warmup: int = 0,
) -> dict[str, float]:
    """q/s of calling the backend in-process: one query per call, and ``batch`` queries per call.

    ``warmup`` queries (one per call, then the same in batches) run first, untimed, as the servers get.
    """
    retriever = _make_backend(backend, corpus, cache_dir)
    try:
        qs = [queries[i % len(queries)] for i in range(n)]
        warm = [queries[i % len(queries)] for i in range(max(warmup, 50))]  # JIT, page cache
        for q in warm:
            retriever.search([q], topk)
        for i in range(0, len(warm), batch):
            retriever.search(warm[i : i + batch], topk)
        t0 = time.perf_counter()
        for q in qs:
            retriever.search([q], topk)
        single = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            retriever.search(qs[i : i + batch], topk)
        batched = n / (time.perf_counter() - t0)
    finally:
        retriever.close()
    return {"single": single, "batched": batched}


def _loadavg() -> str:
    """The 1-minute load average ("?" where the OS has none): other work skews every number here."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def sample_queries() -> list[str]:
    from srpo_envs.tasks.search_data import SEARCH_DATASETS, load_qa

    return [t.question for name in sorted(SEARCH_DATASETS) for t in load_qa(name)]


def load_test(
    url: str,
    queries: list[str],
    n_requests: int,
    clients: int,
    topk: int,
    per_request: int,
    max_seconds: float,
) -> dict[str, float]:
    """Fire ``n_requests`` from ``clients`` threads, each on one persistent HTTP/1.1 connection.

    Bodies are encoded up front and responses parsed with orjson, so the client spends as little of
    the shared CPU as it can while still checking every answer (status 200, one result list per query).
    """
    parsed = urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"--url must be http://host:port, got {url!r}")
    host, port, path = parsed.hostname, parsed.port or 80, parsed.path.rstrip("/") + "/retrieve"
    bodies = [
        orjson.dumps(
            {
                "queries": [queries[(i * per_request + j) % len(queries)] for j in range(per_request)],
                "topk": topk,
                "return_scores": True,
            }
        )
        for i in range(min(n_requests, len(queries)))
    ]
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    next_idx = [0]
    deadline = time.monotonic() + max_seconds

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        try:
            while time.monotonic() < deadline:
                with lock:
                    i = next_idx[0]
                    if i >= n_requests:
                        return
                    next_idx[0] += 1
                t0 = time.perf_counter()
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(host, port, timeout=30.0)
                    conn.request("POST", path, bodies[i % len(bodies)], headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    ok = resp.status == 200 and len(orjson.loads(data)["result"]) == per_request
                    err = "" if ok else f"HTTP {resp.status}: {data[:200]!r}"
                    if resp.will_close:
                        conn.close()
                        conn = None
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
                    err = f"{type(exc).__name__}: {exc}"
                    if conn is not None:
                        conn.close()
                        conn = None
                dt = time.perf_counter() - t0
                with lock:
                    (errors.append(err) if err else latencies.append(dt))
        finally:
            if conn is not None:
                conn.close()

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max_seconds + 60)
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    done = len(latencies)
    q = statistics.quantiles(latencies, n=100, method="inclusive") if done >= 2 else [float("nan")] * 99
    if errors:
        print(f"first errors: {errors[:3]}", file=sys.stderr)
    return {
        "requests_ok": done,
        "errors": len(errors),
        "not_sent": n_requests - done - len(errors),
        "wall_s": wall,
        "req_per_s": done / wall,
        "queries_per_s": done * per_request / wall,
        "p50_ms": q[49] * 1e3,
        "p90_ms": q[89] * 1e3,
        "p99_ms": q[98] * 1e3,
        "max_ms": max(latencies, default=float("nan")) * 1e3,
        "client_cpu_ms_per_request": client_cpu * 1e3 / max(1, done + len(errors)),
    }


_WRK_SCRIPT = r"""
-- Generated by benchmarks/perf/bench_server.py: cycle pre-encoded POST bodies, check every answer.
dofile(BODIES)
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) i = 0; bad = 0; n = #bodies end
function request()
  i = i + 1
  return wrk.format("POST", PATH, {["Content-Type"] = "application/json"}, bodies[(i % n) + 1])
end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"result"', 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local bad_total = 0
  for _, t in ipairs(threads) do bad_total = bad_total + t:get("bad") end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bad": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, bad_total, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def _lua_string(text: str) -> str:
    """``text`` as a Lua long-bracket literal whose level no ``]=...=]`` inside it can close."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[{text}]{'=' * level}]"


def wrk_load_test(
    url: str,
    queries: list[str],
    seconds: float,
    clients: int,
    topk: int,
    per_request: int,
    threads: int = 1,
) -> dict[str, float]:
    """The same load as :func:`load_test` from ``wrk`` (a C load generator) for ``seconds``.

    Why: on a small machine the client shares the cores with the server it measures, and the Python
    client spends ~0.25 ms of CPU per request (about a third of what the server spends); wrk spends a
    few microseconds, so the row measures the server rather than its client. Every response is still
    checked (status 200 and a ``result`` field; anything else counts as an error). ``clients`` is the
    number of open connections, ``threads`` wrk's event-loop threads.
    """
    exe = shutil.which("wrk")
    if exe is None:
        raise RuntimeError("--client wrk needs the wrk binary on PATH (Debian/Ubuntu: apt-get install wrk)")
    parsed = urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"--url must be http://host:port, got {url!r}")
    path = parsed.path.rstrip("/") + "/retrieve"
    with tempfile.TemporaryDirectory(prefix="srpo-wrk-") as tmp:
        bodies = Path(tmp, "bodies.lua")
        lines = ["bodies = {"]
        for i in range(min(5000, len(queries))):
            qs = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
            body = orjson.dumps({"queries": qs, "topk": topk, "return_scores": True}).decode()
            lines.append(f"  {_lua_string(body)},")
        bodies.write_text("\n".join([*lines, "}", ""]), encoding="utf-8")
        script = Path(tmp, "post.lua")
        header = f"BODIES = {_lua_string(str(bodies))}\nPATH = {_lua_string(path)}\n"
        script.write_text(header + _WRK_SCRIPT, encoding="utf-8")
        cmd = [exe, f"-t{threads}", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--timeout", "30s"]
        cmd += ["-s", str(script), f"{parsed.scheme}://{parsed.netloc}"]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=tmp)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = [ln for ln in out.stdout.splitlines() if ln.startswith("WRK_JSON ")]
    if out.returncode != 0 or not found:
        raise RuntimeError(f"wrk failed (exit {out.returncode}): {(out.stderr or out.stdout)[-2000:]}")
    w = orjson.loads(found[-1].removeprefix("WRK_JSON "))
    wall = w["duration_us"] / 1e6
    socket_errors = w["connect"] + w["read"] + w["write"] + w["timeout"]
    errors = w["bad"] + socket_errors
    done = w["requests"] - w["bad"]
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {
        "requests_ok": done,
        "errors": errors,
        "not_sent": 0,
        "wall_s": wall,
        "req_per_s": done / wall,
        "queries_per_s": done * per_request / wall,
        "p50_ms": w["p50_us"] / 1e3,
        "p90_ms": w["p90_us"] / 1e3,
        "p99_ms": w["p99_us"] / 1e3,
        "max_ms": w["max_us"] / 1e3,
        "client_cpu_ms_per_request": cpu * 1e3 / max(1, w["requests"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use a running server instead of starting one (only the 'after' row)")
    ap.add_argument("--backend", default="bm25", choices=["bm25", "dense"])
    ap.add_argument("--corpus", help="corpus JSONL (default: bundled)")
    ap.add_argument("--cache-dir")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--queries-per-request", type=int, default=1)
    ap.add_argument("--max-concurrency", type=int, default=16, help="server: requests searched at once")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="hard stop for issuing requests")
    ap.add_argument(
        "--warmup",
        type=int,
        default=30_000,
        help="untimed queries first, for the direct baseline and each server (JVM JIT; see above)",
    )
    ap.add_argument(
        "--modes", default="before,after", help="comma list of server variants: before, after, before-src"
    )
    ap.add_argument(
        "--workers",
        default="1,2",
        help="comma list: an 'after' row per serve-retriever --workers count (server processes)",
    )
    ap.add_argument(
        "--client",
        default="auto",
        choices=["auto", "python", "wrk"],
        help="timed load generator: python threads (--requests) or wrk (--seconds); auto: wrk if on PATH",
    )
    ap.add_argument("--seconds", type=float, default=15.0, help="wrk client: length of each timed run")
    ap.add_argument("--before-src", help="source tree of the code before the fix (adds a before-src row)")
    ap.add_argument("--no-direct", action="store_true", help="skip the in-process direct-backend baseline")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # child-process mode
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return _serve(args)

    modes = [m for m in args.modes.split(",") if m]
    if args.before_src and "before-src" not in modes:
        modes.insert(0, "before-src")
    unknown = set(modes) - {"before", "after", "before-src"}
    if unknown or ("before-src" in modes and not args.before_src):
        ap.error(f"bad --modes {args.modes!r} (before-src needs --before-src DIR)")
    try:
        workers = [int(w) for w in args.workers.split(",") if w]
    except ValueError:
        workers = []
    if not workers or min(workers) < 1:
        ap.error(f"bad --workers {args.workers!r} (comma list of counts >= 1)")
    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"
    elif client == "wrk" and not shutil.which("wrk"):
        ap.error("--client wrk needs the wrk binary on PATH (Debian/Ubuntu: apt-get install wrk)")
    queries = sample_queries()
    timed = f"{args.requests} requests" if client == "python" else f"{args.seconds:g} s of requests"
    print(
        f"{args.clients} clients ({client}), topk={args.topk}, {args.queries_per_request} query/request, "
        f"{timed} after {args.warmup} warm-up queries, "
        f"server max_concurrency={args.max_concurrency}, {os.cpu_count()} CPUs"
    )
    direct: dict[str, float] = {}
    if not args.no_direct and not args.url:
        n = min(args.requests * args.queries_per_request, 20_000)
        load0 = _loadavg()
        direct = direct_qps(
            args.backend,
            args.corpus,
            args.cache_dir,
            queries,
            n,
            args.topk,
            args.clients * args.queries_per_request,
            warmup=args.warmup,
        )
        print(
            f"direct {args.backend} in-process: {direct['single']:.0f} q/s one query per call, "
            f"{direct['batched']:.0f} q/s {args.clients * args.queries_per_request} queries per call "
            f"| load average {load0} -> {_loadavg()}"
        )
    failed = False
    rows = [(m, 1) for m in modes if m != "after"] + [("after", w) for w in workers if "after" in modes]
    for mode, n_workers in rows:
        label = mode if n_workers == 1 else f"{mode} x{n_workers}"
        if args.url:
            ctx: contextlib.AbstractContextManager[tuple[str, int | None]] = contextlib.nullcontext(
                (args.url, None)
            )
        else:
            ctx = running_server(
                args.backend,
                args.cache_dir,
                args.corpus,
                args.max_concurrency,
                batching=mode == "after",
                workers=n_workers,
                src=args.before_src if mode == "before-src" else None,
            )
        t_start = time.perf_counter()
        with ctx as (url, pid):
            ready = time.perf_counter() - t_start
            warm = max(50, args.warmup // args.queries_per_request)
            load_test(url, queries, warm, args.clients, args.topk, args.queries_per_request, args.max_seconds)
            health0 = httpx.get(f"{url}/health", timeout=10.0).json()
            # the whole server process tree (supervisor + workers) where we started it, else /health's
            cpu0 = tree_cpu_s(pid) if pid is not None else health0.get("cpu_s")
            load0 = _loadavg()
            if client == "wrk":
                r = wrk_load_test(
                    url, queries, args.seconds, args.clients, args.topk, args.queries_per_request
                )
            else:
                r = load_test(
                    url,
                    queries,
                    args.requests,
                    args.clients,
                    args.topk,
                    args.queries_per_request,
                    args.max_seconds,
                )
            cpu1 = tree_cpu_s(pid) if pid is not None else None
            health = httpx.get(f"{url}/health", timeout=10.0).json()
            if cpu1 is None:
                cpu1 = health.get("cpu_s")
        ratio = ""
        if direct:
            ratio = (
                f" | {r['queries_per_s'] / direct['single']:.2f}x direct one-per-call, "
                f"{r['queries_per_s'] / direct['batched']:.2f}x direct batched"
            )
        print(
            f"{label:>10}: p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms  max {r['max_ms']:6.1f} ms | "
            f"{r['req_per_s']:5.0f} req/s {r['queries_per_s']:5.0f} q/s | {r['requests_ok']} ok "
            f"{r['errors']} errors {r['not_sent']} not sent | ready in {ready:.1f}s{ratio}"
        )
        notes = [f"load average {load0} -> {_loadavg()}"]
        if cpu0 is not None and cpu1 is not None and r["requests_ok"]:
            cpu = cpu1 - cpu0
            ms = cpu * 1e3 / r["requests_ok"]
            notes.append(f"server CPU {ms:.2f} ms/request, {cpu / r['wall_s']:.2f} cores busy")
        notes.append(f"client CPU {r['client_cpu_ms_per_request']:.2f} ms/request")
        if health.get("batches") and n_workers == 1:  # per-process counters: one worker's with several
            per_call = (health["served"] - health0["served"]) / max(1, health["batches"] - health0["batches"])
            largest = health["largest_batch"]
            notes.append(f"{per_call:.1f} requests per backend call (largest {largest}, warm-up included)")
        print(f"{'':>10}  " + "; ".join(notes))
        failed |= mode == "after" and bool(r["errors"])  # "before" rows may fail: that is the bug
        if args.url:
            break
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
