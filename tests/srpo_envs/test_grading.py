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
    shared = Grader(workers=2)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: shared.verify(p[0], p[1]), pairs[:4]))
        results += list(pool.map(lambda p: grade(p[0] + " ", p[1]), pairs))
    shared.close()
    assert results[:4] == [p[2] for p in pairs[:4]]
    assert results[4:] == [p[2] for p in pairs]
    assert time.monotonic() - start < 30


# ---------------------------------------------------------------- linear extraction


def _reference_extract(text: str) -> str | None:
    """The original (quadratic) extractor, as the specification the linear one must match."""
    import re

    def group(t: str, start: int) -> str | None:
        depth = 1
        for i in range(start, len(t)):
            c = t[i]
            if c == "\\" and i + 1 < len(t) and t[i + 1] in "{}":
                continue
            if c == "{" and (i == 0 or t[i - 1] != "\\"):
                depth += 1
            elif c == "}" and (i == 0 or t[i - 1] != "\\"):
                depth -= 1
                if depth == 0:
                    return t[start:i]
        return None

    boxed = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        content = group(text, m.end())
        if content is not None:
            boxed = content
    if boxed is not None:
        return boxed.strip() or None
    tags = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)
    if tags:
        inner = tags[-1].strip()
        nested = _reference_extract(inner) if "\\boxed" in inner else None
        return (nested or inner) or None
    return None


def test_extraction_matches_the_reference_on_random_texts() -> None:
    import random

    rng = random.Random(0)
    pieces = ["\\boxed{", "\\fbox {", "{", "}", "\\{", "\\}", "\\", "x", " 1", "<answer>", "</ANSWER>", "\n"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        assert extract_answer(text) == _reference_extract(text), text


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 30_000,  # 210 KB of unclosed boxes: 0.37 s per 8 KB when each was scanned to the end
        "\\boxed{" * 30_000 + "}",
        "\\boxed{" + "{" * 200_000,
        "<answer>" * 25_000,  # a regex <answer>(.*?)</answer> rescans from every unclosed tag
        "<answer>" * 25_000 + "\\boxed{" * 5_000 + "</answer>",
    ],
    ids=["unclosed-boxes", "innermost-closes", "deep-braces", "unclosed-tags", "tags-and-boxes"],
)
def test_extraction_is_linear_on_200kb_adversarial_text(text: str) -> None:
    start = time.perf_counter()
    extract_answer(text)
    assert time.perf_counter() - start < 2.0  # generous: the linear pass takes ~50 ms


# ---------------------------------------------------------------- isolated, accountable workers


def _fake_python(tmp_path, script: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_worker_does_not_import_from_cwd_or_pythonpath(tmp_path, monkeypatch) -> None:
    """Regression: ``python -m`` put the cwd first on sys.path, so a math_verify.py there ran."""
    marker = tmp_path / "payload-ran"
    (tmp_path / "math_verify.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    grader = Grader(workers=1)
    try:
        assert grader.verify("\\frac{1}{2}", "0.5") is True
    finally:
        grader.close()
    assert not marker.exists()


def test_a_worker_that_cannot_start_is_an_error_not_a_wrong_answer(tmp_path, monkeypatch) -> None:
    import sys

    from srpo_envs import grading

    monkeypatch.setattr(sys, "executable", _fake_python(tmp_path, "echo 'no math here' >&2; exit 3\n"))
    grader = Grader(workers=1)
    try:
        with pytest.raises(grading.GraderError, match="no math here"):
            grader.verify("x + 1", "1 + x")
        assert grader.stats()["grading/worker_failures"] == 2  # the retry failed too
        assert grader.stats()["grading/answers"] == 0
    finally:
        grader.close()


def test_a_worker_that_errors_on_every_answer_is_reported(tmp_path, monkeypatch) -> None:
    """Regression: an erroring worker made every answer grade False with no message."""
    import sys

    from srpo_envs import grading

    script = 'echo \'{"ready": true}\'\nwhile read line; do echo \'{"error": "ImportError: sympy"}\'; done\n'
    monkeypatch.setattr(sys, "executable", _fake_python(tmp_path, script))
    grader = Grader(workers=1)
    monkeypatch.setattr(grading, "_default_grader", grader)
    try:
        with pytest.raises(grading.GraderError, match="ImportError: sympy"):
            grade("x + 2", "2 + x")
        assert grading.grading_stats()["grading/worker_failures"] == 2
    finally:
        grader.close()


def test_a_killed_worker_is_replaced_off_the_answer_clock() -> None:
    """After a timeout the next answer goes to a spare that is already up: it never waits for a
    worker's start-up (that start-up once made an answer take 2.7 s against a 2 s bound)."""
    grader = Grader(workers=1, timeout_s=1.0)
    try:
        grader.warm_up()
        assert grader.stats()["grading/worker_starts"] == 2  # the worker and its spare
        assert grader.verify("\\left(10^{7}\\right)!", "5") is False  # overruns and is killed
        stats = grader.stats()
        assert stats["grading/timeouts"] == 1
        assert stats["grading/worker_starts"] == 3  # its replacement was started before verify returned
        assert grader.verify("\\frac{1}{2}", "0.5") is True
        assert grader.stats()["grading/startup_waits"] == 0  # no answer ever waited for a start-up
    finally:
        grader.close()


def test_grader_validates_its_settings() -> None:
    with pytest.raises(ValueError):
        Grader(workers=0)
    with pytest.raises(ValueError):
        Grader(timeout_s=0)
