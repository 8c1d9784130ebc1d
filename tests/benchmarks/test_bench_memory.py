"""benchmarks.perf.bench_memory counts every process of a job, unlike ``/usr/bin/time``'s largest child."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.perf.bench_memory import measure


def test_memory_of_a_job_includes_its_children() -> None:
    """The parent holds ~150 MB, its child ~250 MB at the same time: the largest process is the child
    and the summed PSS covers both (a tool that saw only the parent would report ~150 MB)."""
    child = "import time; b = bytearray(250 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(2.5)"
    parent = (
        "import subprocess, sys, time; a = bytearray(150 * 2**20); a[::4096] = b'x' * len(a[::4096]); "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); p.wait()"
    )
    out = measure([sys.executable, "-c", parent], interval=0.2)
    assert out["returncode"] == 0
    assert 0.24 < out["largest_rss_gb"] < 0.5
    assert out["peak_summed_pss_gb"] > 0.38
    assert len(out["at_peak"]) >= 2


def test_a_ray_cluster_running_before_the_job_is_not_the_jobs() -> None:
    """A process that looks like a Ray worker (``ray::`` in its command line) but was running before the
    job started belongs to another job (a comparison training beside it) and is not counted."""
    hold = "import sys, time; b = bytearray(600 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    foreign = subprocess.Popen([sys.executable, "-c", hold, "ray::train_and_evaluate"])
    try:
        time.sleep(1.5)  # its 600 MB are resident before the job starts
        out = measure([sys.executable, "-c", "import time; a = bytearray(50 * 2**20); time.sleep(1.5)"], 0.2)
    finally:
        foreign.kill()
        foreign.wait()
    assert out["returncode"] == 0
    assert out["largest_rss_gb"] < 0.3, out
    assert out["peak_summed_pss_gb"] < 0.3, out
