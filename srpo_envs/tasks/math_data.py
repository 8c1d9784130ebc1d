"""Math tasks: the bundled benchmark sets, user files, hub datasets and the procedural family.

``load_math(source)`` resolves, in order: a bundled name (``math500``, ``aime24``...), ``procedural``
(optionally ``procedural:<difficulty>``), a local ``.jsonl``/``.jsonl.gz``/``.parquet``/``.json`` file,
and finally a Hugging Face ``datasets`` id (needs network or the HF cache). Local files and hub ids
are read by the same ``datasets`` path (:func:`srpo_envs.tasks.records.read_records`).

Training sets (:data:`TRAINING_SETS`: ``math_train``, ``gsm8k_train``) have a held-out split: problems
whose normalised text hashes into the first :data:`HELDOUT_PERCENT` of 100 buckets. Splitting by
text (not by id or position) keeps the two sides disjoint even where a problem occurs twice, and
keeps a problem on its side whatever the file order. ``split="train"`` (the default for a training
set, so nothing trains on held-out problems by accident) and ``split="test"`` (or ``"heldout"``)
pick a side; ``split="all"`` is the whole file. The bundled evaluation sets are one split.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from srpo_envs.tasks import reasoning_gym_data
from srpo_envs.tasks.procedural import make_arithmetic_tasks, make_column_addition_tasks
from srpo_envs.tasks.records import read_records
from srpo_envs.tasks.task import MathTask

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
#: Bundled training sets; each has a held-out split disjoint from its training split.
TRAINING_SETS: frozenset[str] = frozenset({"gsm8k_train", "math_train"})
#: Share (in percent) of a training set that is held out.
HELDOUT_PERCENT = 5
_HELDOUT_SPLITS = ("test", "heldout", "validation", "dev")
_WS = re.compile(r"\s+")


def normalize_problem(text: str) -> str:
    """Problem text for identity checks: case-folded, whitespace collapsed."""
    return _WS.sub(" ", text).strip().casefold()


def is_heldout(problem: str, percent: int = HELDOUT_PERCENT) -> bool:
    """Whether a training-set problem belongs to the held-out split (a hash of its normalised text)."""
    digest = hashlib.sha256(normalize_problem(problem).encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % 100 < percent


def split_training_set(tasks: list[MathTask], split: str | None) -> list[MathTask]:
    """The ``train`` (default), ``test``/``heldout`` or ``all`` part of a training set."""
    if split in (None, "train"):
        return [t for t in tasks if not is_heldout(t.problem)]
    if split in _HELDOUT_SPLITS:
        return [t for t in tasks if is_heldout(t.problem)]
    if split == "all":
        return list(tasks)
    raise ValueError(f"split must be train, test (heldout) or all, got {split!r}")


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


def _read_bundled(path: Path) -> list[dict[str, Any]]:
    """A bundled ``.jsonl.gz`` (read directly: fast, and its bytes are what ``dataset_sha256`` hashes)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
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
    return tuple(_to_task(r, name, i) for i, r in enumerate(_read_bundled(_data_file(MATH_DATASETS[name]))))


#: ``procedural``: nested multi-step arithmetic; ``procedural-columns``: column addition (see
#: :mod:`srpo_envs.tasks.procedural`). ``:<difficulty>`` may follow either name.
PROCEDURAL_FAMILIES = ("procedural", "procedural-columns")


def load_math(
    source: str = "math500",
    *,
    split: str | None = None,
    limit: int | None = None,
    dataset_config: dict[str, Any] | None = None,
    **procedural_kwargs: Any,
) -> list[MathTask]:
    """Load math tasks from a bundled name, ``procedural[-columns][:difficulty]``, ``reasoning-gym:<family>``
    (:mod:`srpo_envs.tasks.reasoning_gym_data`), a local file or a hub id.

    ``split`` picks the procedural split (``train``/``test``), a training set's split (see the module
    docstring; default ``train``) or a hub split (default ``test``). A bundled evaluation set is one
    split: ``None``/``test``/``all`` load it, anything else is an error. ``dataset_config`` sets a
    reasoning-gym family's generator (chain_sum's ``max_terms``...).
    """
    if dataset_config and not source.startswith(reasoning_gym_data.PREFIX):
        raise ValueError(f"dataset_config sets a reasoning-gym family's generator; {source!r} is not one")
    if source in MATH_DATASETS:
        tasks = list(_load_bundled(source))
        if source in TRAINING_SETS:
            tasks = split_training_set(tasks, split)
        elif split not in (None, "test", "all"):
            raise ValueError(f"bundled {source!r} is an evaluation set; split={split!r} does not exist")
    elif source.startswith("procedural"):
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
    elif source.startswith(reasoning_gym_data.PREFIX):
        tasks = reasoning_gym_data.load_reasoning_gym(source, split, limit, dataset_config)
    elif Path(source).expanduser().is_file():
        path = Path(source).expanduser()
        tasks = [_to_task(r, path.name.split(".")[0], i) for i, r in enumerate(read_records(str(path)))]
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

    return [_to_task(r, dataset_id, i) for i, r in enumerate(read_records(dataset_id, split))]
