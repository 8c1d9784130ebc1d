"""Keep an embedded JVM's fatal-signal handlers when another runtime (Ray) installs its own.

A JVM (pyserini's Lucene, through pyjnius) uses SIGSEGV/SIGBUS/SIGILL/SIGFPE *in normal operation*
(implicit null checks, safepoint polls) and installs C-level handlers for them. ``ray.init()``
replaces those handlers with its own and ``ray.shutdown()`` resets SIGSEGV to the default action, so
the next trap the JVM takes kills the whole process with "Segmentation fault" and no Java or Python
trace (seen: the test suite died in BM25 tests that ran after the Ray tests). Python's ``signal``
module cannot see C-level handlers, so this saves and restores them with ``sigaction`` directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from collections.abc import Iterator

#: The signals a HotSpot JVM handles itself; all four are reset or replaced by ray.init/shutdown.
FATAL_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
_SIGACTION_BYTES = 512  # larger than ``struct sigaction`` on every Linux/macOS ABI


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith(("linux", "darwin")):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no C library to talk to
        return None


def save_handlers(signals: tuple[int, ...] = FATAL_SIGNALS) -> dict[int, bytes]:
    """The raw ``struct sigaction`` of each signal (empty where ``sigaction`` is unavailable)."""
    libc = _libc()
    if libc is None:
        return {}
    saved: dict[int, bytes] = {}
    for sig in signals:
        buf = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if libc.sigaction(int(sig), None, buf) == 0:
            saved[int(sig)] = buf.raw
    return saved


def restore_handlers(saved: dict[int, bytes]) -> None:
    """Reinstall handlers returned by :func:`save_handlers`."""
    libc = _libc()
    if libc is None:
        return
    for sig, raw in saved.items():
        buf = ctypes.create_string_buffer(raw, _SIGACTION_BYTES)
        if libc.sigaction(sig, buf, None) != 0:  # pragma: no cover - only invalid signals fail
            raise OSError(ctypes.get_errno(), f"sigaction({sig}) failed")


@contextlib.contextmanager
def preserve_fatal_signal_handlers() -> Iterator[None]:
    """Run the body (e.g. ``ray.init()`` or ``ray.shutdown()``) and put the fatal-signal handlers back."""
    saved = save_handlers()
    try:
        yield
    finally:
        restore_handlers(saved)
