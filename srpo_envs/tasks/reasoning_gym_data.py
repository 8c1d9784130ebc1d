"""reasoning-gym datasets as math tasks: ``dataset="reasoning-gym:<family>"`` for the math-verification env.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates seeded procedural datasets
(``create_dataset(name, size=, seed=)``), each family scored by its own ``score_answer(answer, entry)``;
SkyRL-gym and NeMo Gym train on them. Here a family becomes a list of :class:`MathTask` whose ``meta``
keeps the generated entry, and the env grades an answer with that family's scorer
(:func:`score_answer`), reporting math-verify's verdict beside it where both apply (a family whose
answers are not numbers or expressions, such as a word list, only has its own).

Splits are seeded apart (``train``: seed 1000, ``test``: seed 2000) and the held-out split drops every
question the training split of the same size holds, so a small problem space never leaks into the
evaluation. ``limit`` (the env's ``dataset_size``) sets the size, 512 by default.
"""

from __future__ import annotations

from typing import Any

from srpo_envs.tasks.task import MathTask

#: The ``dataset=`` prefix that names a reasoning-gym family.
PREFIX = "reasoning-gym:"
#: Seed of each split's generator (the held-out split also drops the training split's questions).
SPLIT_SEEDS = {"train": 1000, "test": 2000}
#: Tasks per split when no ``dataset_size``/``limit`` is given.
DEFAULT_SIZE = 512


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


def _generate(family: str, size: int, seed: int) -> list[dict[str, Any]]:
    rg = _reasoning_gym()
    known = families()
    if family not in known:
        raise ValueError(f"unknown reasoning-gym family {family!r}; known: {', '.join(known)}")
    return [dict(entry) for entry in rg.create_dataset(family, size=size, seed=seed)]


def load_reasoning_gym(source: str, split: str | None = None, limit: int | None = None) -> list[MathTask]:
    """``reasoning-gym:<family>`` as tasks of ``split`` (``train``, the default, or ``test``)."""
    family = source.removeprefix(PREFIX)
    split = split or "train"
    if split not in SPLIT_SEEDS:
        raise ValueError(f"reasoning-gym datasets have splits {sorted(SPLIT_SEEDS)}, got {split!r}")
    size = int(limit) if limit is not None else DEFAULT_SIZE
    if size < 1:
        raise ValueError(f"dataset_size must be >= 1, got {size}")
    entries = _generate(family, size, SPLIT_SEEDS[split])
    if split == "test":
        seen = {e["question"] for e in _generate(family, size, SPLIT_SEEDS["train"])}
        entries = [e for e in entries if e["question"] not in seen]
    return [
        MathTask(
            id=f"rg-{family}-{split}-{i}",
            problem=str(e["question"]),
            answer=str(e["answer"]),
            source=f"{PREFIX}{family}",
            meta={"reasoning_gym": {"family": family, "entry": e}},
        )
        for i, e in enumerate(entries)
    ]


def score_answer(task: MathTask, answer: str | None) -> float | None:
    """The family's own score of ``answer`` for ``task`` (1.0: correct; some families give partial
    credit), or None for a task that is not a reasoning-gym one."""
    spec = task.meta.get("reasoning_gym")
    if spec is None:
        return None
    scorer = _reasoning_gym().get_score_answer_fn(spec["family"])
    return float(scorer(answer, spec["entry"]))
