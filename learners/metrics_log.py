"""A run's ``metrics.jsonl``: one JSON row per iteration, appended and fsynced as the run goes.

The file lives beside the checkpoint (:mod:`learners.checkpoint`): :func:`trim_metrics` cuts it back to
the checkpoint's iteration on resume, and :func:`reset_metrics` clears it for a fresh start, so an
iteration is never logged twice. A row torn by a kill mid-append is skipped on read. Under
torch.distributed only rank 0 touches the file: :func:`append_metrics` is a no-op elsewhere, and
:func:`trim_metrics` and :func:`reset_metrics` are collective (rank 0 acts, then a barrier), so every
rank must call them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from learners.distributed import group_barrier, group_rank
from srpo_common import append_jsonl, atomic_write_text


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``; a torn last line (killed mid-append) is skipped, others are errors."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no trailing newline: the append never finished
                break
            raise ValueError(f"{path}:{i + 1} is not valid JSON") from None
    return rows


def append_metrics(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one row (non-finite floats become ``null``, which strict JSON readers accept), fsynced.

    Only rank 0 of a torch.distributed run writes (every rank logs the same all-reduced numbers).
    """
    if group_rank() != 0:
        return
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    append_jsonl(path, [clean])


def trim_metrics(path: str | os.PathLike[str], iteration: int) -> list[dict[str, Any]]:
    """Keep only rows up to ``iteration`` (a killed run logged rows its checkpoint does not cover).

    The file is rewritten atomically (also dropping a torn last line) and the kept rows returned.
    Collective under torch.distributed: every rank gets the rows, rank 0 rewrites, all meet at a barrier.
    """
    path = Path(path)
    kept = [m for m in read_metrics(path) if int(m.get("iteration", 0)) <= iteration]
    if group_rank() == 0 and path.exists():
        atomic_write_text(path, "".join(json.dumps(m) + "\n" for m in kept))
    group_barrier()
    return kept


def reset_metrics(path: str | os.PathLike[str]) -> int:
    """Delete a stale ``metrics.jsonl`` before a fresh start; returns how many rows it held.

    Collective under torch.distributed (rank 0 deletes, then a barrier; other ranks return 0).
    """
    path = Path(path)
    n = 0
    if group_rank() == 0 and path.exists():
        text = path.read_text(encoding="utf-8", errors="replace")
        path.unlink()
        n = sum(1 for line in text.splitlines() if line.strip())
    group_barrier()
    return n
