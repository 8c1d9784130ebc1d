"""One reader for user data: local JSON/JSONL(.gz)/parquet/CSV files and hub ids, via ``datasets``.

Both task loaders (:mod:`srpo_envs.tasks.math_data`, :mod:`srpo_envs.tasks.search_data`) read
anything that is not bundled through :func:`read_records`, so a local file and a hub dataset take
the same path (``datasets.load_dataset`` with the ``json``/``parquet``/``csv`` builder, or the hub
id), get the same record dicts and the same errors.

Two details of ``datasets`` are smoothed over here:

* a column missing from some records comes back as ``None`` in those records; it is dropped, so a
  loader's ``rec.get(key, default)`` sees "absent", as it would in the file;
* Arrow needs one type per column, and hand-written QA files often mix shapes (an answer that is a
  string in one line and a list or a number in the next). When ``datasets`` cannot build one schema
  for a local JSON file, the lines are read as plain JSON instead (logged), since every loader
  accepts those shapes anyway.

Hub ids need network or a populated Hugging Face cache; offline, the error says so and how to fetch.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: File suffix -> ``datasets`` builder.
BUILDERS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _suffix(path: Path) -> str:
    """The data suffix, ignoring a trailing ``.gz`` (``x.jsonl.gz`` -> ``.jsonl``)."""
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


def is_local_data_file(source: str) -> bool:
    return Path(source).expanduser().is_file()


def _plain(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if v is not None}


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        if _suffix(path) == ".json":
            data = json.load(fh)
            rows = data if isinstance(data, list) else data.get("data", [])
        else:
            rows = [json.loads(line) for line in fh if line.strip()]
    return [r for r in rows if isinstance(r, dict)]


def _starts_with_object(path: Path) -> bool:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    return head.startswith("{")


def read_records(source: str, split: str | None = None) -> list[dict[str, Any]]:
    """Records of a local data file or a hub dataset (``owner/name`` or ``owner/name:config``).

    ``split`` applies to hub ids (default ``test``); a local file is one split.
    """
    import datasets

    path = Path(source).expanduser()
    if path.is_file():
        builder = BUILDERS.get(_suffix(path))
        if builder is None:
            raise ValueError(f"{path}: unsupported file type; use one of {sorted(BUILDERS)} (optionally .gz)")
        kwargs: dict[str, Any] = {}
        if _suffix(path) == ".json" and _starts_with_object(path):
            kwargs["field"] = "data"  # a top-level {"data": [...]} object (SQuAD-style files)
        try:
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
        except Exception as exc:  # datasets wraps Arrow's schema errors in several exception types
            if builder != "json":
                raise ValueError(f"{path}: cannot read as {builder}: {exc}") from exc
            log.info("%s: no single Arrow schema (%s); reading the JSON directly", path, exc)
            return _read_json_lines(path)
        return [_plain(dict(r)) for r in ds]
    if "/" not in source:
        raise FileNotFoundError(source)
    name, _, config = source.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "test")
    except (ConnectionError, OSError) as exc:
        raise ValueError(
            f"hub dataset {name!r} is not cached and cannot be downloaded ({type(exc).__name__}: {exc}); "
            f"fetch it once with network access (`hf download --repo-type dataset {name}`) or pass a local file"
        ) from exc
    return [_plain(dict(r)) for r in ds]
