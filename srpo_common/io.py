"""Crash-safe file writes: a reader sees the old file or the new one, never half of either.

Every write goes to a temp file in the target's directory, is fsynced, gets mode 0644 (``mkstemp``
makes 0600, which hides results from other users of a shared machine) and is published with one
``os.replace``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes` (``\\n`` line endings on every OS)."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, mode: int = 0o644) -> Path:
    """Pretty, key-sorted JSON (NaN forbidden) written atomically, with a trailing newline."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    return atomic_write_text(path, text, mode=mode)


def append_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Append one JSON line per record and fsync, so a killed process loses at most its last line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
