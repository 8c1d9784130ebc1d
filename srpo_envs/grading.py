"""Answer extraction and time-bounded math grading with math-verify.

math-verify gives real LaTeX equivalence (``\\frac{14}{3}`` vs ``14/3``, intervals, tuples, degrees), but
its own timeout uses ``signal.alarm``, which only works in a process's main thread, and sympy can
spin on adversarial input (``10**10**10``). So grading runs in small worker processes: each
answer gets a hard wall-clock bound (default 2 s) counted from the moment it is handed to a
*ready* worker; a worker that overruns is killed, a pre-started spare takes the next answer while
a replacement starts in the background (so no answer waits for, or is charged with, a worker's
start-up), and the answer that overran is scored wrong. The pool works the same when called from
threads or other processes.

Workers start as ``python -I <file>`` from the filesystem root, so nothing in the caller's working
directory or ``PYTHONPATH`` is imported (a stray ``math_verify.py`` there used to run). A worker
that fails - cannot start, crashes, answers with an error - is counted
(``grading/worker_failures`` in :meth:`Grader.stats`) and raises :class:`GraderError` after one
retry: a broken grader must never look like a wrong answer.

Cheap cases never leave the calling process: plain numbers compare exactly (as fractions), and
answers with stacked exponents are compared as normalised strings instead of being evaluated.
Answer extraction is linear in the response length (one pass over the braces).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 2.0
#: Extracted answers longer than this are not graded (no real answer is that long).
MAX_ANSWER_CHARS = 512

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_OPEN_RE = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE_RE = re.compile(r"</answer>", re.IGNORECASE)
_BRACE_RE = re.compile(r"[{}]")
_NUMBER_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)$")
#: An exponent that itself holds an exponent (``10**10**10``, ``2^{2^{22}}``, ``10^10^10``).
_POWER_TOWER_RE = re.compile(r"(\*\*|\^)\s*[\w.]+\s*(\*\*|\^)|\^\s*\{[^{}]*(\^|\*\*)")


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each ``{`` -> position of its matching ``}``, in one pass (unclosed ones absent).

    A brace right after a backslash (``\\{``) is literal and ignored. Scanning from each ``\\boxed{``
    to its end separately was quadratic: 8 KB of repeated unclosed ``\\boxed{`` took 0.37 s.
    """
    match: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_RE.finditer(text):
        i = m.start()
        if i and text[i - 1] == "\\":
            continue
        if m.group() == "{":
            stack.append(i)
        elif stack:
            match[stack.pop()] = i
    return match


