"""reasoning-gym datasets as math tasks: ``dataset="reasoning-gym:<family>"`` for the math-verification env.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates seeded procedural datasets
(``create_dataset(name, size=, seed=)``), each family scored by its own ``score_answer(answer, entry)``;
SkyRL-gym and NeMo Gym train on them. Here a family becomes a list of :class:`MathTask` whose ``meta``
keeps the generated entry, and the env grades an answer with that family's scorer
(:func:`score_answer`), reporting math-verify's verdict beside it where both apply (a family whose
answers are not numbers or expressions, such as a word list, only has its own).

Splits are seeded apart (``train``: seed 1000, ``test``: seed 10^9; reasoning-gym draws item i from
``seed + i``, so seeds closer than a split's length would share items) and the held-out split drops every
question of the first 2,048 training questions (:data:`HELD_OUT_GUARD`, or as many as it holds itself),
so a small problem space never leaks into the evaluation. ``dataset_config`` sets the family's generator;
``reasoning-gym:composite`` mixes families (``{"datasets": [{"name", "weight", "config"}, ...]}``), each
entry scored by its own family. ``limit`` (the env's ``dataset_size``) sets the size, 512 by default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from srpo_envs.tasks.procedural import column_solution
from srpo_envs.tasks.task import MathTask

#: The ``dataset=`` prefix that names a reasoning-gym family.
PREFIX = "reasoning-gym:"
#: Seed of each split's generator (the held-out split also drops the training split's questions).
#: reasoning-gym seeds item i of a dataset with ``seed + i``, so the two seeds must lie further apart
#: than any split is long: the test split starts a billion items away.
SPLIT_SEEDS = {"train": 1000, "test": 1_000_000_000}
#: Tasks per split when no ``dataset_size``/``limit`` is given.
DEFAULT_SIZE = 512
#: The held-out split drops every question of the first this-many training questions (or as many as it
#: holds itself, if more), so a training run of up to this size never sees a held-out question.
HELD_OUT_GUARD = 2048


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym  # an optional dependency (the `gym` extra): loaded only when named
    except ImportError:
        raise ValueError(
            "dataset reasoning-gym:... needs the reasoning-gym package: pip install 'srpo[gym]'"
        ) from None
    return reasoning_gym


def families() -> list[str]:
    """Every reasoning-gym family this installation can generate."""
    from reasoning_gym.factory import DATASETS

    _reasoning_gym()
    return sorted(DATASETS)


def _generate(family: str, size: int, seed: int, config: dict[str, Any]) -> list[dict[str, Any]]:
    rg = _reasoning_gym()
    known = families()
    if family not in known:
        raise ValueError(f"unknown reasoning-gym family {family!r}; known: {', '.join(known)}")
    from reasoning_gym.factory import DATASETS

    fields = [f.name for f in dataclasses.fields(DATASETS[family][1]) if f.name not in ("seed", "size")]
    unknown = [k for k in config if k not in fields]
    if unknown:
        raise ValueError(f"reasoning-gym family {family} has no setting {', '.join(unknown)}; it has: {', '.join(fields)}")
    if family == "composite":  # a mixture of families: each spec {"name", "weight", "config"}
        from reasoning_gym.composite import DatasetSpec

        config = {**config, "datasets": [DatasetSpec(**d) if isinstance(d, dict) else d for d in config.get("datasets") or []]}
    return [dict(entry) for entry in rg.create_dataset(family, size=size, seed=seed, **config)]


def load_reasoning_gym(
    source: str, split: str | None = None, limit: int | None = None, config: dict[str, Any] | None = None
) -> list[MathTask]:
    """``reasoning-gym:<family>`` as tasks of ``split`` (``train``, the default, or ``test``); ``config``
    sets the family's generator (its config dataclass's fields: chain_sum's ``max_terms``...)."""
    family = source.removeprefix(PREFIX)
    split = split or "train"
    if split not in SPLIT_SEEDS:
        raise ValueError(f"reasoning-gym datasets have splits {sorted(SPLIT_SEEDS)}, got {split!r}")
    size = int(limit) if limit is not None else DEFAULT_SIZE
    if size < 1:
        raise ValueError(f"dataset_size must be >= 1, got {size}")
    config = dict(config or {})
    entries = _generate(family, size, SPLIT_SEEDS[split], config)
    if split == "test":
        guard = max(size, HELD_OUT_GUARD)
        seen = {e["question"] for e in _generate(family, guard, SPLIT_SEEDS["train"], config)}
        entries = [e for e in entries if e["question"] not in seen]
    tasks = []
    for i, e in enumerate(entries):
        meta: dict[str, Any] = {"reasoning_gym": {"family": family, "entry": e}}
        solution = worked_solution(family, e)
        if solution is not None:
            meta["solution"] = solution
        tasks.append(
            MathTask(id=f"rg-{family}-{split}-{i}", problem=str(e["question"]), answer=str(e["answer"]),
                     source=f"{PREFIX}{family}", meta=meta)
        )
    return tasks


