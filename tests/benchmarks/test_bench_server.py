"""benchmarks/perf/bench_server's wrk client: every bad answer is counted, and bodies reach the server intact."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.perf.bench_server import _lua_string, wrk_load_test

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None, reason="wrk not on PATH (install.sh installs it)"
)


class _Handler(BaseHTTPRequestHandler):
    """POST /retrieve: a Search-R1-shaped answer, except every ``fail_every``-th request gets a 503."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the real server
    fail_every = 0
    count = 0
    queries: set[str] = set()
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's hook name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            type(self).count += 1
            n = type(self).count
            type(self).queries.update(body["queries"])
        fail = self.fail_every and n % self.fail_every == 0
        data = (
            b'{"error": "busy"}' if fail else json.dumps({"result": [[] for _ in body["queries"]]}).encode()
        )
        self.send_response(503 if fail else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


# queries that would break a naive Lua literal or JSON-in-Lua embedding
QUERIES = ["capital of Koutroustan", 'a "quoted" ]] query', "ends with ]=]", "back\\slash", "ünï ✓"]


def _load(fail_every: int) -> tuple[dict[str, float], type[_Handler]]:
    """One second of :func:`wrk_load_test` (2 connections) against a fresh stand-in server."""
    handler = type("H", (_Handler,), {"fail_every": fail_every, "count": 0, "queries": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        return wrk_load_test(f"http://127.0.0.1:{server.server_port}", QUERIES, 1, 2, 3, 1), handler
    finally:
        server.shutdown()


def test_wrk_client_sends_every_body_and_counts_no_error_on_good_answers() -> None:
    r, handler = _load(fail_every=0)
    assert r["errors"] == 0 and r["requests_ok"] > len(QUERIES)
    assert handler.queries == set(QUERIES)  # every body decoded to the query it was built from
    assert r["req_per_s"] > 0 and r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]


def test_wrk_client_counts_5xx_as_errors() -> None:
    r, _ = _load(fail_every=3)
    total = r["requests_ok"] + r["errors"]
    assert r["errors"] >= 1 and abs(r["errors"] - total / 3) <= 2


@pytest.mark.parametrize("text", ["plain", "x]]y", "x]=]y]==]", "]"])
def test_lua_string_level_is_never_closed_inside(text: str) -> None:
    lit = _lua_string(text)
    level = lit.index("[", 1) - 1
    close = f"]{'=' * level}]"
    assert lit == f"[{'=' * level}[{text}{close}" and close not in text
