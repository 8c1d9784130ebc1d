"""The one ``KEY=VALUE`` parser behind every ``--env-kwarg``-style option."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def parse_kv(items: Iterable[str] | None, option: str = "--env-kwarg") -> dict[str, Any]:
    """``KEY=VALUE`` pairs to a dict; VALUE is parsed as JSON when it can be (numbers, booleans,
    lists), else kept as a string. A malformed item raises ``ValueError`` naming ``option``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} must be KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out
