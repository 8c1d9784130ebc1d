"""A package's public names, imported when first used (PEP 562), so ``from learners import Trainer`` works
without ``import learners`` loading torch, transformers and every submodule up front."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``'s ``__init__``: ``exports`` maps each public name to the
    submodule that defines it; the first access imports it and caches it in the package."""
    mapping = dict(exports)

    def __getattr__(name: str) -> Any:
        module = mapping.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*mapping, *vars(importlib.import_module(package))})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
