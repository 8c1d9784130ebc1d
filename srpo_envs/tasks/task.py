"""The math task record every math loader and generator returns.

It lives in its own module, below both :mod:`srpo_envs.tasks.math_data` (which dispatches
``procedural*`` names to the generators) and :mod:`srpo_envs.tasks.procedural` (which builds tasks),
so neither has to import the other to name the type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MathTask:
    """One problem with its reference answer (a string, LaTeX allowed)."""

    id: str
    problem: str
    answer: str
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
