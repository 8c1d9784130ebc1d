"""Open-domain QA tasks for search environments: bundled benchmark samples, user files, hub datasets,
and the bundled retrieval corpus.

``load_qa(source)`` resolves, in order: a bundled name (``nq``, ``triviaqa``, ``popqa``,
``hotpotqa``, ``2wikimultihopqa``, ``musique``, ``bamboogle``), a local ``.jsonl``/``.jsonl.gz``/
``.parquet``/``.json`` file, and finally a Hugging Face ``datasets`` id (needs network or the HF
cache). Local files and hub ids are read by the same ``datasets`` path
(:func:`srpo_envs.tasks.records.read_records`).

Evidence (``meta.evidence_in_corpus``): the bundled corpus is built from the gold/context paragraphs
of nq, hotpotqa, musique and 2wikimultihopqa. nq and hotpotqa (all 500) and musique (200 of 500) have
their supporting passages in it (``True``); for 2wikimultihopqa the question's context paragraphs are
in it but which ones are gold is matched by a heuristic (``"heuristic"``). triviaqa, popqa, bamboogle
and the other 300 musique questions have no evidence there (``False``): their EM over the bundled
corpus measures what the model already knows (plus lucky retrieval), not search. Use
``evidence_only=True``, or a full Wikipedia index (``srpo index build``), for a retrieval score.

The bundled corpus is four per-source passage files (22,633 passages, ids unique across files,
see ``srpo_envs/data/search/ATTRIBUTION.md``); :func:`bundled_corpus_path` joins them into one
JSONL in the cache once, so every backend indexes them as a single corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from srpo_envs.retrievers.base import atomic_write_bytes, default_cache_dir
from srpo_envs.tasks.records import read_records

#: Bundled name -> file in ``srpo_envs/data/search``. All are evaluation samples (dev/test).
SEARCH_DATASETS: dict[str, str] = {
    "nq": "nq.jsonl.gz",
    "triviaqa": "triviaqa.jsonl.gz",
    "popqa": "popqa.jsonl.gz",
    "hotpotqa": "hotpotqa.jsonl.gz",
    "2wikimultihopqa": "2wikimultihopqa.jsonl.gz",
    "musique": "musique.jsonl.gz",
    "bamboogle": "bamboogle.jsonl.gz",
}

#: The corpus parts, in the order they are concatenated by :func:`bundled_corpus_path`.
CORPUS_FILES: tuple[str, ...] = (
    "nq_gold.jsonl.gz",
    "hotpotqa_dev_distractor.jsonl.gz",
    "musique_dev.jsonl.gz",
    "2wikimultihopqa_dev.jsonl.gz",
)
BUNDLED_CORPUS_SIZE = 22_633


@dataclass(frozen=True)
class QATask:
    """One question with all accepted gold answers (aliases included), best scored with
    :func:`srpo_envs.qa_metrics.exact_match` / ``f1`` against the whole tuple.

    ``meta`` carries provenance such as ``evidence_in_corpus`` (True, False or ``"heuristic"``) and
    ``gold_passage_ids`` (corpus ids of the supporting passages, where known).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def data_file(name: str) -> Path:
    """Path of a bundled file in ``srpo_envs/data/search``."""
    return Path(str(resources.files("srpo_envs") / "data" / "search" / name))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, streamed (for result provenance)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dataset_sha256(source: str) -> str:
    """sha256 of the bytes a bundled or local dataset is read from; for a hub id, of the id string."""
    if source in SEARCH_DATASETS:
        return sha256_file(data_file(SEARCH_DATASETS[source]))
    if Path(source).expanduser().is_file():
        return sha256_file(Path(source).expanduser())
    return hashlib.sha256(source.encode()).hexdigest()


def _read_records(path: Path) -> list[dict[str, Any]]:
    """A bundled ``.jsonl.gz`` (read directly: fast, and its bytes are what ``dataset_sha256`` hashes)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _answers(value: Any) -> list[str]:
    """Gold answers from the shapes public QA files use: a string, a list, SQuAD's ``{"text": [...]}``,
    TriviaQA's ``{"value", "aliases"}``; numpy arrays from parquet behave as lists."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        out: list[str] = []
        for key in ("text", "value", "aliases", "normalized_aliases"):
            if key in value:
                out += _answers(value[key])
        return out
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [a for v in value for a in _answers(v)]
    return [str(value)]


