"""SFT recipes of the shipped warm starts, kept apart from the SFT code that runs them.

A recipe is a chain of ``srpo model sft`` passes: each entry holds the :class:`learners.sft.SFTConfig`
overrides of one pass, which is saved in bfloat16 and reloaded by the next, exactly as a chain of
commands does. ``math`` builds ``agents/checkpoints/mini-sft``; ``columns`` continues the math passes
on column addition, ending with a teacher that forgets the first carry in 40% of its solutions
(``carry_slip``), a systematic error that RL removes on held-out problems too (the quick-columns
suite); ``search`` builds ``mini-search-sft``: a first pass in the single invented world 0 teaches the
formats (and memorises that world), a second one plays every episode in one of 16 other invented
worlds, so that answering takes reading what was retrieved, with an aggregator that answers two-hop
questions with the bridge entity after the first hop in 30% of its demonstrations (``premature_answer``):
a habit RL removes on unseen worlds (the quick-search suite). Measured accuracies of each pass are in
the README.
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
    "search": (
        {"domain": "search"},
        {
            "domain": "search",
            "kb_worlds": 16,
            "premature_answer": 0.3,
            "eval_kb_seeds": (1, 2),
            "eval_problems": 32,
            "search_episodes": 600,
            "steps": 100,
            "lr": 2e-3,
            "warmup": 10,
            "refine_steps": 0,
            "length_groups": 8,
            "seed": 5,
        },
    ),
}
