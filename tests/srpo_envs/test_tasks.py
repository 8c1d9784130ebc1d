"""Bundled math data, user files and the procedural arithmetic family."""

from __future__ import annotations

import json
import re

import pytest

from srpo_envs.tasks.math_data import MATH_DATASETS, dataset_sha256, load_math
from srpo_envs.tasks.procedural import make_arithmetic_tasks

EXPECTED_ROWS = {
    "math500": 500,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "minerva": 272,
    "olympiadbench": 675,
    "gsm8k_test": 1319,
    "gsm8k_train": 7473,
    "math_train": 7470,
}


@pytest.mark.parametrize("name", sorted(MATH_DATASETS))
def test_bundled_sets_load_completely(name: str) -> None:
    tasks = load_math(name, split="all")  # training sets hold out a split; "all" is the whole file
    assert len(tasks) == EXPECTED_ROWS[name]
    assert len({t.id for t in tasks}) == len(tasks)
    assert all(t.problem and t.answer for t in tasks)
    assert len(dataset_sha256(name)) == 64


def test_local_jsonl_and_limit(tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": i}) for i in range(5)) + "\n")
    tasks = load_math(str(path), limit=3)
    assert [t.answer for t in tasks] == ["0", "1", "2"] and tasks[0].problem == "q0"


def test_unknown_dataset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown math dataset"):
        load_math("not-a-dataset")


def _evaluate(problem: str) -> int:
    expr = problem.removeprefix("Compute ").removesuffix(".")
    assert re.fullmatch(r"[\d()+\-* ]+", expr)
    return int(eval(expr))  # noqa: S307 - the regex above admits only integers, operators, parentheses


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_procedural_answers_splits_and_determinism(difficulty: int) -> None:
    train = make_arithmetic_tasks(300, split="train", difficulty=difficulty)
    test = make_arithmetic_tasks(100, split="test", difficulty=difficulty)
    assert {t.problem for t in train}.isdisjoint({t.problem for t in test})
    assert len({t.problem for t in train}) == 300
    for t in train[:50] + test[:50]:
        assert int(t.answer) == _evaluate(t.problem)
        assert t.meta["solution"].endswith(f"\\boxed{{{t.answer}}}.")
    assert [t.id for t in make_arithmetic_tasks(300, split="train", difficulty=difficulty)] == [
        t.id for t in train
    ]
    assert make_arithmetic_tasks(20, seed=1) != make_arithmetic_tasks(20, seed=2)


def test_procedural_via_load_math() -> None:
    tasks = load_math("procedural:3", split="test", limit=10)
    assert len(tasks) == 10 and all(t.meta["difficulty"] == 3 for t in tasks)


def test_mixed_difficulties_keep_every_level() -> None:
    """A level with fewer problems must not truncate the others (it used to: zip stopped at the shortest)."""
    from srpo_envs.math_verify import MathVerifyEnv

    d1 = make_arithmetic_tasks(10_000, difficulty=1, max_operand=9, strict=False)
    env = MathVerifyEnv(dataset="procedural", difficulty=[1, 2], max_operand=9, dataset_size=300)
    levels = [t.meta["difficulty"] for t in env.tasks]
    assert levels.count(1) == len(d1) < 300 and levels.count(2) == 300
    assert levels[:4] == [1, 2, 1, 2]  # interleaved while both last
    assert len({t.id for t in env.tasks}) == len(env.tasks)


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_column_addition_solutions_and_splits(digits: int) -> None:
    from srpo_envs.tasks.procedural import make_column_addition_tasks

    train = make_column_addition_tasks(30, split="train", difficulty=digits, strict=False)
    test = make_column_addition_tasks(30, split="test", difficulty=digits, strict=False)
    assert train and test and {t.problem for t in train}.isdisjoint({t.problem for t in test})
    for t in train + test:
        a, b = (int(x) for x in re.fullmatch(r"Compute (\d+) \+ (\d+)\.", t.problem).groups())
        assert len(str(a)) == len(str(b)) == digits and int(t.answer) == a + b
        lines = t.meta["solution"].split("\n")
        assert len(lines) == digits + 1 and lines[-1] == f"The answer is \\boxed{{{a + b}}}."
        carry = 0
        for i, line in enumerate(lines[:-1]):  # ones column first, the carry added as "+ 1"
            col = [int(str(a)[::-1][i]), int(str(b)[::-1][i])] + ([1] if carry else [])
            assert line == " + ".join(map(str, col)) + f" = {sum(col)}"
            carry = sum(col) // 10


def test_column_addition_via_load_math_and_env() -> None:
    import srpo_envs

    tasks = load_math("procedural-columns:3", split="test", limit=5, max_operand=9)  # max_operand ignored
    assert len(tasks) == 5 and all(t.source == "procedural-columns-d3" for t in tasks)
    env = srpo_envs.make("ProcArith-v0", dataset="procedural-columns", difficulty=[2, 3], dataset_size=4)
    assert [t.meta["difficulty"] for t in env.unwrapped.tasks] == [2, 3, 2, 3, 2, 3, 2, 3]
    with pytest.raises(ValueError, match="unknown procedural family"):
        load_math("procedural-colums", limit=3)


def test_slipped_solution_forgets_exactly_the_first_carry() -> None:
    from srpo_envs.tasks.math_data import MathTask
    from srpo_envs.tasks.procedural import column_solution, make_column_addition_tasks, slipped_solution

    assert column_solution(455, 319) == (["5 + 9 = 14", "5 + 1 + 1 = 7", "4 + 3 = 7"], 774)
    assert column_solution(455, 319, forget_carry=True) == (["5 + 9 = 14", "5 + 1 = 6", "4 + 3 = 7"], 764)
    # later carries are still added; a carry out of the top column still becomes a digit
    assert column_solution(959, 994, forget_carry=True) == (
        ["9 + 4 = 13", "5 + 9 = 14", "9 + 9 + 1 = 19"],
        1943,
    )
    tasks = make_column_addition_tasks(200, difficulty=3)
    for t in tasks:
        slipped = slipped_solution(t)
        a, b = (int(x) for x in re.fullmatch(r"Compute (\d+) \+ (\d+)\.", t.problem).groups())
        has_carry = any(int(x) + int(y) >= 10 for x, y in zip(str(a)[1:], str(b)[1:], strict=True))
        if not has_carry:  # no carry into a next column: nothing to forget
            assert slipped is None
            continue
        assert slipped is not None and slipped.splitlines()[0] == t.meta["solution"].splitlines()[0]
        assert (
            slipped.endswith(f"\\boxed{{{column_solution(a, b, True)[1]}}}.")
            and column_solution(a, b, True)[1] != a + b
        )
    arith = make_arithmetic_tasks(3)[0]
    assert slipped_solution(arith) is None
    assert slipped_solution(MathTask(id="x", problem="Compute 15 + 17.", answer="32", source="user")) is None
