"""``srpo index build``: index a full-size corpus once, into a directory the envs, eval and server open.

The corpus is Search-R1's format: JSONL (optionally gzipped), one passage per line with ``id`` and
``contents`` (``'"Title"\\ntext'``), or ``id``/``title``/``text``. The build

1. streams the corpus in batches (a progress bar over passages), validating every record and
   writing ``shards/docs-NNNNN.jsonl`` in Lucene's ``JsonCollection`` layout; a shard that exists is
   not rewritten, so an interrupted build resumes where it stopped;
2. ``bm25``: runs Anserini's ``IndexCollection`` (pyserini's Lucene indexer, in a subprocess: see
   :mod:`srpo_envs.retrievers._lucene_index`) over the shards; ``dense``: embeds each shard with the
   sentence-transformer and saves it (``dense-shards/emb-NNNNN.npy``, resumable per shard), then joins
   them for faiss;
3. writes the result where :class:`~srpo_envs.retrievers.bm25.BM25Retriever` /
   :class:`~srpo_envs.retrievers.dense.DenseRetriever` look for their cache when given
   ``cache_dir=DIR`` (same content-hash key), plus ``DIR/srpo_index.json`` (the manifest).

Opening (:func:`open_index`) therefore goes through the ordinary retriever classes, which own the
JVM (pyjnius calls are serialised there) and search exactly as the built-in index does. The
retrievers keep the passages in memory to map hits back to text; for a corpus too large for that
(the 21M-passage Wikipedia dump needs tens of GB), serve it once with ``srpo envs serve-retriever
--index DIR`` and point the envs at it with ``--retriever-url``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srpo_envs.retrievers.base import (
    Retriever,
    atomic_write_bytes,
    atomic_write_text,
    corpus_fingerprint,
    file_lock,
    iter_corpus_jsonl,
    load_corpus_jsonl,
    settings_key,
)
from srpo_envs.retrievers.bm25 import (
    MARKER,
    BM25Retriever,
    lucene_settings,
    publish_lucene_index,
    run_lucene_indexer,
)
from srpo_envs.retrievers.dense import DenseRetriever, default_dense_model, model_identity

MANIFEST = "srpo_index.json"
MANIFEST_FORMAT = 1
BACKENDS = ("bm25", "dense")
#: Passages per shard: a shard is the unit of resume (and of one embedding call for dense).
DEFAULT_BATCH = 50_000


def _progress(total: int | None, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="passage", disable=not enabled, file=sys.stderr)


def _file_identity(path: Path) -> dict[str, Any]:
    """Cheap identity of a corpus file (path, size, mtime): what decides whether a build can resume."""
    st = path.stat()
    return {"corpus": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_shards(corpus: Path, out: Path, batch_size: int, progress: bool) -> tuple[str, int, list[Path]]:
    """Pass 1: stream the corpus into shards; returns (corpus fingerprint, passages, shard paths).

    The fingerprint is :func:`srpo_envs.retrievers.base.corpus_fingerprint` computed while streaming
    (same bytes hashed), so the retrievers find this build under their own cache key.
    """
    h = hashlib.sha256()
    shards: list[Path] = []
    buf: list[str] = []
    n = 0
    # shards of another corpus file or another batch size are not this build's: start them over
    state = {**_file_identity(corpus), "batch_size": batch_size}
    state_file = out / "shards" / "state.json"
    if state_file.is_file() and json.loads(state_file.read_text(encoding="utf-8")) != state:
        shutil.rmtree(out / "shards")
    (out / "shards").mkdir(parents=True, exist_ok=True)
    atomic_write_text(state_file, json.dumps(state))

    def flush() -> None:
        path = out / "shards" / f"docs-{len(shards):05d}.jsonl"
        if not path.is_file():  # resume: a finished shard was written atomically
            atomic_write_text(path, "".join(buf))
        shards.append(path)
        buf.clear()

    bar = _progress(None, f"reading {corpus.name}", progress)
    try:
        for p in iter_corpus_jsonl(corpus):
            h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode("utf-8"))
            h.update(b"\n")
            buf.append(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")
            n += 1
            if len(buf) >= batch_size:
                flush()
            bar.update(1)
        if buf:
            flush()
    finally:
        bar.close()
    if n == 0:
        raise ValueError(f"corpus {corpus} has no passages")
    for stale in sorted((out / "shards").glob("docs-*.jsonl"))[len(shards) :]:
        stale.unlink()  # left by an earlier build with another batch size
    return h.hexdigest(), n, shards


def _dense_encoder(model: str | None, max_seq_length: int = 256) -> tuple[Any, dict[str, Any]]:
    """The encoder and cache settings :class:`srpo_envs.retrievers.dense.DenseRetriever` uses."""
    from sentence_transformers import SentenceTransformer

    name = model or default_dense_model()
    local = Path(name).expanduser().is_dir()
    encoder = SentenceTransformer(name, device="cpu", local_files_only=local)
    encoder.max_seq_length = int(max_seq_length)
    settings = {
        "kind": "dense-flatip",
        "model": model_identity(name),
        "max_seq_length": encoder.max_seq_length,
        "text": "search-r1-contents",
        "normalize": True,
    }
    return encoder, settings


def build_bm25(out: Path, fingerprint: str, n: int, threads: int, say: Callable[[str], None]) -> Path:
    settings = lucene_settings()
    key = settings_key(fingerprint, settings)
    target = out / "indexes" / f"bm25-{key[:32]}"
    with file_lock(out / "indexes" / f".bm25-{key[:32]}.lock"):
        if (target / MARKER).is_file():
            say(f"Lucene index already built: {target}")
            return target
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out / "indexes"))
        try:
            say(f"Lucene indexing {n} passages with {threads} threads ...")
            t0 = time.perf_counter()
            (num_docs,) = run_lucene_indexer([(out / "shards", tmp / "index")], threads)
            publish_lucene_index(
                tmp / "index",
                target,
                fingerprint=fingerprint,
                key=key,
                settings=settings,
                num_docs=num_docs,
                expected=n,
                seconds=time.perf_counter() - t0,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_dense(
    out: Path, fingerprint: str, n: int, shards: list[Path], model: str | None, batch: int, progress: bool
) -> Path:
    import io

    import numpy as np

    encoder, settings = _dense_encoder(model)
    cache = out / "dense" / f"emb-{settings_key(fingerprint, settings)[:32]}"
    emb_file = cache / "embeddings.npy"
    if emb_file.is_file() and (cache / "meta.json").is_file():
        return cache
    parts_dir = out / "dense-shards"
    parts_dir.mkdir(parents=True, exist_ok=True)
    bar = _progress(n, "embedding", progress)
    parts = []
    try:
        for i, shard in enumerate(shards):
            part = parts_dir / f"emb-{i:05d}.npy"
            texts = [json.loads(line)["contents"] for line in shard.read_text(encoding="utf-8").splitlines()]
            if not part.is_file():
                emb = encoder.encode(
                    texts,
                    batch_size=batch,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                b = io.BytesIO()
                np.save(b, np.ascontiguousarray(emb, dtype=np.float32))
                atomic_write_bytes(part, b.getvalue())
            parts.append(part)
            bar.update(len(texts))
    finally:
        bar.close()
    emb = np.concatenate([np.load(p) for p in parts])
    if emb.shape[0] != n:
        raise RuntimeError(f"{emb.shape[0]} embeddings for {n} passages")
    b = io.BytesIO()
    np.save(b, emb)
    atomic_write_bytes(emb_file, b.getvalue())
    meta = {"corpus_sha256": fingerprint, "settings": settings, "shape": list(emb.shape)}
    atomic_write_text(cache / "meta.json", json.dumps(meta, indent=2))
    shutil.rmtree(parts_dir, ignore_errors=True)
    return cache


def build_index(
    corpus: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    backend: str = "bm25",
    batch_size: int = DEFAULT_BATCH,
    threads: int | None = None,
    model: str | None = None,
    embed_batch: int = 64,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build (or resume building) the ``backend`` index of ``corpus`` in ``out``; returns the manifest.

    The manifest also records ``seconds`` and ``seconds_per_1k_passages`` of this call (a resumed
    or already-finished build reports the time of the part it redid).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if model is not None and backend != "dense":
        raise ValueError("model= applies to the dense backend only")
    src = Path(corpus).expanduser().resolve()
    if not src.is_file():
        raise FileNotFoundError(f"corpus {src} does not exist (expected JSONL with 'id' and 'contents')")
    root = Path(out).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    say = log or (lambda s: None)
    manifest_path = root / MANIFEST
    if manifest_path.is_file():
        done = json.loads(manifest_path.read_text(encoding="utf-8"))
        if (
            done.get("backend") == backend
            and done.get("model") == model
            and done.get("corpus_file") == _file_identity(src)
            and (root / done["index_path"]).is_dir()
        ):
            say(f"{root} already holds this index; nothing to do")
            return done
    t0 = time.perf_counter()
    fingerprint, n, shards = _write_shards(src, root, batch_size, progress)
    n_threads = threads or max(1, min(8, os.cpu_count() or 1))
    if backend == "bm25":
        built = build_bm25(root, fingerprint, n, n_threads, say)
    else:
        built = _build_dense(root, fingerprint, n, shards, model, embed_batch, progress)
    seconds = time.perf_counter() - t0
    manifest = {
        "format": MANIFEST_FORMAT,
        "backend": backend,
        "corpus": str(src),
        "corpus_file": _file_identity(src),
        "corpus_fingerprint": fingerprint,
        "num_passages": n,
        "index_path": str(built.relative_to(root)),
        "model": model,
        "threads": n_threads,
        "seconds": round(seconds, 3),
        "seconds_per_1k_passages": round(seconds * 1000 / n, 4),
    }
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(root / "shards", ignore_errors=True)  # the index holds what it needs (Lucene: raw docs)
    return manifest


def read_manifest(index_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a finished ``srpo index build`` directory (clear errors for anything else)."""
    root = Path(index_dir).expanduser()
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{root} is not an srpo index directory (no {MANIFEST}); build one with "
            "`srpo index build --corpus FILE.jsonl --out DIR`"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("backend") not in BACKENDS:
        raise ValueError(
            f"{path}: unsupported index manifest {manifest.get('format')!r}/{manifest.get('backend')!r}"
        )
    return manifest


