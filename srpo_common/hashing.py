"""One canonical JSON encoding and one sha256 helper of each kind.

Hashes are how records, caches and checkpoints detect corruption and tell identical inputs apart, so
every package must compute them the same way: two implementations that disagree (say, one that hashes
only ``model.safetensors`` and one that also hashes shards) make the same model look like two.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: Files that hold a model's weights (single file or shards) in a ``save_pretrained`` directory.
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, os.PathLike):
        return Path(obj).as_posix()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, _dt.datetime | _dt.date):
        return obj.isoformat()
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays
        return obj.tolist()
    raise TypeError(f"cannot encode object of type {type(obj).__name__} as canonical JSON")


def canonical_json(obj: Any, *, ascii_only: bool = False) -> str:
    """Deterministic JSON (sorted keys, no whitespace, NaN forbidden): the input of every hash.

    ``ascii_only`` escapes non-ASCII characters (``\\uXXXX``); ids that were always hashed that way
    (event state ids) keep it so the same history keeps the same id.
    """
    return json.dumps(
        obj,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=ascii_only,
        allow_nan=False,
        default=_json_default,
    )


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any, *, ascii_only: bool = False, length: int | None = None) -> str:
    """sha256 of :func:`canonical_json`; ``length`` truncates the hex digest (short ids)."""
    digest = sha256_bytes(canonical_json(obj, ascii_only=ascii_only).encode("utf-8"))
    return digest[:length] if length else digest


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """sha256 of a file's bytes, streamed so multi-GB weight files need no extra memory."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def weights_sha256(model_dir: str | os.PathLike[str]) -> str | None:
    """sha256 of a model directory's weights.

    One weight file: the sha256 of that file. Shards: the sha256 of the sorted ``name:sha256`` lines
    of every weight file. ``None`` when the path is not a directory or holds no weight files (a hub id).
    """
    root = Path(model_dir)
    if not root.is_dir():
        return None
    files = sorted({p for pat in WEIGHT_PATTERNS for p in root.glob(pat) if p.is_file()})
    if not files:
        return None
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{p.name}:{sha256_file(p)}\n" for p in files)
    return sha256_bytes(lines.encode())