def _to_task(rec: dict[str, Any], source: str, index: int) -> QATask:
    question = rec.get("question", rec.get("query", rec.get("problem")))
    raw = next((rec[k] for k in ("answers", "golden_answers", "answer", "answer_aliases") if k in rec), None)
    answers = list(dict.fromkeys(a.strip() for a in _answers(raw) if a.strip()))  # dedupe, keep order
    if question is None or not answers:
        raise ValueError(f"{source} record {index} needs a question and at least one answer: {sorted(rec)}")
    meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
    return QATask(
        id=str(rec.get("id", rec.get("_id", f"{source}-{index}"))),
        question=str(question).strip(),
        answers=tuple(answers),
        source=str(rec.get("source", source)),
        meta=meta,
    )


@lru_cache(maxsize=16)
def _load_bundled(name: str) -> tuple[QATask, ...]:
    return tuple(_to_task(r, name, i) for i, r in enumerate(_read_records(data_file(SEARCH_DATASETS[name]))))


def load_qa(
    source: str = "nq", split: str | None = None, limit: int | None = None, *, evidence_only: bool = False
) -> list[QATask]:
    """Load QA tasks from a bundled name, a local file or a ``datasets`` hub id (``name[:config]``).

    ``split`` is the hub split (default ``test``); the bundled sets are single evaluation samples,
    so for them only ``None``/``test``/``dev`` is accepted. ``evidence_only`` keeps the tasks whose
    supporting passages are known to be in the bundled corpus (``meta.evidence_in_corpus is True``).
    ``limit`` truncates after filtering, keeping file order.
    """
    if source in SEARCH_DATASETS:
        if split not in (None, "test", "dev"):
            raise ValueError(f"bundled {source!r} is one evaluation sample; split={split!r} does not exist")
        tasks = list(_load_bundled(source))
    elif Path(source).expanduser().is_file():
        path = Path(source).expanduser()
        tasks = [_to_task(r, path.name.split(".")[0], i) for i, r in enumerate(read_records(str(path)))]
    else:
        tasks = _load_hub(source, split or "test")
    if evidence_only:
        tasks = [t for t in tasks if t.meta.get("evidence_in_corpus") is True]
    if not tasks:
        raise ValueError(
            f"QA dataset {source!r} is empty" + (" after evidence_only" if evidence_only else "")
        )
    return tasks[:limit] if limit is not None else tasks


def _load_hub(dataset_id: str, split: str) -> list[QATask]:
    """A ``datasets`` hub id (``name`` or ``name:config``); needs network, so it is the last resort."""
    if "/" not in dataset_id:
        known = ", ".join(sorted(SEARCH_DATASETS))
        raise ValueError(
            f"unknown QA dataset {dataset_id!r}: not bundled ({known}), not a local file, "
            "and not a hub id of the form owner/name"
        )

    return [_to_task(r, dataset_id, i) for i, r in enumerate(read_records(dataset_id, split))]


def bundled_corpus_sha256() -> str:
    """sha256 over the bundled corpus parts' bytes, in order (the combined file's cache key)."""
    h = hashlib.sha256()
    for name in CORPUS_FILES:
        h.update(name.encode())
        h.update(sha256_file(data_file(name)).encode())
    return h.hexdigest()


def bundled_corpus_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of the combined bundled corpus JSONL (``{"id", "title", "text"}`` per line).

    Decompressed once into ``<cache>/corpus/`` (written atomically, named by the parts' sha256)
    and reused afterwards, so servers and indexers can read it as one plain file.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = root / "corpus" / f"search-corpus-{bundled_corpus_sha256()[:16]}.jsonl"
    if path.is_file():
        return path
    parts = []
    for name in CORPUS_FILES:
        data = gzip.decompress(data_file(name).read_bytes())
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    return atomic_write_bytes(path, b"".join(parts))
