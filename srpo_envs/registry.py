"""Gymnasium-style registry: ``register(id, entry_point, **kwargs)`` and ``make(id, **overrides)``.

Every registered id must construct with no arguments from embedded data, so ``make(id)`` works
offline on a fresh install; the test suite checks that for all ids whose optional packages
(``EnvSpec.requires``) are installed (``Verifiers-v0`` needs verifiers, which has a venv of its own).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from srpo_common import plugins


@dataclass(frozen=True)
class EnvSpec:
    """How to build one env id: an entry point (``"module:Class"`` or a callable) and default kwargs."""

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    requires: tuple[str, ...] = ()
    """Optional packages the env needs (``("verifiers",)``): without them it is listed but not built."""

    def available(self) -> bool:
        """Whether every package in :attr:`requires` can be imported here."""
        return all(importlib.util.find_spec(name) is not None for name in self.requires)

    def load(self) -> Callable[..., Any]:
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), attr)

    def accepted_kwargs(self) -> list[str] | None:
        """The keyword arguments the entry point takes (None: any, it has ``**kwargs`` or no signature)."""
        try:
            params = inspect.signature(self.load()).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            return None
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return [p.name for p in params if p.kind in kinds]

    def check_kwargs(self, kwargs: Mapping[str, Any]) -> None:
        """``EnvKwargsError`` naming the keys the env does not take, and the ones it does, before it is built
        (a ``TypeError`` from deep in ``__init__`` otherwise)."""
        accepted = self.accepted_kwargs()
        if accepted is None:
            return
        unknown = [k for k in kwargs if k not in accepted]
        if unknown:
            raise EnvKwargsError(
                f"{self.id} takes no env kwarg {', '.join(map(repr, unknown))}; it accepts: {', '.join(accepted)}"
            )

    def make(self, **overrides: Any) -> Any:
        self.check_kwargs(overrides)
        return self.load()(**{**self.kwargs, **overrides})


class EnvKwargsError(ValueError):
    """An env was given a keyword argument its constructor does not take."""


registry: dict[str, EnvSpec] = {}
plugins.watch("env", registry)  # type: ignore[arg-type]  # a plugin may add, not replace


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    description: str = "",
    requires: tuple[str, ...] = (),
    **kwargs: Any,
) -> EnvSpec:
    """Register an env id; re-registering an id is an error (ids are versioned instead)."""
    if id in registry:
        raise ValueError(f"env id {id!r} is already registered")
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs), description=description, requires=requires)
    registry[id] = spec
    return spec


def spec(env_id: str) -> EnvSpec:
    """The registered spec of ``env_id``; a ``KeyError`` listing the registered ids otherwise."""
    try:
        return registry[env_id]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown env id {env_id!r}; registered ids: {known}") from None


def make(env_id: str, **kwargs: Any) -> Any:
    """Build a registered env; ``kwargs`` override the registered defaults (unknown ones:
    :class:`EnvKwargsError` before anything is built)."""
    return spec(env_id).make(**kwargs)
