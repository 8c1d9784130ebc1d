"""Ray must not take the fatal-signal handlers away from an in-process JVM (BM25 search).

ray.init() replaced the JVM's SIGSEGV/SIGBUS/SIGILL/SIGFPE handlers and ray.shutdown() reset SIGSEGV
to the default action; the JVM's next implicit null check then killed the test run ("Segmentation
fault", no trace) in whichever BM25 test came after the Ray tests.
"""

from __future__ import annotations

import signal
import sys

import pytest

from srpo_common.signals import FATAL_SIGNALS, save_handlers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaction layout checked on Linux")


def _handler_addresses() -> dict[int, int]:
    return {sig: int.from_bytes(raw[:8], "little") for sig, raw in save_handlers().items()}


def test_ray_init_and_shutdown_keep_the_jvm_signal_handlers() -> None:
    pytest.importorskip("pyserini")
    ray = pytest.importorskip("ray")
    from agents.ray_rollout import ensure_ray, shutdown_ray
    from srpo_envs.retrievers.jvm import ensure_jvm

    ensure_jvm()
    import jnius  # noqa: F401  (starts the JVM if ensure_jvm did not)

    jvm = _handler_addresses()
    assert set(jvm) == {int(s) for s in FATAL_SIGNALS}
    assert jvm[int(signal.SIGSEGV)] not in (0, 1), "the JVM installs its own SIGSEGV handler"
    if ray.is_initialized():
        shutdown_ray()
        assert _handler_addresses() == jvm
    ensure_ray(num_cpus=1)
    assert _handler_addresses() == jvm
    shutdown_ray()
    assert _handler_addresses() == jvm
