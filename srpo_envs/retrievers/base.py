"""The retriever interface shared by every backend, plus corpus I/O and cache helpers.

A retriever maps a batch of query strings to ranked :class:`Passage` lists. Backends (BM25 via
pyserini/Lucene, dense via sentence-transformers + faiss, a remote Search-R1-style server) all
implement :meth:`Retriever.search` with the same edge-case rules, so an environment can swap them
without changing behaviour:

* an empty or whitespace-only query yields ``[]`` for that query (never an error: a policy that
  emits an empty ``<search></search>`` should get "no results", not crash a rollout);
* ``k < 1`` (or a non-integer ``k``) raises ``ValueError`` (a caller bug, not a model output);
* ``k`` larger than the corpus is clamped to the corpus size, so a result list has at most
  ``min(k, len(corpus))`` passages (BM25 can return fewer when few passages share a term).

Caches (Lucene indexes, embeddings, the decompressed bundled corpus) live under
:func:`default_cache_dir` and are keyed by a sha256 of the corpus *content* plus the settings, so
editing a corpus or changing a model never reuses a stale index.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srpo_common import atomic_write_bytes, atomic_write_text  # noqa: F401  (re-exported for the backends)

#: Bump when the on-disk layout of any cache changes, so old caches are ignored, not misread.
CACHE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text. ``score`` is the backend's relevance score (0.0 in a corpus)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """Search-R1's document rendering: the quoted title, a newline, then the text."""
        return f'"{self.title}"\n{self.text}'

    def to_document(self) -> dict[str, str]:
        """The ``document`` object of a Search-R1 ``/retrieve`` response (score excluded)."""
        return {"id": self.id, "title": self.title, "text": self.text, "contents": self.contents}


def split_contents(contents: str) -> tuple[str, str]:
    """Inverse of :attr:`Passage.contents` for Search-R1 corpora that only carry ``contents``.

    Search-R1 writes ``'"Title"\\ntext'``; anything without that shape is all text, no title.
    """
    head, sep, rest = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], rest
    return "", contents


