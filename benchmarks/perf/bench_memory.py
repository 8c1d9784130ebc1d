"""Peak memory of a whole job, every process it starts included: wall time, largest RSS, summed PSS.

    python -m benchmarks.perf.bench_memory -- srpo bench quick --out /tmp/quick
    python -m benchmarks.perf.bench_memory --interval 0.5 -- srpo bench quick --workers 0 --out /tmp/quick0

Why not ``/usr/bin/time -v``: its "maximum resident set size" is the largest of the command and the
children it waited for, and Ray's workers are children of Ray's raylet, not of the command, so a job
that trains in Ray tasks looks as small as its driver. This runs the command, samples every
``--interval`` seconds the command's process tree plus the Ray processes (``ray::`` workers, raylet, GCS)
started since the command was (an older Ray cluster is another job's), and prints: the wall time, the
largest single process's RSS, and the peak over samples of the summed
PSS (proportional set size: shared library pages split between the processes that map them, so the
sum is what the job really holds; summed RSS counts torch's libraries once per process) with the
biggest processes at that peak. Sampling can miss a spike shorter than the interval. Exit status: the
command's. Needs ``psutil`` (installed with the project).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from typing import Any

GB = 1024**3


def _job_processes(root: Any, psutil: Any) -> list[Any]:
    """The command's process tree plus the Ray processes started since the command was (a Ray cluster
    that was already running belongs to another job: counting it once made a 400 MB test job weigh 1.3 GB
    while a comparison trained beside it)."""
    procs = [root]
    with contextlib.suppress(psutil.Error):  # the command exited between the poll and here
        procs += root.children(recursive=True)
    seen = {p.pid for p in procs}
    since = root.create_time()
    for p in psutil.process_iter(["cmdline", "create_time"]):
        cmd = " ".join(p.info["cmdline"] or [])
        is_ray = "ray::" in cmd or "/ray/" in cmd or "raylet" in cmd or "gcs_server" in cmd
        if p.pid not in seen and is_ray and (p.info["create_time"] or 0.0) >= since:
            procs.append(p)
    return procs


def measure(command: list[str], interval: float = 1.0) -> dict[str, Any]:
    """Run ``command`` to the end; its wall time, return code and memory peaks (see the module doc)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(command)
    root = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    at_peak: list[tuple[int, str]] = []
    while proc.poll() is None:
        sample: list[tuple[int, int, str]] = []
        for p in _job_processes(root, psutil):
            try:
                mem = p.memory_full_info()
                sample.append((mem.rss, mem.pss, " ".join(p.cmdline()[:3])[:90]))
            except psutil.Error:  # exited (or not ours to read) since it was listed
                continue
        peak_rss = max([peak_rss, *(rss for rss, _, _ in sample)])
        pss = sum(p for _, p, _ in sample)
        if pss > peak_pss:
            peak_pss = pss
            at_peak = sorted(((p, name) for _, p, name in sample), reverse=True)
        time.sleep(interval)
    return {
        "returncode": proc.returncode,
        "wall_s": time.perf_counter() - start,
        "largest_rss_gb": peak_rss / GB,
        "peak_summed_pss_gb": peak_pss / GB,
        "at_peak": [(p / GB, name) for p, name in at_peak[:8]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the job, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    out = measure(command, args.interval)
    print(
        f"wall {out['wall_s']:.0f} s | largest process {out['largest_rss_gb']:.2f} GB RSS | "
        f"all processes {out['peak_summed_pss_gb']:.2f} GB PSS at the peak | rc {out['returncode']}"
    )
    for gb, name in out["at_peak"]:
        print(f"  {gb:5.2f} GB PSS  {name}")
    return int(out["returncode"])


if __name__ == "__main__":
    sys.exit(main())
