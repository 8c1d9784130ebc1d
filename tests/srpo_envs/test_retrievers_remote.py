"""RemoteRetriever against real uvicorn servers on loopback: equivalence, batching, retries, limits."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from srpo_envs.retrievers import Passage, RemoteRetriever, Retriever, ServerLimits  # noqa: E402
from srpo_envs.retrievers.remote import RemoteRetrieverError  # noqa: E402
from srpo_envs.retrievers.server import BackgroundServer, create_app  # noqa: E402

CORPUS = [
    Passage("n1", "Orlenvale", "Orlenvale is a city in the country of Kastora."),
    Passage("n2", "Kastora", "Kastora is a country. The capital of Kastora is Orlenvale."),
    Passage("n3", "Tremi Labs", "Tremi Labs is a company founded in 1931 by Dova Kelmaris."),
    Passage("n4", "Dova Kelmaris", "Dova Kelmaris is a chemist born in 1902 in the city of Orlenvale."),
]


class Recording(Retriever):
    """Returns the first k passages; records peak concurrency; can sleep and fail on demand."""

    name = "recording"

    def __init__(self, delay: float = 0.0, fail_first: int = 0) -> None:
        self.delay, self.fail_first = delay, fail_first
        self.calls = self.active = self.peak = 0
        self.batch_sizes: list[int] = []
        self.entered = threading.Event()  # set once a call is inside the backend
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        with self._lock:
            self.calls += 1
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.batch_sizes.append(len(queries))
            fail = self.calls <= self.fail_first
        self.entered.set()
        try:
            time.sleep(self.delay)
            if fail:
                raise RuntimeError("transient backend failure")
            return [
                [Passage(p.id, p.title, p.text, 1.0 / (r + 1)) for r, p in enumerate(CORPUS[:k])]
                for _ in queries
            ]
        finally:
            with self._lock:
                self.active -= 1


def test_remote_bm25_matches_direct_bm25(tmp_path):
    pytest.importorskip("pyserini")
    from srpo_envs.retrievers import BM25Retriever

    direct = BM25Retriever(CORPUS, cache_dir=tmp_path)
    queries = ["capital of Kastora", "", "who founded Tremi Labs", "chemist born in Orlenvale", "zzqx"]
    with BackgroundServer(create_app(direct)) as srv, RemoteRetriever(srv.url, timeout=10) as remote:
        assert remote.health()["num_passages"] == len(CORPUS)
        got = remote.search(queries, 3)
        want = direct.search(queries, 3)
        assert [[(p.id, p.title, p.text) for p in hs] for hs in got] == [
            [(p.id, p.title, p.text) for p in hs] for hs in want
        ]
        assert [[round(p.score, 4) for p in hs] for hs in got] == [
            [round(p.score, 4) for p in hs] for hs in want
        ]
        # Concurrent clients through the server's worker threads (JVM calls off the main thread).
        results: list[list[list[Passage]]] = []
        threads = [
            threading.Thread(target=lambda: results.append(remote.search(queries, 3))) for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8 and all(
            [[p.id for p in hs] for hs in r] == [[p.id for p in hs] for hs in want] for r in results
        )
    direct.close()


def test_client_splits_batches_and_skips_blank_queries():
    backend = Recording()
    with BackgroundServer(create_app(backend, limits=ServerLimits(max_queries=3))) as srv:
        remote = RemoteRetriever(srv.url + "/retrieve/", max_batch=3)
        out = remote.search(["q1", " ", "q2", "q3", "q4", "", "q5"], 2)
        assert [len(hs) for hs in out] == [2, 0, 2, 2, 2, 0, 2]
        assert backend.batch_sizes == [3, 2]
        assert remote.search(["", "  "], 2) == [[], []] and backend.calls == 2  # no request at all
        long = remote.search(["x" * 10_000], 1)  # cut to the server's query limit, not rejected
        assert [p.id for p in long[0]] == ["n1"]
        remote.close()


def test_server_bounds_concurrency():
    backend = Recording(delay=0.05)
    with BackgroundServer(create_app(backend, max_concurrency=2)) as srv, RemoteRetriever(srv.url) as remote:
        threads = [threading.Thread(target=remote.search, args=(["q"], 1)) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # one search thread (the backend is never entered twice at once) that merges waiting requests,
    # at most max_concurrency of them per call
    assert sum(backend.batch_sizes) == 12 and max(backend.batch_sizes) <= 2
    assert backend.peak == 1


def test_busy_server_answers_503_and_client_retries():
    backend = Recording(delay=0.2)
    app = create_app(backend, max_concurrency=1, max_pending=1)
    with BackgroundServer(app) as srv:
        with httpx.Client() as raw:
            hold = threading.Thread(
                target=raw.post, args=(srv.url + "/retrieve",), kwargs={"json": {"queries": ["a"]}}
            )
            hold.start()
            assert backend.entered.wait(5)
            busy = raw.post(srv.url + "/retrieve", json={"queries": ["b"]})
            hold.join()
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        backend.entered.clear()
        statuses: list[int] = []
        client = httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]})
        with RemoteRetriever(srv.url, retries=4, backoff=0.1, client=client) as remote:
            hold = threading.Thread(target=remote.search, args=(["a"], 1))
            hold.start()
            assert backend.entered.wait(5)
            assert [p.id for p in remote.search(["b"], 1)[0]] == ["n1"]
            hold.join()
        client.close()
        assert 503 in statuses and statuses.count(200) == 2  # "b" was refused while "a" ran, then retried


def test_transient_backend_failures_are_retried_then_surface():
    backend = Recording(fail_first=2)
    with BackgroundServer(create_app(backend)) as srv:
        with RemoteRetriever(srv.url, retries=2, backoff=0.01) as remote:
            assert len(remote.search(["q"], 2)[0]) == 2
        assert backend.calls == 3
        backend.fail_first = 10
        with (
            RemoteRetriever(srv.url, retries=1, backoff=0.01) as remote,
            pytest.raises(RemoteRetrieverError, match="503"),
        ):
            remote.search(["q"], 2)


def test_rejected_request_raises_value_error_without_retry():
    backend = Recording()
    with BackgroundServer(create_app(backend, limits=ServerLimits(max_topk=5))) as srv:
        remote = RemoteRetriever(srv.url, max_topk=50, retries=3)
        with pytest.raises(ValueError, match="HTTP 422"):
            remote.search(["q"], 6)
        assert backend.calls == 0
        remote.close()


def test_unreachable_server_fails_after_retries_with_backoff():
    with BackgroundServer(create_app(Recording())) as srv:
        url = srv.url
    remote = RemoteRetriever(url, timeout=1, retries=2, backoff=0.05)
    t0 = time.perf_counter()
    with pytest.raises(RemoteRetrieverError, match="3 attempts"):
        remote.search(["q"], 1)
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # slept before each retry
    remote.close()


def test_client_parses_search_r1_documents_and_retries_timeouts():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ReadTimeout("slow", request=request)
        body = {"result": [[{"document": {"id": "7", "contents": '"Gale"\nGale is a wind.'}, "score": 2.5}]]}
        return httpx.Response(200, json=body)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    remote = RemoteRetriever("http://search.invalid:8000", client=client, retries=1, backoff=0.01)
    assert remote.search(["wind"], 3) == [[Passage("7", "Gale", "Gale is a wind.", 2.5)]]
    assert calls["n"] == 2
    with pytest.raises(ValueError):
        remote.search(["wind"], 0)
    with pytest.raises(ValueError):
        remote.search("wind", 1)  # type: ignore[arg-type]
    client.close()
