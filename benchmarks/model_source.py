"""Moved to :mod:`agents.model_source` (the learner resolves ``--model`` the same way); re-exported."""

from __future__ import annotations

from agents.model_source import ModelNotAvailable, resolve_model

__all__ = ["ModelNotAvailable", "resolve_model"]