def passage_from_record(rec: dict[str, Any], where: str = "record") -> Passage:
    """Build a passage from ``{id, title, text}`` (or Search-R1's ``{id, contents}``)."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "id" not in rec:
        raise ValueError(f"{where}: missing 'id'")
    if "text" in rec:
        title, text = rec.get("title") or "", rec["text"]
    elif "contents" in rec:
        title, text = split_contents(str(rec["contents"]))
    else:
        raise ValueError(f"{where}: needs 'text' (or Search-R1 'contents'), has {sorted(rec)}")
    title, text = str(title), str(text)
    if not (title.strip() or text.strip()):
        raise ValueError(f"{where}: passage {rec['id']!r} has neither title nor text")
    return Passage(id=str(rec["id"]), title=title, text=text)


def open_text(path: str | os.PathLike[str]) -> Any:
    """Open ``.jsonl`` or ``.jsonl.gz`` for reading text (gzip chosen by suffix)."""
    p = Path(path)
    return gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8")


def iter_corpus_jsonl(path: str | os.PathLike[str]) -> Iterator[Passage]:
    """Stream a corpus JSONL (optionally gzipped): one ``{"id", "title", "text"}`` object per line.

    Ids must be unique: retrievers return passages by id, so a duplicate would silently shadow
    another passage. Blank lines are skipped; a bad line raises ``ValueError`` naming ``file:line``.
    Streaming lets ``srpo index build`` shard a 21M-passage dump without holding it in memory.
    """
    seen: set[str] = set()
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg})") from None
            p = passage_from_record(rec, where)
            if p.id in seen:
                raise ValueError(f"{where}: duplicate passage id {p.id!r}")
            seen.add(p.id)
            yield p


def load_corpus_jsonl(path: str | os.PathLike[str]) -> list[Passage]:
    """Every passage of a corpus JSONL (see :func:`iter_corpus_jsonl`); an empty corpus is an error."""
    passages = list(iter_corpus_jsonl(path))
    if not passages:
        raise ValueError(f"corpus {path} has no passages")
    return passages


def write_corpus_jsonl(passages: Iterable[Passage], path: str | os.PathLike[str]) -> Path:
    """Write passages as ``{"id", "title", "text"}`` JSONL, atomically (temp file + rename)."""
    lines = (json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) for p in passages)
    return atomic_write_text(Path(path), "".join(f"{line}\n" for line in lines))


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """sha256 over the ordered ``(id, title, text)`` triples: the identity of a corpus's content.

    Independent of file format or compression, so a gzipped and a plain copy share one index.
    """
    h = hashlib.sha256()
    for p in passages:
        h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def settings_key(fingerprint: str, settings: dict[str, Any]) -> str:
    """Cache key = sha256(corpus fingerprint + canonical JSON of the settings that shape the cache)."""
    blob = json.dumps({"corpus": fingerprint, "v": CACHE_FORMAT_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def default_cache_dir() -> Path:
    """``$SRPO_CACHE_DIR``, else ``$XDG_CACHE_HOME/srpo``, else ``~/.cache/srpo``."""
    env = os.environ.get("SRPO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "srpo"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock (``flock``) so two processes never build the same cache twice.

    Where ``fcntl`` is missing (Windows) this is a no-op: builds still go to a private temp dir
    and are published with an atomic rename, so a race costs time, not correctness.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class ServerLimits:
    """Request limits of the ``/retrieve`` server; defined here so clients share them without FastAPI.

    The defaults fit RL rollouts (a few short queries, topk 3-10) with headroom.
    """

    max_queries: int = 256
    max_query_chars: int = 4096
    max_topk: int = 1000
    max_results: int = 20_000  # queries x topk per request: bounds response size (~15 MB)
    max_body_bytes: int = 8 * 1024 * 1024
    default_topk: int = 3  # Search-R1's default retrieval_topk


def check_k(k: int, n_docs: int) -> int:
    """Validate ``k`` and clamp it to the corpus size (see the module docstring for the rules)."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return min(k, n_docs)


class Retriever(ABC):
    """Batch retrieval: ``search(queries, k)`` -> one ranked passage list per query.

    Implementations must be safe to call from several threads at once (the server runs a bounded
    pool of worker threads against one retriever).
    """

    #: Short backend name, reported by the server's ``/health``.
    name: str = "retriever"

    @abstractmethod
    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Return ``len(queries)`` lists of at most ``k`` passages, best first."""

    @property
    def num_passages(self) -> int | None:
        """Corpus size when known locally (``None`` for remote backends)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to release
        """Release backend resources (searchers, HTTP clients). Idempotent."""

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CorpusRetriever(Retriever):
    """Base for local backends: holds the passages and an id -> passage map."""

    def __init__(self, corpus: str | os.PathLike[str] | Sequence[Passage]) -> None:
        if isinstance(corpus, str | os.PathLike):
            passages = load_corpus_jsonl(corpus)
        else:
            passages = list(corpus)
            if not passages:
                raise ValueError("corpus is empty")
            ids = {p.id for p in passages}
            if len(ids) != len(passages):
                raise ValueError("corpus has duplicate passage ids")
        self.passages: list[Passage] = passages
        self._by_id: dict[str, Passage] = {p.id: p for p in passages}
        self.fingerprint: str = corpus_fingerprint(passages)

    @property
    def num_passages(self) -> int:
        return len(self.passages)

    def _split_queries(self, queries: list[str]) -> tuple[list[int], list[str]]:
        """Indices and text of the non-blank queries (blank ones get ``[]`` without a backend call)."""
        if isinstance(queries, str):
            raise ValueError("queries must be a list of strings, not a single string")
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise ValueError(f"query {i} is {type(q).__name__}, not str")
        idx = [i for i, q in enumerate(queries) if q.strip()]
        return idx, [queries[i] for i in idx]