def _left_to_right(entry: dict[str, Any]) -> tuple[list[str], int] | None:
    """``34 + 7 - 12`` one operation per line, left to right, and the value; None for an expression with
    anything but integers, ``+`` and ``-`` (products, quotients, parentheses)."""
    terms = str(entry["metadata"]["expression"]).split()
    if len(terms) % 2 == 0 or any(op not in ("+", "-") for op in terms[1::2]):
        return None
    try:
        total, numbers = int(terms[0]), [int(t) for t in terms[2::2]]
    except ValueError:
        return None
    lines = []
    for op, term in zip(terms[1::2], numbers, strict=True):
        after = total + term if op == "+" else total - term
        lines.append(f"{total} {op} {term} = {after}")
        total = after
    return lines, total


def _two_number_sum(entry: dict[str, Any]) -> tuple[int, int] | None:
    """``(a, b)`` of an entry whose expression is ``a + b`` of two non-negative integers, else None."""
    terms = str(entry["metadata"].get("expression", "")).split()
    if len(terms) == 3 and terms[1] == "+" and terms[0].isdigit() and terms[2].isdigit():
        return int(terms[0]), int(terms[2])
    return None


def _columns_or_left_to_right(entry: dict[str, Any]) -> tuple[list[str], int] | None:
    """A sum of two non-negative numbers column by column, ones first (the lines of srpo's
    ``procedural-columns`` solutions, a skill the tiny warm starts already have, so a short SFT pass
    only has to teach the family's phrasing); any other chain of ``+`` and ``-`` left to right."""
    pair = _two_number_sum(entry)
    return column_solution(*pair) if pair is not None else _left_to_right(entry)


#: Families srpo writes a worked solution for: what the SFT teacher of the ``gym`` warm start imitates
#: (``MathTask.meta["solution"]``), since reasoning-gym ships answers only. A writer returns the step
#: lines and the value they reach, or None for an entry it does not cover.
WORKED_SOLUTIONS = {"chain_sum": _columns_or_left_to_right, "basic_arithmetic": _columns_or_left_to_right}


def worked_solution(family: str, entry: dict[str, Any]) -> str | None:
    """Step lines and ``The answer is \\boxed{...}`` for a family in :data:`WORKED_SOLUTIONS`, checked
    against the entry's answer; None for any other family or an entry its writer does not cover."""
    if family == "composite":  # the entry's own family writes it
        family = str(entry["metadata"].get("source_dataset", ""))
    write = WORKED_SOLUTIONS.get(family)
    written = write(entry) if write is not None else None
    if written is None:
        return None
    steps, value = written
    if str(value) != str(entry["answer"]):
        raise ValueError(f"worked solution of {family} reaches {value}, not the entry's answer {entry['answer']}")
    return "\n".join([*steps, f"The answer is \\boxed{{{entry['answer']}}}."])


def slipped_solution(task: MathTask) -> str | None:
    """The column solution of a reasoning-gym sum of two numbers with its first carry forgotten (the
    slip :func:`srpo_envs.tasks.procedural.column_solution` writes, ending at the wrong answer it
    reaches); None for any other task or a sum with no carry to forget. An SFT teacher mixes these in
    (``SFTConfig.carry_slip``) to give the warm start a systematic error that RL can remove."""
    spec = task.meta.get("reasoning_gym")
    pair = _two_number_sum(spec["entry"]) if spec is not None else None
    if pair is None:
        return None
    a, b = pair
    steps, value = column_solution(a, b, forget_carry=True)
    if value == a + b:
        return None
    return "\n".join([*steps, f"The answer is \\boxed{{{value}}}."])


def score_answer(task: MathTask, answer: str | None) -> float | None:
    """The family's own score of ``answer`` for ``task`` (1.0: correct; some families give partial
    credit), or None for a task that is not a reasoning-gym one."""
    spec = task.meta.get("reasoning_gym")
    if spec is None:
        return None
    family = spec["family"]
    if family == "composite":  # scored by the entry's own family
        family = spec["entry"]["metadata"]["source_dataset"]
    scorer = _reasoning_gym().get_score_answer_fn(family)
    return float(scorer(answer, spec["entry"]))
