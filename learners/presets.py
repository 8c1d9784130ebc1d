"""SFT recipes of the shipped warm starts, kept apart from the SFT code that runs them.

A recipe is a chain of ``srpo model sft`` passes: each entry holds the :class:`learners.sft.SFTConfig`
overrides of one pass, which is saved in bfloat16 and reloaded by the next, exactly as a chain of
commands does (bfloat16 unless a pass sets ``save_dtype``). ``math`` builds ``agents/checkpoints/mini-sft``; ``columns`` continues the math passes
on column addition, ending with a teacher that forgets the first carry in 40% of its solutions
(``carry_slip``), a systematic error that RL removes on held-out problems too (the quick-columns
suite); ``search`` builds ``mini-search-sft`` in the single invented world 0 (it memorises that world's
facts: 0% on unseen worlds). ``search-worlds`` builds ``mini-search-worlds-sft`` across 1,024 invented worlds (one drawn per
episode: a pass's 8,000 episodes ask ~8 of each world's ~850 training questions, so a fact rarely recurs
and none can be memorised), with a
tokenizer read from 16 of them, evaluates in worlds 1 and 2, which no pass trains in, and teaches a habit
RL can remove (``premature_answer``: on a two-hop question the teacher answers with the bridge entity 30%
of the time). Copying a name it has never seen is the skill that takes, so every pass also trains on the
prompt tokens (``prompt_loss_weight``: observations repeat each name they mention) and the teacher writes
``<answer> Name</answer>`` (``copy_spacing``: the name's tokens are then the passage's tokens). Measured
accuracies of each pass are in docs/results/warm-starts.md.
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

_SEARCH: dict[str, Any] = {
    "domain": "search",
    "kb_worlds": 1024,
    "premature_answer": 0.3,
    "length_groups": 8,
    "eval_kb_seeds": (1, 2),
    "eval_problems": 48,
    "lr": 2e-3,
    "warmup": 100,
    "refine_steps": 0,
    "prompt_loss_weight": 1.0,
    "copy_spacing": True,
    "search_episodes": 8000,
    "save_dtype": "float32",
}

#: mini-search-worlds-sft: four passes across the invented worlds.
_SEARCH_WORLDS: tuple[dict[str, Any], ...] = (
    {**_SEARCH, "steps": 2500},
    {**_SEARCH, "steps": 2500, "seed": 1, "lr": 1.5e-3, "save_dtype": "bfloat16"},
    {**_SEARCH, "steps": 2500, "seed": 2, "lr": 1.5e-3, "save_dtype": "bfloat16"},
    # the third pass's loss was still falling: a fourth at a lower peak rate (docs/results/warm-starts.md: each pass's EM)
    {**_SEARCH, "steps": 2500, "seed": 3, "lr": 1e-3, "save_dtype": "bfloat16"},
)

#: The reasoning-gym suite's two families at CPU scale (benchmarks.suites "quick-gym"), each in its own
#: phrasing: chains of two or three one-digit numbers with + and - (chain_sum; the held-out split is
#: three-term chains, since the guard's 2,048 training questions cover every two-term one) and sums of two
#: numbers of two or three digits (basic_arithmetic). The tiny warm starts already add in columns and step
#: through one-digit chains (srpo's own formats), so what SFT has to teach is the families' phrasing.
GYM_FAMILIES: dict[str, dict[str, Any]] = {
    "reasoning-gym:chain_sum": {"min_terms": 2, "max_terms": 3, "max_digits": 1},
    "reasoning-gym:basic_arithmetic": {
        "min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3, "operators": ["+"],
        "allow_parentheses": False, "allow_negation": False,
    },
}
#: The two families as one reasoning-gym composite dataset: what quick-gym's RL runs train on.
GYM_MIXTURE: dict[str, Any] = {
    "datasets": [{"name": name.removeprefix("reasoning-gym:"), "weight": 1.0, "config": config}
                 for name, config in GYM_FAMILIES.items()]
}
_GYM: dict[str, Any] = {
    "difficulties": (1,), "lr": 1e-3, "warmup": 20, "refine_steps": 0, "tasks_per_difficulty": 2400,
    "dataset": "reasoning-gym:composite", "dataset_config": GYM_MIXTURE,
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
    # mini-columns-sft plus one routed pass with five teacher proposers: its router sends 1..5 (the
    # paper's K up to 5; mini-columns-sft never saw a route above 3 and never sends one)
    "columns5": (
        {},
        {"steps": 2000, "lr": 1e-3, "refine_steps": 0, "seed": 2},
        {**_COLUMNS, "steps": 300, "seed": 3},
        {**_COLUMNS, "steps": 1200, "seed": 3},
        {**_COLUMNS, "steps": 500, "seed": 4, "carry_slip": 0.4},
        {
            **_COLUMNS,
            "workflows": ("routed",),
            "n_proposers": 5,
            "steps": 300,
            "lr": 3e-4,
            "seed": 5,
            "carry_slip": 0.4,
            "save_dtype": "bfloat16",
        },
    ),
    "search": ({"domain": "search"},),
    "search-worlds": _SEARCH_WORLDS,
    # search-worlds' four passes plus one routed pass with five teacher searchers: its router sends
    # 1..5 (the search-worlds teacher played the parallel workflow only, so that warm start never routes)
    "search-worlds-routed": (
        *_SEARCH_WORLDS,
        {
            **_SEARCH,
            "search_workflow": "routed",
            "n_searchers": 5,
            "search_episodes": 2000,
            "steps": 400,
            "lr": 3e-4,
            "warmup": 20,
            "seed": 4,
            "save_dtype": "bfloat16",
        },
    ),
}
# the columns warm start, then the two reasoning-gym families mixed in every pass with srpo's worked
# solutions (alternating one-family passes forgot: a chain_sum pass took basic_arithmetic from 34% to 2%;
# the shipped mini-gym-sft ran these three on mini-columns-sft)
RECIPES["gym"] = (
    *RECIPES["columns"],
    {**_GYM, "steps": 600, "seed": 6},
    {**_GYM, "steps": 600, "seed": 7},
    # as the columns recipe's last pass: the first carry of a two-number sum forgotten in 40% of the
    # teacher's sums, a systematic error RL can remove
    {**_GYM, "steps": 200, "seed": 8, "lr": 5e-4, "carry_slip": 0.4},
)
