"""Answer extraction and math-verify grading, including hand-checked MATH500 equivalences."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from srpo_envs.grading import Grader, extract_answer, grade, grade_response

# (gold answer as it appears in MATH500, an equivalent way a model may write it) - checked by hand.
MATH500_EQUIVALENT = [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("p - q", "-q + p"),
    ("\\frac{14}{3}", "14/3"),
    ("\\text{Evelyn}", "Evelyn"),
    ("90^\\circ", "90"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("\\frac{3}{56}", "3/56"),
    ("6 - 5i", "-5i + 6"),
    ("x=5", "5"),
    ("11\\sqrt2", "11\\sqrt{2}"),
    ("\\frac{243}{625}", "0.3888"),
    ("1.25", "\\frac{5}{4}"),
    ("x^5 - x^4 + x^3 - x^2 + x - 1", "-1 + x - x^2 + x^3 - x^4 + x^5"),
    ("-\\frac{\\pi}{6}", "-\\pi/6"),
    ("(6,31,-1)", "\\left(6, 31, -1\\right)"),
    ("\\frac{3\\sqrt{3}}{4}", "\\frac{3}{4}\\sqrt{3}"),
    ("\\$42409", "42409"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
]

# Pairs that look alike but are NOT equivalent.
MATH500_DIFFERENT = [
    ("\\frac{14}{3}", "\\frac{3}{14}"),
    ("p - q", "q - p"),
    ("(6,31,-1)", "(6,31,1)"),
    ("6 - 5i", "6 + 5i"),
    ("(-\\infty, 3]", "(-\\infty, 3)"),
    ("3\\sqrt{13}", "3\\sqrt{11}"),
]


@pytest.mark.parametrize(("gold", "pred"), MATH500_EQUIVALENT)
def test_math500_equivalences(gold: str, pred: str) -> None:
    assert grade(pred, gold)


@pytest.mark.parametrize(("gold", "pred"), MATH500_DIFFERENT)
def test_math500_non_equivalences(gold: str, pred: str) -> None:
    assert not grade(pred, gold)


def test_extract_answer_forms() -> None:
    assert extract_answer("so \\boxed{\\frac{1}{2}} then \\boxed{3}") == "3"
    assert extract_answer("nested \\boxed{\\frac{a}{\\sqrt{b}}}") == "\\frac{a}{\\sqrt{b}}"
    assert extract_answer("<answer>42</answer>") == "42"
    assert extract_answer("<answer>so \\boxed{7}</answer>") == "7"
    assert extract_answer("\\boxed{") is None
    assert extract_answer("\\boxed{1} and unbalanced \\boxed{2") == "1"
    assert extract_answer("no answer here") is None
    assert extract_answer("\\boxed{}") is None
    assert extract_answer("") is None


def test_grade_response_and_numbers() -> None:
    assert grade_response("thus \\boxed{1,000}", "1000") == (True, "1,000")
    assert grade("007", "7")
    assert not grade(None, "7")
    assert not grade("x" * 10_000, "7")


@pytest.mark.parametrize("evil", ["10**10**10", "10^{10^{10}}", "2^{2^{2^{2^{22}}}}", "9" * 400 + "!"])
def test_pathological_answers_are_bounded(evil: str) -> None:
    start = time.monotonic()
    assert not grade(evil, "5")
    assert time.monotonic() - start < 3.0


def test_grader_kills_a_hung_worker_and_recovers() -> None:
    grader = Grader(workers=1, timeout_s=1.0)
    try:
        grader.warm_up()
        # A huge factorial makes sympy compute for a long time: the worker must be killed.
        start = time.monotonic()
        assert grader.verify("\\left(10^{7}\\right)!", "5") is False
        assert time.monotonic() - start < 2.5
        assert grader.timeouts == 1
        assert grader.verify("\\frac{1}{2}", "0.5") is True  # a fresh worker took over
    finally:
        grader.close()


def test_grading_from_threads_is_bounded_and_correct() -> None:
    pairs = [("14/3", "\\frac{14}{3}", True), ("\\frac{3}{14}", "\\frac{14}{3}", False)] * 8
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: Grader(workers=2).verify(p[0], p[1]), pairs[:4]))
        results += list(pool.map(lambda p: grade(p[0] + " ", p[1]), pairs))
    assert results[:4] == [p[2] for p in pairs[:4]]
    assert results[4:] == [p[2] for p in pairs]
    assert time.monotonic() - start < 30
