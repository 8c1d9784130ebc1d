"""Shared utilities every srpo package may import: hashing, canonical JSON, atomic writes, KEY=VALUE.

This package sits outside the layer order (``srpo_envs`` <- ``agents`` <- ``learners`` <- ``benchmarks``
<- ``srpo_cli``; ``leaderboards`` apart) and imports none of those packages, so anything that needs a
hash or a crash-safe write gets the one implementation here instead of growing its own.
"""

from srpo_common.hashing import (
    WEIGHT_PATTERNS,
    canonical_json,
    sha256_bytes,
    sha256_file,
    sha256_json,
    weights_sha256,
)
from srpo_common.io import append_jsonl, atomic_write_bytes, atomic_write_json, atomic_write_text
from srpo_common.kv import parse_kv

__all__ = [
    "WEIGHT_PATTERNS",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "canonical_json",
    "parse_kv",
    "sha256_bytes",
    "sha256_file",
    "sha256_json",
    "weights_sha256",
]
