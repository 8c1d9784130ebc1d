"""Load test of the retrieval server: N requests from C concurrent clients, latency percentiles and q/s.

Starts ``srpo_envs.cli serve-retriever`` as a separate process on loopback (so client threads and
the server do not share a GIL), fires ``--requests`` POST /retrieve calls from ``--clients``
threads (one httpx client each), and prints p50/p90/p99 latency, throughput and the error count.
Bounded in count and time: it stops issuing requests after ``--max-seconds`` whatever is left.
Exit status 1 if any request failed.

    python -m benchmarks.bench_server                      # 2,000 requests, 16 clients, BM25, bundled corpus
    python -m benchmarks.bench_server --url http://host:8000  # against a server you started
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


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
) -> Iterator[str]:
    """Start ``serve-retriever`` in a child process, yield its base URL once /health answers, stop it."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "srpo_envs.cli",
        "serve-retriever",
        "--backend",
        backend,
        "--port",
        str(port),
    ]
    cmd += ["--max-concurrency", str(max_concurrency), "--log-level", "warning"]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    if corpus:
        cmd += ["--corpus", corpus]
    log = tempfile.NamedTemporaryFile(prefix="srpo-server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
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
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


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
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    next_idx = [0]
    deadline = time.monotonic() + max_seconds

    def worker() -> None:
        with httpx.Client(timeout=30.0) as client:
            while time.monotonic() < deadline:
                with lock:
                    i = next_idx[0]
                    if i >= n_requests:
                        return
                    next_idx[0] += 1
                batch = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
                t0 = time.perf_counter()
                try:
                    resp = client.post(
                        f"{url}/retrieve", json={"queries": batch, "topk": topk, "return_scores": True}
                    )
                    ok = resp.status_code == 200 and len(resp.json()["result"]) == per_request
                    err = "" if ok else f"HTTP {resp.status_code}: {resp.text[:200]}"
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
                    err = f"{type(exc).__name__}: {exc}"
                dt = time.perf_counter() - t0
                with lock:
                    (errors.append(err) if err else latencies.append(dt))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max_seconds + 60)
    wall = time.perf_counter() - t0
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
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("--backend", default="bm25", choices=["bm25", "dense"])
    ap.add_argument("--corpus", help="corpus JSONL (default: bundled)")
    ap.add_argument("--cache-dir")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--queries-per-request", type=int, default=1)
    ap.add_argument("--max-concurrency", type=int, default=4, help="server-side backend concurrency")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="hard stop for issuing requests")
    args = ap.parse_args()

    queries = sample_queries()
    ctx = (
        contextlib.nullcontext(args.url)
        if args.url
        else running_server(args.backend, args.cache_dir, args.corpus, args.max_concurrency)
    )
    t_start = time.perf_counter()
    with ctx as url:
        print(f"server ready at {url} after {time.perf_counter() - t_start:.1f}s ({args.backend})")
        load_test(
            url, queries, min(50, args.requests), args.clients, args.topk, args.queries_per_request, 30
        )  # warm-up
        r = load_test(
            url, queries, args.requests, args.clients, args.topk, args.queries_per_request, args.max_seconds
        )
    print(
        f"{r['requests_ok']} ok / {r['errors']} errors / {r['not_sent']} not sent (time limit) | "
        f"{args.clients} clients, topk={args.topk}, {args.queries_per_request} query/request, "
        f"server max_concurrency={args.max_concurrency}, {os.cpu_count()} CPUs"
    )
    print(
        f"latency p50 {r['p50_ms']:.1f} ms  p90 {r['p90_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  max {r['max_ms']:.1f} ms"
    )
    print(f"throughput {r['req_per_s']:.0f} req/s = {r['queries_per_s']:.0f} q/s over {r['wall_s']:.1f}s")
    return 1 if r["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
