"""Procedural integer arithmetic: task families a tiny model can learn on CPU in minutes.

Nested arithmetic (:func:`make_arithmetic_tasks`, dataset ``procedural``): difficulty ``d`` is the
number of operations (``d + 1`` operands). Operands are 1-2 digit numbers;
``*`` appears only with a one-digit factor so intermediate results stay small. Nesting is explicit
(``((a + b) - c) * d``), so there is no precedence to learn, and each worked solution computes one
operation per line before the final ``\\boxed{}``. Its small problem spaces make held-out problems
partly unseen *facts*, which a tiny model memorises rather than learns.

Column addition (:func:`make_column_addition_tasks`, dataset ``procedural-columns``): difficulty ``d``
is the number of digits per operand, and every problem is a chain of the same 200 one-digit facts, so
held-out accuracy measures the procedure.

The train/test split is a pure function of the problem text (a hash bucket), so the two splits
never share a problem whatever ``n`` or seed is asked for.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Callable

from srpo_envs.tasks.task import MathTask

TEST_BUCKETS = 2  # of 10: ~20% of all problems belong to the test split


def _split_of(problem: str) -> str:
    bucket = int(hashlib.sha256(problem.encode()).hexdigest()[:8], 16) % 10
    return "test" if bucket < TEST_BUCKETS else "train"


def _sample(rng: random.Random, difficulty: int, max_operand: int) -> tuple[str, int, list[str]]:
    value = rng.randint(1, max_operand)
    expr = str(value)
    steps: list[str] = []
    for i in range(difficulty):
        op = rng.choice("+-*") if difficulty >= 2 else rng.choice("+-")
        operand = rng.randint(2, 9) if op == "*" else rng.randint(1, max_operand)
        new = value + operand if op == "+" else value - operand if op == "-" else value * operand
        steps.append(f"{value} {op} {operand} = {new}")
        expr = f"({expr} {op} {operand})" if i < difficulty - 1 else f"{expr} {op} {operand}"
        value = new
    return expr, value, steps


def make_arithmetic_tasks(
    n: int = 512,
    *,
    split: str = "train",
    difficulty: int = 2,
    max_operand: int = 30,
    seed: int = 0,
    strict: bool = True,
) -> list[MathTask]:
    """``n`` distinct problems of the given split; deterministic in all arguments.

    With ``strict=False`` fewer than ``n`` are returned when the settings admit fewer distinct
    problems (e.g. one operation on one-digit numbers); otherwise that is an error.

    Results are memoised per argument set: finding that a small space is exhausted takes tens of
    thousands of draws, and rollout collectors build one env (hence one task list) per parallel episode.
    The returned list is fresh, but its tasks are shared between calls: treat them as read-only.
    """
    return list(_make_arithmetic_tasks(n, split, difficulty, max_operand, seed, strict))


@functools.lru_cache(maxsize=64)
def _make_arithmetic_tasks(
    n: int, split: str, difficulty: int, max_operand: int, seed: int, strict: bool
) -> tuple[MathTask, ...]:
    if difficulty < 1 or max_operand < 2 or n < 1:
        raise ValueError("need difficulty >= 1, max_operand >= 2, n >= 1")
    rng = random.Random(f"arith:{seed}:{difficulty}:{max_operand}:{split}")
    return _distinct_tasks(
        lambda: _sample(rng, difficulty, max_operand), n, split, strict, "arith", difficulty
    )


def _worked_solution(steps: list[str], answer: int) -> str:
    """One line per step, then the boxed answer: the text teachers write and SFT imitates."""
    return "\n".join(steps) + f"\nThe answer is \\boxed{{{answer}}}."


def _distinct_tasks(
    draw: Callable[[], tuple[str, int, list[str]]],
    n: int,
    split: str,
    strict: bool,
    family: str,
    difficulty: int,
) -> tuple[MathTask, ...]:
    """Draw ``(expression, answer, solution lines)`` until ``n`` distinct problems of ``split`` exist.

    Shared by every procedural family: problem text ``Compute <expression>.``, the hash split, the
    give-up rule (``200 n + 10,000`` draws; with ``strict=False`` keep what was found) and the
    ``<family>-d<difficulty>-<digest>`` ids.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    seen: set[str] = set()
    tasks: list[MathTask] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            if not strict and tasks:
                break
            raise ValueError(
                f"only {len(tasks)} distinct {split} problems exist for these settings (asked {n})"
            )
        expr, answer, steps = draw()
        problem = f"Compute {expr}."
        if problem in seen or _split_of(problem) != split:
            continue
        seen.add(problem)
        digest = hashlib.sha256(problem.encode()).hexdigest()[:10]
        solution = _worked_solution(steps, answer)
        tasks.append(
            MathTask(
                id=f"{family}-d{difficulty}-{digest}",
                problem=problem,
                answer=str(answer),
                source=f"procedural-{family}-d{difficulty}",
                meta={"solution": solution, "difficulty": difficulty, "split": split},
            )
        )
    return tuple(tasks)


