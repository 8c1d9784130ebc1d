"""Math tasks: the bundled benchmark sets, user files, hub datasets and the procedural family.

``load_math(source)`` resolves, in order: a bundled name (``math500``, ``aime24``...), ``procedural``
(optionally ``procedural:<difficulty>``), a local ``.jsonl``/``.jsonl.gz``/``.parquet``/``.json`` file,
and finally a Hugging Face ``datasets`` id (needs network; imported lazily so offline use never
touches the hub).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

#: Bundled name -> file in ``srpo_envs/data/math`` (see ATTRIBUTION.md there for provenance).
MATH_DATASETS: dict[str, str] = {
    "math500": "math500.jsonl.gz",
    "aime24": "aime24.jsonl.gz",
    "aime25": "aime25.jsonl.gz",
    "amc23": "amc23.jsonl.gz",
    "minerva": "minerva_math.jsonl.gz",
    "olympiadbench": "olympiadbench.jsonl.gz",
    "gsm8k_test": "gsm8k_test.jsonl.gz",
    "gsm8k_train": "gsm8k_train.jsonl.gz",
    "math_train": "math_train.jsonl.gz",
}


@dataclass(frozen=True)
class MathTask:
    """One problem with its reference answer (a string, LaTeX allowed)."""

    id: str
    problem: str
    answer: str
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _data_file(name: str) -> Path:
    return Path(str(resources.files("srpo_envs") / "data" / "math" / name))


def dataset_sha256(source: str) -> str:
    """sha256 of the bytes a bundled or local dataset is read from (for result provenance)."""
    if source in MATH_DATASETS:
        path = _data_file(MATH_DATASETS[source])
    elif Path(source).is_file():
        path = Path(source)
    else:
        return hashlib.sha256(source.encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_records(path: Path) -> list[dict[str, Any]]:
    suffixes = "".join(path.suffixes[-2:])
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    opener = gzip.open if suffixes.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        if path.suffix == ".json":
            data = json.load(fh)
            return data if isinstance(data, list) else data.get("data", [])
        return [json.loads(line) for line in fh if line.strip()]


def _to_task(rec: dict[str, Any], source: str, index: int) -> MathTask:
    problem = rec.get("problem", rec.get("question"))
    answer = rec.get("answer", rec.get("final_answer", rec.get("solution")))
    if problem is None or answer is None:
        raise ValueError(f"{source} record {index} has no problem/question or answer field: {sorted(rec)}")
    if isinstance(answer, list):
        answer = ", ".join(map(str, answer))
    meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
    return MathTask(
        id=str(rec.get("id", rec.get("unique_id", f"{source}-{index}"))),
        problem=str(problem),
        answer=str(answer),
        source=str(rec.get("source", source)),
        meta=meta,
    )


@lru_cache(maxsize=32)
def _load_bundled(name: str) -> tuple[MathTask, ...]:
    return tuple(_to_task(r, name, i) for i, r in enumerate(_read_records(_data_file(MATH_DATASETS[name]))))


#: ``procedural``: nested multi-step arithmetic; ``procedural-columns``: column addition (see
#: :mod:`srpo_envs.tasks.procedural`). ``:<difficulty>`` may follow either name.
PROCEDURAL_FAMILIES = ("procedural", "procedural-columns")


def load_math(
    source: str = "math500", *, split: str | None = None, limit: int | None = None, **procedural_kwargs: Any
) -> list[MathTask]:
    """Load math tasks from a bundled name, ``procedural[-columns][:difficulty]``, a local file or a hub id.

    ``split`` picks the procedural split (``train``/``test``) or a hub split (default ``test``).
    """
    if source in MATH_DATASETS:
        tasks = list(_load_bundled(source))
    elif source.startswith("procedural"):
        from srpo_envs.tasks.procedural import make_arithmetic_tasks, make_column_addition_tasks

        family, _, diff = source.partition(":")
        if family not in PROCEDURAL_FAMILIES:
            raise ValueError(f"unknown procedural family {family!r}; use one of {PROCEDURAL_FAMILIES}")
        if diff:
            procedural_kwargs.setdefault("difficulty", int(diff))
        procedural_kwargs.setdefault("n", limit or 512)
        procedural_kwargs.setdefault("strict", False)  # like any dataset, ``limit`` is an upper bound
        if family == "procedural-columns":
            procedural_kwargs.pop("max_operand", None)  # operands have ``difficulty`` digits
            tasks = make_column_addition_tasks(split=split or "train", **procedural_kwargs)
        else:
            tasks = make_arithmetic_tasks(split=split or "train", **procedural_kwargs)
    elif Path(source).expanduser().is_file():
        path = Path(source).expanduser()
        tasks = [_to_task(r, path.stem, i) for i, r in enumerate(_read_records(path))]
    else:
        tasks = _load_hub(source, split or "test")
    if not tasks:
        raise ValueError(f"math dataset {source!r} is empty")
    return tasks[:limit] if limit is not None else tasks


def _load_hub(dataset_id: str, split: str) -> list[MathTask]:
    """A ``datasets`` hub id (``name`` or ``name:config``); needs network, so it is the last resort."""
    if "/" not in dataset_id:
        known = ", ".join(sorted(MATH_DATASETS))
        raise ValueError(
            f"unknown math dataset {dataset_id!r}: not bundled ({known}, procedural[:d]), "
            "not a local file, and not a hub id of the form owner/name"
        )
    import datasets

    name, _, config = dataset_id.partition(":")
    ds = datasets.load_dataset(name, config or None, split=split)
    return [_to_task(dict(r), dataset_id, i) for i, r in enumerate(ds)]
