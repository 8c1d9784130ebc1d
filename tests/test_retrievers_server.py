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
    assert runner.invoke(cli.app, ["serve-retriever", "--backend", "tfidf"]).exit_code != 0
    assert runner.invoke(cli.app, ["serve-retriever", "--model", "x"]).exit_code != 0
    assert "serve-retriever" in runner.invoke(cli.app, ["--help"]).output
