"""Gymnasium-style registry: ``register(id, entry_point, **kwargs)`` and ``make(id, **overrides)``.

Every registered id must construct with no arguments from embedded data, so ``make(id)`` works
offline on a fresh install; the test suite checks that for all ids.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EnvSpec:
    """How to build one env id: an entry point (``"module:Class"`` or a callable) and default kwargs."""

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Callable[..., Any]:
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), attr)

    def make(self, **overrides: Any) -> Any:
        return self.load()(**{**self.kwargs, **overrides})


registry: dict[str, EnvSpec] = {}


def register(
    id: str, entry_point: str | Callable[..., Any], *, description: str = "", **kwargs: Any
) -> EnvSpec:
    """Register an env id; re-registering an id is an error (ids are versioned instead)."""
    if id in registry:
        raise ValueError(f"env id {id!r} is already registered")
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs), description=description)
    registry[id] = spec
    return spec


def make(env_id: str, **kwargs: Any) -> Any:
    """Build a registered env; ``kwargs`` override the registered defaults."""
    try:
        spec = registry[env_id]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown env id {env_id!r}; registered ids: {known}") from None
    return spec.make(**kwargs)