def column_solution(a: int, b: int, forget_carry: bool = False) -> tuple[list[str], int]:
    """Lines of ``a + b`` column by column (ones first: the two digits, the carry if any, their sum)
    and the number they spell.

    ``forget_carry=True`` writes the slip a learner makes most: the first carry is not added to the
    next column (later carries are), so the lines and the answer are consistently wrong. Used to give
    a warm start a systematic error that RL with a verifiable reward can remove (``SFTConfig.carry_slip``).
    """
    steps: list[str] = []
    digits: list[int] = []
    carry, slipped = 0, False
    da, db = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        if carry and forget_carry and not slipped:
            carry, slipped = 0, True
        terms = [int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0] + ([1] if carry else [])
        total = sum(terms)
        steps.append(" + ".join(map(str, terms)) + f" = {total}")
        digits.append(total % 10)
        carry = total // 10
    value = int("".join(map(str, ([carry] if carry else []) + digits[::-1])))
    return steps, value


def slipped_solution(task: MathTask) -> str | None:
    """The worked solution of a column-addition task with its first carry forgotten; ``None`` when the
    task is not column addition or has no carry to forget."""
    m = re.fullmatch(r"Compute (\d+) \+ (\d+)\.", task.problem)
    if m is None or not task.source.startswith("procedural-columns"):
        return None
    a, b = int(m.group(1)), int(m.group(2))
    steps, value = column_solution(a, b, forget_carry=True)
    if value == a + b:
        return None
    return _worked_solution(steps, value)


def make_column_addition_tasks(
    n: int = 512, *, split: str = "train", difficulty: int = 2, seed: int = 0, strict: bool = True
) -> list[MathTask]:
    """``n`` distinct additions of two ``difficulty``-digit numbers, solved column by column.

    Unlike :func:`make_arithmetic_tasks`, a held-out problem here needs no fact a training problem
    lacks: every problem is a chain of one-digit sums with or without a carry (200 facts in all), so
    the test split measures the skill rather than memorised answers. That is the family where an RL
    step on training problems can move held-out accuracy. Same split rule (a hash of the problem text)
    and the same ``strict`` / memoisation behaviour as :func:`make_arithmetic_tasks`.
    """
    return list(_make_column_addition_tasks(n, split, difficulty, seed, strict))


@functools.lru_cache(maxsize=64)
def _make_column_addition_tasks(
    n: int, split: str, difficulty: int, seed: int, strict: bool
) -> tuple[MathTask, ...]:
    if not 1 <= difficulty <= 9 or n < 1:
        raise ValueError("need 1 <= difficulty (digits per operand) <= 9 and n >= 1")
    rng = random.Random(f"columns:{seed}:{difficulty}:{split}")
    low, high = 10 ** (difficulty - 1), 10**difficulty - 1

    def draw() -> tuple[str, int, list[str]]:
        a, b = rng.randint(low, high), rng.randint(low, high)
        return f"{a} + {b}", a + b, column_solution(a, b)[0]

    return _distinct_tasks(draw, n, split, strict, "columns", difficulty)
