"""BM25 over a Lucene index built by pyserini/Anserini from a JSONL corpus, cached by content hash.

The index is built once per (corpus content, settings) into ``<cache>/indexes/bm25-<sha256>`` and
reused by every later process: the first start on the 22k-passage bundled corpus takes seconds, a
restart milliseconds. Each passage is indexed as Search-R1's ``'"title"\\ntext'`` so a query that
names an entity matches its title, and the stored raw JSON keeps the index usable by Search-R1's
own pyserini server.

Searching calls Anserini's ``io.anserini.search.SimpleSearcher`` (the Java class behind pyserini's
``LuceneSearcher``, from the jar pyserini ships): ``batch_search`` with a thread count for
batches, plain ``search`` for a single query - and for every query of a batch when ``threads`` is 1:
``batch_search`` spins up a Java thread pool per call, which with one thread only costs CPU
(~0.38 vs ~0.32 ms per warm query on 2 cores). That is the setting for a server that gets its
parallelism from several worker processes instead (``serve-retriever --workers``). We call the Java class directly rather than through ``pyserini.search.lucene`` because
importing that Python module also imports torch, transformers, scikit-learn and an OpenAI client
- 7-10 s per process (every server start, every env worker) for a wrapper of a few lines; the
results are identical (checked by a test).

Lucene's ``IndexSearcher`` is thread-safe but the pyjnius bridge to it is not: concurrent calls
from several Python threads crossed results and raised JVM errors. Every JVM call here therefore
holds :data:`~srpo_envs.retrievers.jvm.JVM_LOCK`, and a batch of queries goes down as *one*
``batch_search`` call that Java spreads over its own threads. Callers that want throughput from
many concurrent requests batch them (the retrieval server does), rather than calling from many
threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srpo_envs.retrievers.base import (
    CorpusRetriever,
    Passage,
    atomic_write_text,
    check_k,
    default_cache_dir,
    file_lock,
    settings_key,
)
from srpo_envs.retrievers.jvm import JVM_LOCK, anserini_jar, ensure_jvm

MARKER = "srpo_index.json"
#: Lucene's default BooleanQuery limit (1024 clauses, one per distinct query term) makes a long,
#: term-rich query throw TooManyClauses; a policy can emit such a query, so allow far more.
MAX_QUERY_CLAUSES = 1 << 16


#: Most indexes one indexer process builds (and file locks one batch holds at once).
INDEXER_BATCH = 256


def run_lucene_indexer(jobs: Sequence[tuple[Path, Path]], threads: int) -> list[int]:
    """Index every ``(input_dir, index_dir)`` of ``jobs`` in one Anserini subprocess; its doc counts.

    The subprocess is isolated (``python -I``: the working directory and ``PYTHON*`` variables never
    reach its import path) and its failure is an error carrying the tail of its output.
    """
    if not jobs:
        return []
    argv = [sys.executable, "-I", "-m", "srpo_envs.retrievers._lucene_index", str(int(threads))]
    for input_dir, index_dir in jobs:
        argv += [str(input_dir), str(index_dir)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    tail = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode != 0:
        raise RuntimeError(f"Lucene indexing failed (exit {proc.returncode}):\n{tail}")
    counts = {}
    for line in proc.stdout.splitlines():
        if line.startswith('{"srpo_index"'):
            row = json.loads(line)
            counts[row["srpo_index"]] = int(row["num_docs"])
    missing = [str(d) for _, d in jobs if str(d) not in counts]
    if missing:
        raise RuntimeError(f"Lucene indexer reported no document count for {missing[:3]}:\n{tail}")
    return [counts[str(d)] for _, d in jobs]


def lucene_settings() -> dict[str, Any]:
    """What a Lucene index's cache key covers besides the corpus: the Anserini jar and the document
    layout (Search-R1's ``contents``, raw JSON stored). ``srpo index build`` keys by the same, so a
    retriever reuses its index."""
    return {"kind": "bm25-lucene", "jar": Path(anserini_jar()).name, "contents": "search-r1", "raw": True}


def publish_lucene_index(
    index: Path,
    target: Path,
    *,
    fingerprint: str,
    key: str,
    settings: dict[str, Any],
    num_docs: int,
    expected: int,
    seconds: float,
) -> None:
    """Mark the freshly built ``index`` (its :data:`MARKER`) and move it to ``target`` with one
    ``os.replace``; the caller holds ``target``'s file lock. An index missing documents is an error and
    is never published."""
    if num_docs != expected:
        raise RuntimeError(f"Lucene indexed {num_docs} of {expected} passages")
    info = {
        "corpus_sha256": fingerprint,
        "key": key,
        "settings": settings,
        "num_docs": num_docs,
        "build_seconds": round(seconds, 3),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(index / MARKER, json.dumps(info, indent=2))
    if target.exists():  # a stale (unmarked) dir or an explicit rebuild
        shutil.rmtree(target)
    os.replace(index, target)


def build_lucene_index(
    passages: Sequence[Passage],
    fingerprint: str,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    threads: int | None = None,
    rebuild: bool = False,
) -> tuple[Path, bool]:
    """Return ``(index_dir, built)``: the cached index for this corpus, building it if missing.

    ``built`` is False when an existing index was reused. The build goes to a private temp dir
    next to the target and is published with one ``os.replace``, under a file lock, so a crash
    or a concurrent process never leaves a half-written index where a reader would pick it up.
    A finished index carries ``srpo_index.json``; a directory without it is never trusted.
    """
    return build_lucene_indexes([(passages, fingerprint)], cache_dir, threads=threads, rebuild=rebuild)[0]


def build_lucene_indexes(
    corpora: Sequence[tuple[Sequence[Passage], str]],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    threads: int | None = None,
    rebuild: bool = False,
) -> list[tuple[Path, bool]]:
    """:func:`build_lucene_index` for many ``(passages, fingerprint)`` corpora, missing ones built by
    one indexer process per :data:`INDEXER_BATCH`: what many small corpora (a warm start's invented
    worlds) need, since a JVM start costs more than indexing a few hundred passages."""
    settings = lucene_settings()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    keys = [settings_key(fingerprint, settings) for _, fingerprint in corpora]
    first: dict[str, int] = {}  # key -> index of its first corpus (a corpus given twice is built once)
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    target = {key: root / "indexes" / f"bm25-{key[:32]}" for key in first}
    built: dict[str, bool] = {key: False for key in first if (target[key] / MARKER).is_file() and not rebuild}
    todo = sorted(set(first) - set(built))  # sorted: two batch builders never wait on each other in a cycle
    n_threads = threads or max(1, min(8, os.cpu_count() or 1))
    for start in range(0, len(todo), INDEXER_BATCH):
        chunk = todo[start : start + INDEXER_BATCH]
        with contextlib.ExitStack() as stack:
            for key in chunk:
                stack.enter_context(file_lock(root / "indexes" / f".bm25-{key[:32]}.lock"))
            for key in chunk:
                if (target[key] / MARKER).is_file() and not rebuild:  # published while we waited
                    built[key] = False
            jobs = {
                key: Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=root / "indexes"))
                for key in chunk
                if key not in built
            }
            stack.callback(
                lambda dirs=tuple(jobs.values()): [shutil.rmtree(d, ignore_errors=True) for d in dirs]
            )
            for key, tmp in jobs.items():
                (tmp / "input").mkdir()
                with open(tmp / "input" / "docs.jsonl", "w", encoding="utf-8") as fh:
                    for p in corpora[first[key]][0]:
                        fh.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")
            t0 = time.perf_counter()
            counts = run_lucene_indexer([(tmp / "input", tmp / "index") for tmp in jobs.values()], n_threads)
            seconds = (time.perf_counter() - t0) / max(1, len(jobs))
            for (key, tmp), num_docs in zip(jobs.items(), counts, strict=True):
                passages, fingerprint = corpora[first[key]]
                publish_lucene_index(
                    tmp / "index",
                    target[key],
                    fingerprint=fingerprint,
                    key=key,
                    settings=settings,
                    num_docs=num_docs,
                    expected=len(passages),
                    seconds=seconds,
                )
                built[key] = True
    return [(target[key], built[key] and first[key] == i) for i, key in enumerate(keys)]


class BM25Retriever(CorpusRetriever):
    """Lucene BM25 (pyserini) over a corpus JSONL path or a list of passages.

    ``k1``/``b`` default to Anserini's (0.9, 0.4), as in Search-R1's BM25 setup. ``threads`` is the
    Java thread count for ``batch_search`` (default: CPU count, at most 8; 1 searches a batch's
    queries one after another, without a Java thread pool). ``index_built`` tells
    whether this construction had to build the index (False when it came from the cache).

    ``cache_size`` most recent ``(query, k)`` results are kept (default 0: none, so a server or a
    benchmark measures Lucene): the ranking is a pure function of the query, and an RL group's samples
    mostly send the same query (the question's name), so the search env's shared retriever keeps
    :data:`srpo_envs.search.QUERY_CACHE` of them and a repeat skips the JVM round trip, with the same
    passages and scores (``cache_hits`` counts those).

    Safe to call from several threads (calls are serialised on ``JVM_LOCK``), but each Python
    thread that searches attaches itself to the JVM and stays attached: call it from long-lived
    threads, not from thousands of short-lived ones. Pass many queries in one call for speed.
    """

    name = "bm25"

    def __init__(
        self,
        corpus: str | os.PathLike[str] | Sequence[Passage],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        k1: float = 0.9,
        b: float = 0.4,
        threads: int | None = None,
        rebuild: bool = False,
        cache_size: int = 0,
    ) -> None:
        super().__init__(corpus)
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.cache_size = cache_size
        #: (query, k) -> (docid, score) hits, least recently used first; read and written under JVM_LOCK
        self._hits_cache: OrderedDict[tuple[str, int], list[tuple[str, float]]] = OrderedDict()
        self.cache_hits = 0
        self.threads = threads or max(1, min(8, os.cpu_count() or 1))
        self.index_dir, self.index_built = build_lucene_index(
            self.passages, self.fingerprint, cache_dir, threads=self.threads, rebuild=rebuild
        )
        self._searcher: Any = None
        with JVM_LOCK:
            ensure_jvm()
            from jnius import autoclass

            autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(MAX_QUERY_CLAUSES)
            self._array_list = autoclass("java.util.ArrayList")
            searcher = autoclass("io.anserini.search.SimpleSearcher")(str(self.index_dir))
            searcher.set_bm25(float(k1), float(b))
            searcher.search("warm up", 1)
            self._searcher = searcher

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if self._searcher is None:
            raise RuntimeError("BM25Retriever is closed")
        idx, live = self._split_queries(queries)
        k = check_k(k, len(self.passages))
        out: list[list[Passage]] = [[] for _ in queries]
        if not live:
            return out
        with JVM_LOCK:
            hits_per_query = self._cached_hits(live, k)
        for i, hits in zip(idx, hits_per_query, strict=True):
            ranked = []
            for docid, score in hits:
                p = self._by_id[docid]
                ranked.append(Passage(p.id, p.title, p.text, score))
            out[i] = ranked
        return out

    def _cached_hits(self, live: list[str], k: int) -> list[list[tuple[str, float]]]:
        """:meth:`_lucene_hits` through the LRU cache: only queries not seen lately go to Java (once each,
        in one call). Call with ``JVM_LOCK`` held."""
        if not self.cache_size:  # a server or a benchmark: straight to Lucene, as before the cache
            return self._lucene_hits(live, k)
        cache = self._hits_cache
        found: dict[str, list[tuple[str, float]]] = {}
        for q in live:
            hits = cache.get((q, k))
            if hits is not None:
                cache.move_to_end((q, k))
                found[q] = hits
                self.cache_hits += 1
        misses = list(dict.fromkeys(q for q in live if q not in found))
        if misses:
            for q, hits in zip(misses, self._lucene_hits(misses, k), strict=True):
                found[q] = hits
                cache[(q, k)] = hits
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return [found[q] for q in live]

    def _lucene_hits(self, live: list[str], k: int) -> list[list[tuple[str, float]]]:
        """``(docid, score)`` per query, read out of Java. Call with ``JVM_LOCK`` held: every Java
        object made here is also released (its local ref dropped) before the lock is let go."""
        searcher = self._searcher
        if searcher is None:  # closed by another thread since search() checked
            raise RuntimeError("BM25Retriever is closed")
        if len(live) == 1 or self.threads == 1:
            return [[(h.docid, float(h.score)) for h in searcher.search(q, k)] for q in live]
        jqueries, jqids = self._array_list(), self._array_list()
        for i, q in enumerate(live):
            jqueries.add(q)
            jqids.add(str(i))
        res = searcher.batch_search(jqueries, jqids, k, min(self.threads, len(live)))
        by_qid = {
            e.getKey(): [(h.docid, float(h.score)) for h in e.getValue()] for e in res.entrySet().toArray()
        }
        return [by_qid.get(str(i), []) for i in range(len(live))]

    def close(self) -> None:
        with JVM_LOCK:
            searcher, self._searcher = getattr(self, "_searcher", None), None
            if searcher is not None:
                searcher.close()
                del searcher