def _last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` pair (pairs taken left to right, no nesting).

    Two forward searches that never rescan text: a regex ``<answer>(.*?)</answer>`` re-scans the
    rest of the text from every unclosed ``<answer>``, which is quadratic.
    """
    last, pos = None, 0
    while (op := _ANSWER_OPEN_RE.search(text, pos)) is not None:
        close = _ANSWER_CLOSE_RE.search(text, op.end())
        if close is None:
            break
        last, pos = text[op.end() : close.start()], close.end()
    return last


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last complete ``\\boxed{...}``, else the last ``<answer>`` tag.

    Returns ``None`` when the response has no complete answer (including an unbalanced ``\\boxed{``);
    envs treat that as a format error. Linear time in ``len(text)``.
    """
    if not isinstance(text, str) or not text:
        return None
    boxed = None
    if "\\" in text:
        starts = [m.end() for m in _BOX_RE.finditer(text)]
        if starts:
            match = _matching_braces(text)
            for start in reversed(starts):  # the last box that closes
                end = match.get(start - 1)
                if end is not None:
                    boxed = text[start:end]
                    break
    if boxed is not None:
        boxed = boxed.strip()
        return boxed or None
    inner = _last_answer_tag(text)
    if inner is not None:
        inner = inner.strip()
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
    """math-verify equivalence, run *in the calling process* (what each worker runs).

    Callers should use :func:`grade`, which bounds time from outside; this is the worker's code,
    re-exported so it can be called directly where a hard bound is not needed.
    """
    from srpo_envs._grader_worker import verify_answers as _verify

    return _verify(pred, gold, timeout_s)


class GraderError(RuntimeError):
    """A grader worker failed (could not start, crashed, or raised): the answer was *not* graded."""


#: The worker program, run by path in isolated mode (never ``-m``: that puts the cwd on sys.path).
_WORKER_FILE = str(Path(__file__).resolve().with_name("_grader_worker.py"))


class _Worker:
    """One ``python -I _grader_worker.py`` process speaking JSON lines over pipes.

    A plain subprocess (not multiprocessing) so the user's ``__main__`` is never re-imported and a
    hung worker can be killed without touching the others. Its stderr goes to a temp file whose
    tail is quoted when the worker fails.
    """

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", _WORKER_FILE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=os.path.abspath(os.sep),  # a fixed directory, never the caller's
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._buf = b""
        self.ready = False
        self.last_imports: int | None = None
        self._failure: GraderError | None = None

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker; ``None`` once ``deadline`` passes. Raises if it exits."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = max(0.0, deadline - time.monotonic())  # 0: one non-blocking poll
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise GraderError(f"grader worker exited (code {self.proc.wait()}){self._stderr_tail()}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _reply(self, line: bytes) -> dict[str, Any]:
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise GraderError(f"grader worker sent {line[:200]!r}, not a JSON object")
        if reply.get("error") is not None:
            raise GraderError(f"grader worker error: {reply['error']}")
        return reply

    def _check_ready(self, deadline: float) -> bool:
        """Read the ready line if it arrives by ``deadline``: True once ready, False if not yet.

        Raises ``GraderError`` if the worker failed to start (and again on every later call).
        """
        if self.ready:
            return True
        if self._failure is not None:
            raise self._failure
        try:
            line = self._read_line(deadline)
            if line is None:
                return False
            if self._reply(line).get("ready") is not True:
                raise GraderError(f"grader worker did not start: {line[:300]!r}")
        except GraderError as exc:
            self._failure = exc
            raise
        self.ready = True
        return True

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker has imported math-verify; ``GraderError`` if it fails or takes longer."""
        if not self._check_ready(time.monotonic() + timeout_s):
            raise GraderError(f"grader worker not ready after {timeout_s:.0f}s{self._stderr_tail()}")

    def poll_ready(self) -> bool:
        """Non-blocking check: True if ready - or if it failed, so that :meth:`wait_ready` says so at once."""
        try:
            return self._check_ready(time.monotonic())
        except GraderError:
            return True

    def ask(self, pred: str, gold: str, timeout_s: float) -> bool | None:
        """The verdict, or ``None`` if the worker overran ``timeout_s`` (then it is dead).

        The clock starts when the question is sent; call :meth:`wait_ready` first.
        """
        assert self.proc.stdin is not None and self.ready
        line = json.dumps({"pred": pred, "gold": gold, "timeout": timeout_s}) + "\n"
        self.proc.stdin.write(line.encode("utf-8"))
        self.proc.stdin.flush()
        reply_line = self._read_line(time.monotonic() + timeout_s)
        if reply_line is None:
            self.kill()
            return None
        reply = self._reply(reply_line)
        if not isinstance(reply.get("ok"), bool):
            raise GraderError(f"grader worker sent {reply_line[:200]!r} without a boolean 'ok'")
        # modules the answer imported: start-up work that leaked onto its clock (the warm-up's job)
        self.last_imports = reply.get("imports")
        return reply["ok"]

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            tail = self._stderr.read()[-1500:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends: {tail}" if tail else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


class Grader:
    """Worker processes that grade with a hard per-answer time bound and survive hung workers.

    At most ``workers`` answers are graded at once, and ``spares`` more processes are kept
    started, so when a worker is killed (an answer overran ``timeout_s``) or fails, the next
    answer goes to a worker that is already up while a replacement starts in the background.
    Start-up (importing sympy and math-verify, ~1 s) is thus never on an answer's clock; only
    the first answer of a fresh grader waits for it, unless :meth:`warm_up` ran. ``startup_s``
    bounds how long a worker may take to start before it counts as failed.

    Thread-safe. Failures are counted in :meth:`stats` and raise :class:`GraderError` (after one
    retry on another worker); timeouts are counted and grade as not equivalent.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        startup_s: float = 20.0,
        spares: int = 1,
    ) -> None:
        if workers < 1 or spares < 0 or not timeout_s > 0 or not startup_s > 0:
            raise ValueError("need workers >= 1, spares >= 0, timeout_s > 0 and startup_s > 0")
        self.workers = workers
        self.spares = spares
        self.timeout_s = timeout_s
        self.startup_s = startup_s
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # started (maybe still importing), not in use; oldest first
        self._alive = 0  # idle + in use
        self._closed = False
        self.answers = 0
        self.timeouts = 0
        self.worker_failures = 0
        self.worker_starts = 0
        self.startup_waits = 0  # answers that had to wait for a worker to finish starting
        self.startup_wait_s = 0.0

    def stats(self) -> dict[str, float]:
        """Counters under metric names (``grading/...``) for a trainer's or evaluator's log."""
        with self._lock:
            return {
                "grading/answers": self.answers,
                "grading/timeouts": self.timeouts,
                "grading/worker_failures": self.worker_failures,
                "grading/worker_starts": self.worker_starts,
                "grading/startup_waits": self.startup_waits,
                "grading/startup_wait_s": round(self.startup_wait_s, 3),
            }

    def _top_up(self) -> None:
        """Start processes until ``workers + spares`` are alive. Call with ``_lock`` held."""
        while not self._closed and self._alive < self.workers + self.spares:
            self._idle.append(_Worker())  # Popen returns at once; the import runs in the background
            self._alive += 1
            self.worker_starts += 1

    def _borrow(self) -> _Worker:
        """A worker for one answer: a ready idle one if any, else one that is starting (waited for,
        off the answer's clock, and counted in ``startup_waits``). Spares are started when the answer
        is done (:meth:`_give_back`), so their start-up never competes with it for CPU."""
        with self._lock:
            if self._closed:
                raise GraderError("grader is closed")
            worker = next((w for w in self._idle if w.poll_ready()), None)
            if worker is not None:
                self._idle.remove(worker)
            elif self._idle:
                worker = self._idle.pop(0)  # the one that started first
            else:  # cold pool: start just this one now; spares start once it is up (no contention)
                worker = _Worker()
                self._alive += 1
                self.worker_starts += 1
        if not worker.ready:
            t0 = time.monotonic()
            try:
                worker.wait_ready(self.startup_s)
            except GraderError:
                self._discard(worker)
                raise
            finally:
                with self._lock:
                    self.startup_waits += 1
                    self.startup_wait_s += time.monotonic() - t0
        return worker

    def _give_back(self, worker: _Worker) -> None:
        if not worker.alive():
            self._discard(worker)
            return
        with self._lock:
            if self._closed:
                worker.kill()
                self._alive -= 1
            else:
                self._idle.append(worker)
                self._top_up()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._alive -= 1
            self._top_up()  # the replacement starts now, off every answer's clock

    def verify(self, pred: str, gold: str) -> bool:
        """math-verify equivalence of two answer strings; ``False`` if it overran ``timeout_s``.

        Raises :class:`GraderError` when workers fail twice in a row (counted in :meth:`stats`).
        """
        failure: GraderError | None = None
        with self._slots:
            for _ in range(2):  # one retry: a single crashed worker should not fail the answer
                try:
                    worker = self._borrow()
                except GraderError as exc:
                    with self._lock:
                        self.worker_failures += 1
                    failure = exc
                    continue
                try:
                    verdict = worker.ask(pred, gold, self.timeout_s)
                except (GraderError, OSError) as exc:
                    self._discard(worker)
                    with self._lock:
                        self.worker_failures += 1
                    failure = exc if isinstance(exc, GraderError) else GraderError(f"grader worker: {exc}")
                    continue
                self._give_back(worker)
                with self._lock:
                    self.answers += 1
                    if verdict is None:
                        self.timeouts += 1
                return bool(verdict)
        assert failure is not None
        raise GraderError(f"grading failed twice ({pred[:40]!r} vs {gold[:40]!r}): {failure}") from failure

    def warm_up(self) -> None:
        """Start every worker and spare now and wait until they are ready (no answer waits later)."""
        with self._lock:
            self._top_up()
            idle = list(self._idle)
        for worker in idle:
            worker.wait_ready(self.startup_s)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
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


def grading_stats() -> dict[str, float]:
    """:meth:`Grader.stats` of the shared grader that :func:`grade` uses (all zero before its first use)."""
    with _default_lock:
        grader = _default_grader
    return grader.stats() if grader is not None else Grader(workers=1).stats()


@lru_cache(maxsize=65536)
def grade(pred: str | None, gold: str) -> bool:
    """Is the extracted answer ``pred`` equivalent to the reference ``gold``? Bounded in time.

    Numbers compare exactly; stacked exponents compare as strings (never evaluated); everything else
    goes through math-verify in the worker pool (``DEFAULT_TIMEOUT_S`` per answer). Raises
    :class:`GraderError` if the workers fail (not cached: a later call tries again).
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
