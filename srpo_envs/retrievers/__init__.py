"""Retrievers for search environments: BM25 (pyserini/Lucene), dense (sentence-transformers + faiss),
and a client for Search-R1-compatible retrieval servers - all behind one :class:`Retriever` API.

Importing this package is cheap: the heavy backends (a JVM, torch) load only when a backend class
is first used, so environments that talk to a remote server never pay for them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from srpo_envs.retrievers.base import (
    Passage,
    Retriever,
    ServerLimits,
    corpus_fingerprint,
    default_cache_dir,
    iter_corpus_jsonl,
    load_corpus_jsonl,
    write_corpus_jsonl,
)
from srpo_envs.retrievers.bm25 import BM25Retriever
from srpo_envs.retrievers.dense import DenseRetriever

if TYPE_CHECKING:
    from srpo_envs.retrievers.bm25 import BM25Retriever
    from srpo_envs.retrievers.dense import DenseRetriever
    from srpo_envs.retrievers.remote import RemoteRetriever

BACKENDS = ("bm25", "dense", "remote")

_LAZY = {
    "BM25Retriever": "srpo_envs.retrievers.bm25",
    "DenseRetriever": "srpo_envs.retrievers.dense",
    "RemoteRetriever": "srpo_envs.retrievers.remote",
    "ensure_jvm": "srpo_envs.retrievers.jvm",
    "create_app": "srpo_envs.retrievers.server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_retriever(
    backend: str, corpus: str | os.PathLike[str] | Sequence[Passage] | None = None, **kwargs: Any
) -> Retriever:
    """Build a retriever by name.

    ``bm25``/``dense``: ``corpus`` is a JSONL path or a list of passages (the bundled 22,633-passage
    search corpus is ``srpo_envs.tasks.search_data.bundled_corpus_path()``). ``remote``: pass ``url=``; ``corpus`` must be ``None`` (the server
    owns it). Other keyword arguments go to the backend's constructor.
    """
    if backend == "remote":
        if corpus is not None:
            raise ValueError("the remote backend takes url=..., not a corpus")
        from srpo_envs.retrievers.remote import RemoteRetriever

        return RemoteRetriever(**kwargs)
    if backend not in ("bm25", "dense"):
        raise ValueError(f"unknown retriever backend {backend!r}; choose one of {BACKENDS}")
    if corpus is None:  # the bundled corpus belongs to srpo_envs.tasks.search_data, a layer above
        raise ValueError(
            f"the {backend} backend needs a corpus (a JSONL path or passages); for the bundled search "
            "corpus pass srpo_envs.tasks.search_data.bundled_corpus_path()"
        )
    if backend == "bm25":
        return BM25Retriever(corpus, **kwargs)

    return DenseRetriever(corpus, **kwargs)


__all__ = [
    "BACKENDS",
    "BM25Retriever",
    "DenseRetriever",
    "Passage",
    "RemoteRetriever",
    "Retriever",
    "ServerLimits",
    "corpus_fingerprint",
    "create_app",
    "default_cache_dir",
    "ensure_jvm",
    "iter_corpus_jsonl",
    "load_corpus_jsonl",
    "make_retriever",
    "write_corpus_jsonl",
]
