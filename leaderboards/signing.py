"""Optional ed25519 signatures of leaderboard records (the ``cryptography`` package).

``record_hash`` is only an integrity check: anyone can edit a record and recompute it. A signature
says *who* vouches for a record: the submitter signs ``record_hash`` (which covers the evidence
file's sha256, so one signature covers the record and its samples) with a private key, and the
leaderboard checks it against a keys file of known submitters::

    {"alice": "<64 hex digits: the raw ed25519 public key>", ...}

The signature is stored in the record (``signature``, outside the hashed content). A page shows a
row as *verified* when the signature checks out with the named known key, *unverified* otherwise.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from srpo_common import atomic_write_bytes

from .schema import LeaderboardRecord, validate_record

__all__ = ["SigningError", "generate_key", "load_keys", "sign_record", "verify_signature"]

_KEY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_PUBLIC_RE = re.compile(r"[0-9a-f]{64}")
_MAX_KEYS_BYTES = 1 << 20


class SigningError(ValueError):
    """A key or keys file is unusable (bad format, wrong type of key)."""


def _message(record: LeaderboardRecord) -> bytes:
    return f"srpo-leaderboard-record:{record.record_hash}".encode()


def generate_key(path: str | os.PathLike[str]) -> str:
    """Write a new private key (PEM, mode 0600: it is a secret) to ``path``; return the public key hex."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    atomic_write_bytes(path, pem, mode=0o600)
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningError(f"cannot load private key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path} is not an ed25519 private key")
    return key


def sign_record(
    record: LeaderboardRecord, key_path: str | os.PathLike[str], key_id: str
) -> LeaderboardRecord:
    """The record with a signature of its hash by the key at ``key_path``, filed under ``key_id``."""
    if not _KEY_ID_RE.fullmatch(key_id):
        raise SigningError(f"invalid key id {key_id!r} (allowed: {_KEY_ID_RE.pattern})")
    signature = _private_key(key_path).sign(_message(record)).hex()
    data = record.model_dump(mode="json")
    data["signature"] = {"key_id": key_id, "signature": signature}
    return validate_record(data)


def load_keys(path: str | os.PathLike[str]) -> dict[str, Ed25519PublicKey]:
    """Known submitters: a JSON object ``{key_id: public key hex}``."""
    path = Path(path)
    try:
        if path.stat().st_size > _MAX_KEYS_BYTES:
            raise SigningError(f"keys file {path} is larger than {_MAX_KEYS_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SigningError(f"cannot read keys file {path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise SigningError(f"keys file {path} must hold a JSON object {{key_id: public key hex}}")
    keys = {}
    for key_id, hexkey in data.items():
        if (
            not _KEY_ID_RE.fullmatch(str(key_id))
            or not isinstance(hexkey, str)
            or not _PUBLIC_RE.fullmatch(hexkey)
        ):
            raise SigningError(f"keys file {path}: entry {str(key_id)[:40]!r} is not key_id -> 64 hex digits")
        keys[str(key_id)] = Ed25519PublicKey.from_public_bytes(bytes.fromhex(hexkey))
    return keys


def verify_signature(record: LeaderboardRecord, keys: Mapping[str, Ed25519PublicKey]) -> bool:
    """True when the record is signed by a known key and the signature is valid for its hash."""
    sig = record.signature
    if sig is None or sig.key_id not in keys:
        return False
    try:
        keys[sig.key_id].verify(bytes.fromhex(sig.signature), _message(record))
    except InvalidSignature:
        return False
    return True
