"""What a Ctrl-C should tell the user: where the work that survives it is, and how to go on.

A long command (``srpo train``, ``srpo bench compare``) registers, as it goes, the place its last durable
state was written and the way to continue from it (:func:`set_resume_point`); the ``srpo`` error
boundary prints :func:`interrupted_line` when the command is interrupted. It lives here, at the bottom of
the dependency order, so the trainer and the CLI share it without importing each other.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_resume: str | None = None


def set_resume_point(text: str | None) -> None:
    """Say where the last durable state is and how to continue (None: forget it), e.g.
    ``"last checkpoint runs/train/checkpoint (iteration 4); rerun the command with --resume to continue"``."""
    global _resume
    with _lock:
        _resume = text


def interrupted_line() -> str:
    """The one line for an interrupted command: ``interrupted`` and, when known, the resume point."""
    with _lock:
        return f"interrupted: {_resume}" if _resume else "interrupted"


__all__ = ["interrupted_line", "set_resume_point"]
