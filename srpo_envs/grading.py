"""Answer extraction and time-bounded math grading with math-verify.

math-verify gives real LaTeX equivalence (``\\frac{14}{3}`` vs ``14/3``, intervals, tuples, degrees), but
its own timeout uses ``signal.alarm``, which only works in a process's main thread, and sympy can
spin on adversarial input (``10**10**10``). So grading runs in small worker processes: each
answer gets a hard wall-clock bound (default 2 s); a worker that overruns is killed and replaced, and
the answer is scored wrong. The pool works the same when called from threads or other processes.

Cheap cases never leave the calling process: plain numbers compare exactly (as fractions), and
answers with stacked exponents are compared as normalised strings instead of being evaluated.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction
from functools import lru_cache

DEFAULT_TIMEOUT_S = 2.0
#: Extracted answers longer than this are not graded (no real answer is that long).
MAX_ANSWER_CHARS = 512

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)$")
#: An exponent that itself holds an exponent (``10**10**10``, ``2^{2^{22}}``, ``10^10^10``).
_POWER_TOWER_RE = re.compile(r"(\*\*|\^)\s*[\w.]+\s*(\*\*|\^)|\^\s*\{[^{}]*(\^|\*\*)")


def _balanced_group(text: str, start: int) -> str | None:
    """Content of the brace group whose ``{`` is at ``start - 1``; ``None`` if it never closes."""
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue
        if c == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif c == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last complete ``\\boxed{...}``, else the last ``<answer>`` tag.

    Returns ``None`` when the response has no complete answer (including an unbalanced ``\\boxed{``);
    envs treat that as a format error.
    """
    if not isinstance(text, str) or not text:
        return None
    boxed = None
    for m in _BOX_RE.finditer(text):
        content = _balanced_group(text, m.end())
        if content is not None:
            boxed = content
    if boxed is not None:
        boxed = boxed.strip()
        return boxed or None
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        inner = tags[-1].strip()
        nested = extract_answer(inner) if "\\boxed" in inner else None
        return (nested or inner) or None
    return None


def _as_number(s: str) -> Fraction | None:
    s = s.strip().strip("$").replace(",", "").replace("\\!", "").replace(" ", "")
    if s.startswith("\\text{") and s.endswith("}"):
        s = s[6:-1]
    if _NUMBER_RE.match(s):
        try:
            return Fraction(s)
        except (ValueError, ZeroDivisionError):
            return None
    return None


def _normalise_string(s: str) -> str:
    return re.sub(r"\s+|\\left|\\right|\$", "", s).rstrip(".").lower()


def verify_answers(pred: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """math-verify equivalence, run *in the calling process* (the worker's main thread).

    Exposed for the worker; callers should use :func:`grade`, which bounds time from outside.
    """
    from math_verify import parse, verify

    seconds = max(1, int(timeout_s))
    gold_p = parse(f"\\boxed{{{gold}}}", parsing_timeout=seconds)
    pred_p = parse(f"\\boxed{{{pred}}}", parsing_timeout=seconds)
    if not gold_p or not pred_p:
        return False
    return bool(verify(gold_p, pred_p, timeout_seconds=seconds))


class _Worker:
    """One ``python -m srpo_envs._grader_worker`` process speaking JSON lines over pipes.

    A plain subprocess (not multiprocessing) so the user's ``__main__`` is never re-imported and a
    hung worker can be killed without touching the others.
    """

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "srpo_envs._grader_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._buf = b""

    def ask(self, pred: str, gold: str, timeout_s: float, startup_s: float) -> bool | None:
        """The verdict, or ``None`` if the worker overran ``timeout_s`` (then it is dead)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = json.dumps({"pred": pred, "gold": gold, "timeout": timeout_s}) + "\n"
        self.proc.stdin.write(line.encode("utf-8"))
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s + startup_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise BrokenPipeError("grader worker exited")
            self._buf += chunk
        reply, _, self._buf = self._buf.partition(b"\n")
        return bool(json.loads(reply)["ok"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Grader:
    """Worker processes that grade with a hard per-answer time bound and survive hung workers.

    Thread-safe: each call borrows an idle worker (starting one if needed, at most ``workers``).
    The first call of a fresh worker also pays its import time (``startup_s``, once per worker).
    """

    def __init__(
        self, workers: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S, startup_s: float = 20.0
    ) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.startup_s = startup_s
        self._idle: list[_Worker] = []
        self._started = 0
        self._cond = threading.Condition()
        self.timeouts = 0

    def _borrow(self) -> tuple[_Worker, bool]:
        with self._cond:
            while not self._idle and self._started >= self.workers:
                self._cond.wait()
            if self._idle:
                return self._idle.pop(), False
            self._started += 1
        try:
            return _Worker(), True
        except Exception:
            with self._cond:
                self._started -= 1
                self._cond.notify()
            raise

    def _give_back(self, worker: _Worker) -> None:
        with self._cond:
            if worker.alive():
                self._idle.append(worker)
            else:
                self._started -= 1
            self._cond.notify()

    def verify(self, pred: str, gold: str) -> bool:
        """math-verify equivalence of two answer strings; ``False`` on timeout or worker failure."""
        worker, fresh = self._borrow()
        try:
            verdict = worker.ask(pred, gold, self.timeout_s, self.startup_s if fresh else 0.0)
        except (OSError, ValueError, KeyError):
            worker.kill()
            verdict = False
        finally:
            self._give_back(worker)
        if verdict is None:
            self.timeouts += 1
            return False
        return verdict

    def warm_up(self) -> None:
        """Start a worker now so the first graded answer does not pay the import time."""
        self.verify("1", "x")

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._started -= len(idle)
        for w in idle:
            w.kill()


_default_grader: Grader | None = None
_default_lock = threading.Lock()


def default_grader() -> Grader:
    global _default_grader
    with _default_lock:
        if _default_grader is None:
            _default_grader = Grader()
            atexit.register(_default_grader.close)
        return _default_grader


@lru_cache(maxsize=65536)
def grade(pred: str | None, gold: str) -> bool:
    """Is the extracted answer ``pred`` equivalent to the reference ``gold``? Bounded in time.

    Numbers compare exactly; stacked exponents compare as strings (never evaluated); everything else
    goes through math-verify in the worker pool (``DEFAULT_TIMEOUT_S`` per answer).
    """
    if pred is None or not pred.strip() or len(pred) > MAX_ANSWER_CHARS:
        return False
    pred, gold = pred.strip(), str(gold).strip()
    if pred == gold:
        return True
    a, b = _as_number(pred), _as_number(gold)
    if a is not None and b is not None:
        return a == b
    if _POWER_TOWER_RE.search(pred):
        return _normalise_string(pred) == _normalise_string(gold)
    return default_grader().verify(pred, gold)


def grade_response(response: str, gold: str) -> tuple[bool, str | None]:
    """Extract the answer of a full response and grade it: ``(correct, extracted)``."""
    answer = extract_answer(response)
    return grade(answer, gold), answer
