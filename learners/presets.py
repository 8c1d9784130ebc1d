"""SFT recipes of the shipped warm starts, kept apart from the SFT code that runs them.

A recipe is a chain of ``srpo model sft`` passes: each entry holds the :class:`learners.sft.SFTConfig`
overrides of one pass, which is saved in bfloat16 and reloaded by the next, exactly as a chain of
commands does. ``math`` builds ``agents/checkpoints/mini-sft``; ``columns`` continues the math passes
on column addition, ending with a teacher that forgets the first carry in 40% of its solutions
(``carry_slip``), a systematic error that RL removes on held-out problems too (the quick-columns
suite); ``search`` builds ``mini-search-sft`` in the single invented world 0 (it memorises that world's
facts: 0% on unseen worlds, see ``SFTConfig.kb_worlds`` for the many-world setting). Measured accuracies
of each pass are in the README.
"""

from __future__ import annotations

from typing import Any

_COLUMNS: dict[str, Any] = {
    "dataset": "procedural-columns",
    "difficulties": (2, 3),
    "lr": 1e-3,
    "warmup": 20,
    "refine_steps": 0,
}

#: Recipe name -> the SFT passes (``SFTConfig`` overrides), run one after another.
RECIPES: dict[str, tuple[dict[str, Any], ...]] = {
    "math": ({}, {"steps": 2000, "lr": 1e-3, "refine_steps": 0, "seed": 2}),
    "columns": (
        {},
        {"steps": 2000, "lr": 1e-3, "refine_steps": 0, "seed": 2},
        {**_COLUMNS, "steps": 300, "seed": 3},
        {**_COLUMNS, "steps": 1200, "seed": 3},
        {**_COLUMNS, "steps": 500, "seed": 4, "carry_slip": 0.4},
    ),
    "search": ({"domain": "search"},),
}
