"""``--model`` for ``srpo train`` and the bench commands: a local directory or a Hugging Face hub id.

It lives in :mod:`agents` (not :mod:`benchmarks`) so the learner can use it too: dependencies point
``agents <- learners <- benchmarks``.

A hub id is looked up in the local Hugging Face cache first (no network); only when it is not
there is it downloaded, which needs network. Offline (``HF_HUB_OFFLINE=1``, or no connection) a
missing model is one clear error that names the cache and the command that fetches it, rather than
"is not a directory".
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ModelNotAvailable", "resolve_model"]


class ModelNotAvailable(ValueError):
    """The model is neither a local directory nor obtainable from the hub (offline or unknown)."""


def _hub_cache() -> str:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        return str(HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - transformers always brings huggingface_hub
        return "~/.cache/huggingface/hub"


def resolve_model(model: str | os.PathLike[str], *, revision: str | None = None) -> Path:
    """The local directory holding ``model``'s files (downloading a hub id when allowed).

    Raises:
        ModelNotAvailable: a path that does not exist and is not a hub id, or a hub id that is not
            cached and cannot be downloaded.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelNotAvailable(f"--model {text}: is a file; pass the model directory (config.json + weights)")
    parts = text.split("/")
    if len(parts) != 2 or not all(parts) or text.startswith((".", "/", "~")):
        raise ModelNotAvailable(
            f"--model {text}: no such directory, and not a hub id of the form owner/name"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(text, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hint = (
        f"model {text!r} is not in the local Hugging Face cache ({_hub_cache()}). Fetch it once on a machine "
        f"with network access: `hf download {text}` (or `huggingface-cli download {text}`), then rerun; "
        "or pass --model as a local directory."
    )
    if offline:
        raise ModelNotAvailable(hint + " (HF_HUB_OFFLINE is set, so nothing is downloaded.)")
    try:
        return Path(snapshot_download(text, revision=revision))
    except Exception as exc:  # connection errors, unknown repos, gated repos: all end the command
        raise ModelNotAvailable(f"{hint} Download failed: {type(exc).__name__}: {exc}") from exc
