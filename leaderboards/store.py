"""A leaderboard store: a flat directory of JSON record files, meant to live in git.

Files are written with sorted keys, indent 2 and a trailing newline so diffs are line-based and
stable, and named ``<slug>-<first 12 hex of record_hash>.json`` so the name is deterministic, unique
per content and safe on every filesystem. Names given by a user (``load("...")``) are checked
against a strict pattern *and* resolved against the store root, so ``../x``, absolute paths, odd
characters and symlinks leading out of the store are all rejected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srpo_common import atomic_write_bytes, atomic_write_text

from .evidence import check_evidence, load_samples, samples_path
from .schema import (
    MAX_RECORD_BYTES,
    LeaderboardRecord,
    RecordValidationError,
    dump_record_json,
    parse_record_json,
    validate_record,
)

__all__ = [
    "LeaderboardStore",
    "StoreError",
    "check_record_name",
    "load_all",
    "record_filename",
    "slugify",
    "submit",
    "validate_all",
]

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,150}\.json")
_SLUG_MAX = 80


class StoreError(ValueError):
    """A store operation failed (unsafe name, invalid records, conflicting file)."""


def slugify(text: str, max_len: int = _SLUG_MAX) -> str:
    """Lowercase ASCII slug: runs of anything outside ``[a-z0-9]`` become one ``-``."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:max_len].strip("-")
    return slug or "record"


def record_filename(record: LeaderboardRecord) -> str:
    """``<slug(suite-name)>-<short hash>.json`` -- deterministic, so resubmitting is idempotent."""
    return f"{slugify(f'{record.suite}-{record.name}')}-{record.short_hash}.json"


def check_record_name(name: str) -> str:
    """Return ``name`` (``.json`` appended if missing) if it is a safe flat file name, else raise."""
    if not isinstance(name, str) or not name:
        raise StoreError("record name must be a non-empty string")
    if "\x00" in name:
        raise StoreError("unsafe record name: contains a NUL byte")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise StoreError(f"unsafe record name {name!r}: absolute paths are not allowed")
    if "/" in name or "\\" in name or ".." in name:
        raise StoreError(f"unsafe record name {name!r}: path separators and '..' are not allowed")
    if not name.endswith(".json"):
        name += ".json"
    if not _NAME_RE.fullmatch(name):
        raise StoreError(
            f"unsafe record name {name!r}: use lowercase letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit)"
        )
    return name


class LeaderboardStore:
    """A directory of record files. Created on first :meth:`submit` if missing."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LeaderboardStore({str(self.root)!r})"

    def path_for(self, name: str) -> Path:
        """Safe path of the record file ``name`` inside the store (see :func:`check_record_name`)."""
        name = check_record_name(name)
        root = self.root.resolve()
        path = root / name
        # resolve() follows symlinks: a link inside the store pointing elsewhere is rejected too.
        if path.resolve().parent != root:
            raise StoreError(f"unsafe record name {name!r}: resolves outside the store")
        return path

    def submit(
        self,
        record: LeaderboardRecord | Mapping[str, Any],
        samples_file: str | os.PathLike[str] | None = None,
    ) -> Path:
        """Validate and write a record; returns its path. Resubmitting the same record is a no-op.

        A record with evidence needs its sample file (``samples_file``): it is checked against the
        record's sha256 and size and copied to ``samples/<sha256>.jsonl`` in the store.
        """
        record = validate_record(record)
        if record.evidence is not None:
            if samples_file is None:
                raise StoreError("the record points to per-sample evidence: give its sample file too")
            sample_set = load_samples(samples_file, record.evidence)
            errors = check_evidence(record, sample_set)
            if errors:
                raise StoreError("evidence does not support the record:\n  - " + "\n  - ".join(errors))
            target = samples_path(self.root, record.evidence.samples_sha256)
            if not target.is_file():
                atomic_write_bytes(target, Path(samples_file).read_bytes())
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(record_filename(record))
        text = dump_record_json(record)
        if path.exists():
            existing = path.read_text(encoding="utf-8")
            if existing == text:
                return path
            raise StoreError(f"{path.name} already exists with different content (hash prefix collision?)")
        atomic_write_text(path, text)
        return path

    def names(self) -> list[str]:
        """Record file names in the store, sorted (hidden files, temp files and non-JSON ignored)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.suffix == ".json" and not p.name.startswith(".")
        )

    def load(self, name: str) -> LeaderboardRecord:
        """Load and validate one record by file name."""
        path = self.path_for(name)
        try:
            size = path.stat().st_size
            if size > MAX_RECORD_BYTES:  # refused before reading: a huge file must not cost its size in RAM
                raise RecordValidationError(
                    [f"record is {size} bytes; at most {MAX_RECORD_BYTES} are accepted"], path.name
                )
            raw = path.read_bytes()
        except OSError as exc:
            raise StoreError(f"cannot read record {path.name!r}: {exc.strerror or exc}") from None
        return parse_record_json(raw, path.name)

    def _scan(self) -> dict[str, tuple[LeaderboardRecord | None, list[str]]]:
        """Load every file once: ``{name: (record or None, errors)}``."""
        results: dict[str, tuple[LeaderboardRecord | None, list[str]]] = {}
        seen: dict[str, str] = {}
        for name in self.names():
            errors: list[str] = []
            record: LeaderboardRecord | None = None
            try:
                record = self.load(name)
            except StoreError as exc:
                errors.append(str(exc))
            except RecordValidationError as exc:
                errors.extend(exc.errors)
            else:
                expected = record_filename(record)
                if expected != name:
                    errors.append(f"file name should be {expected!r} for this record")
                if record.record_hash in seen:
                    errors.append(f"duplicate of {seen[record.record_hash]!r}")
                else:
                    seen[record.record_hash] = name
            results[name] = (record, errors)
        return results

    def validate_all(self) -> dict[str, list[str]]:
        """Validate every record file: ``{file name: [error, ...]}`` with an empty list for valid files.

        Beyond schema validation, a file must carry its canonical name (so a hand-edited or renamed
        file is noticed) and no two files may hold the same record.
        """
        return {name: errors for name, (_, errors) in self._scan().items()}

    def load_all(self, *, strict: bool = True) -> list[LeaderboardRecord]:
        """All valid records, in file-name order.

        With ``strict`` (the default) any invalid file raises :class:`StoreError` listing every
        problem -- a leaderboard silently missing a row is worse than one that refuses to render.
        """
        scan = self._scan()
        bad = [f"{name}: {err}" for name, (_, errs) in scan.items() for err in errs]
        if bad and strict:
            raise StoreError("invalid records in store:\n  - " + "\n  - ".join(bad))
        return [rec for rec, errs in scan.values() if rec is not None and not errs]


def submit(
    record: LeaderboardRecord | Mapping[str, Any],
    store: str | os.PathLike[str],
    samples_file: str | os.PathLike[str] | None = None,
) -> Path:
    """Functional form of :meth:`LeaderboardStore.submit`."""
    return LeaderboardStore(store).submit(record, samples_file)


def load_all(store: str | os.PathLike[str], *, strict: bool = True) -> list[LeaderboardRecord]:
    """Functional form of :meth:`LeaderboardStore.load_all`."""
    return LeaderboardStore(store).load_all(strict=strict)


def validate_all(store: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Functional form of :meth:`LeaderboardStore.validate_all`."""
    return LeaderboardStore(store).validate_all()