_OPEN: dict[str, Retriever] = {}
_OPEN_LOCK = threading.Lock()


def open_index(
    index_dir: str | os.PathLike[str],
    corpus: str | os.PathLike[str] | None = None,
    *,
    threads: int | None = None,
) -> Retriever:
    """A retriever over a built index directory (shared per process, like the env's own retrievers).

    ``corpus`` overrides the corpus path recorded at build time (e.g. after moving the files). The
    corpus must be the one indexed: a retriever that finds no matching index would build a new one,
    so that case is refused instead of silently re-indexing. ``threads``: BM25's search threads
    per batch (its default when None; ignored by a dense index).
    """
    root = Path(index_dir).expanduser().resolve()
    manifest = read_manifest(root)
    src = Path(corpus).expanduser() if corpus is not None else Path(manifest["corpus"])
    if not src.is_file():
        raise FileNotFoundError(
            f"index {root} was built from {manifest['corpus']}, which is gone; pass the corpus file again"
        )
    key = f"{root}|{src.resolve()}|{threads}"
    with _OPEN_LOCK:
        if key in _OPEN:
            return _OPEN[key]

        passages = load_corpus_jsonl(src)
        if corpus_fingerprint(passages) != manifest["corpus_fingerprint"]:
            raise ValueError(
                f"{src} is not the corpus indexed in {root} (content hash differs); rebuild the index"
            )
        if manifest["backend"] == "bm25":
            retriever: Retriever = BM25Retriever(passages, cache_dir=root, threads=threads)
            built = retriever.index_built  # type: ignore[attr-defined]
        else:
            retriever = DenseRetriever(passages, cache_dir=root, model=manifest.get("model"))
            built = retriever.embeddings_built  # type: ignore[attr-defined]
        if built:  # the retriever could not find the build (e.g. another pyserini jar): say so
            import logging

            logging.getLogger(__name__).warning(
                "index in %s did not match this install; it was rebuilt", root
            )
        _OPEN[key] = retriever
        return retriever


def index_corpus_info(index_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What an eval record names for ``index=DIR``: backend, corpus file name and content hash."""
    m = read_manifest(index_dir)
    return {
        "retriever": f"{m['backend']}-index",
        "corpus": Path(m["corpus"]).name,
        "corpus_sha256": m["corpus_fingerprint"],
    }
