"""Wall time per iteration, synchronous vs ``--max-staleness N``, measured here and projected to GPU ratios.

Two parts, one table each:

1. **Measured** on this machine: quick-columns-routed's SRPO update (the bundled warm start, its
   suite's training settings) for ``--iterations`` iterations, synchronously (torch's default threads:
   both phases use every core) and with ``N = 1, 2`` (the generator thread on ``--gen-threads`` cores,
   the learner on the rest). Per iteration: wall time, the generator's time per batch (``gen``), the
   learner's update time (``update``) and how long the learner waited for its batch (``wait``), the
   iterations after the first (which starts the pipeline and has nothing to overlap with).
2. **Projected** to GPU-like ratios of generation to update time (3:1, 1:1, 1:3 by default): the real
   :class:`learners.async_rollout.RolloutPipeline` (threads, hand-over, the real weight snapshot and
   load of the model measured in part 1) with each phase's compute replaced by a wait of the phase's
   length, the way a GPU kernel or a remote engine occupies neither the CPU nor the GIL. The phase
   lengths keep part 1's synchronous per-iteration total (one core each: ``gen + update``) and split
   it by the ratio. Each mode's wall time per iteration is compared with the ideal
   ``max(gen, update)`` (generation and update fully overlapped) and the synchronous ``gen + update``.

    python -m benchmarks.perf.bench_async [--iterations 6] [--staleness 1,2] [--ratios 3:1,1:1,1:3]
        [--tasks-per-iter 16] [--skip-measured --project-seconds S] [--json out.json]

On a 2-core CPU the measured overlap is bounded by what the two threads share: Python's GIL (the
tiny model's forward is short, so interpreter time is a large share), memory bandwidth, and the
other processes on the machine. The projection isolates the pipeline's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SUITE = "quick-columns-routed"


# --------------------------------------------------------------------------------------------------
# part 1: measured
# --------------------------------------------------------------------------------------------------


def _train_config(out: str, n: int, iterations: int, tasks: int | None, seed: int) -> Any:
    from benchmarks.presets import QUICK_SETTINGS, TRAINING_ENVS
    from learners.trainer import TrainConfig

    env = TRAINING_ENVS[SUITE]
    train = dict(QUICK_SETTINGS[SUITE]["train"])
    train.update(iterations=iterations, eval_every=0, save_every=0)
    if tasks is not None:
        train["tasks_per_iter"] = tasks
    return TrainConfig(
        algo="srpo",
        model=str(env.bundled_model),
        out_dir=out,
        env_id=env.env_id,
        env_kwargs={"workflow": env.workflow, **env.env_kwargs},
        seed=seed,
        max_staleness=n,
        **train,
    )


def train_stamped(trainer: Any) -> tuple[list[dict[str, Any]], list[float]]:
    """``trainer.train()`` with the time each iteration's metrics row was written: the history, and the
    stamps whose differences are the wall seconds per iteration."""
    stamps: list[float] = []
    append = trainer.run_state.append_metrics

    def stamped(record: dict[str, Any]) -> None:
        stamps.append(time.perf_counter())
        append(record)

    trainer.run_state.append_metrics = stamped
    return trainer.train(), stamps


def measure(n: int, iterations: int, tasks: int | None, seed: int, sync_threads: int) -> dict[str, Any]:
    """One run with ``max_staleness = n``: per-iteration wall and phase times (after the first)."""
    import sys

    from learners.trainer import Trainer

    print(f"measuring max_staleness={n} with {sync_threads} learner thread(s) ...", file=sys.stderr, flush=True)

    torch.set_num_threads(sync_threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(_train_config(tmp, n, iterations, tasks, seed), log=None)
        t0 = time.perf_counter()
        history, stamps = train_stamped(trainer)
        total = time.perf_counter() - t0
        snapshot_s, load_s = _snapshot_costs(trainer)
    walls = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    rest = history[1:]

    def mean(key: str) -> float:
        vals = [float(h[key]) for h in rest if key in h]
        return statistics.fmean(vals) if vals else float("nan")

    return {
        "max_staleness": n,
        "iterations": iterations,
        "total_s": total,
        "wall_s": statistics.fmean(walls) if walls else float("nan"),
        "gen_s": mean("rollout_s"),
        "update_s": mean("update_s"),
        "wait_s": mean("rollout_wait_s") if n else 0.0,
        "snapshot_s": snapshot_s,
        "load_s": load_s,
        "staleness_mean": mean("rollout/staleness_mean") if n else 0.0,
    }


def _snapshot_costs(trainer: Any, repeats: int = 5) -> tuple[float, float]:
    """Median seconds to snapshot the learner's weights and to load them into a copy (the pipeline's
    own work per iteration)."""
    from agents.ray_rollout import load_model_states

    copy = trainer.scale.policy_copy()
    snap, load = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()  # what the learner publishes: a clone of every distinct model's weights
        states = {m: {k: v.detach().clone() for k, v in sd.items()} for m, sd in trainer.scale.model_states().items()}
        t1 = time.perf_counter()
        load_model_states(copy, states)
        t2 = time.perf_counter()
        snap.append(t1 - t0)
        load.append(t2 - t1)
    return statistics.median(snap), statistics.median(load)


# --------------------------------------------------------------------------------------------------
# part 2: projected
# --------------------------------------------------------------------------------------------------


def project(gen: float, update: float, n: int, iterations: int, overhead: tuple[float, float]) -> float:
    """Wall seconds per iteration (after the first) of ``iterations`` iterations with phases of ``gen``
    and ``update`` seconds that hold no CPU (a GPU or a remote engine), through the real pipeline
    (``n >= 1``) or in turn (``n = 0``). ``overhead``: the measured (snapshot, load) seconds, spent as
    real waits too (a device-to-device copy on a GPU)."""
    from learners.async_rollout import RolloutPipeline

    snap_s, load_s = overhead
    stamps: list[float] = []
    if n == 0:
        for _ in range(iterations):
            time.sleep(gen)
            time.sleep(update)
            stamps.append(time.perf_counter())
    else:
        pipe = RolloutPipeline(
            lambda it: time.sleep(gen),
            lambda done, snap: time.sleep(load_s),
            n,
            1,
            iterations,
            {0: None},
            gen_threads=None,
        )
        try:
            for it in range(1, iterations + 1):
                pipe.take(it)
                time.sleep(update)
                time.sleep(snap_s)
                pipe.publish(it, None)
                stamps.append(time.perf_counter())
        finally:
            pipe.close()
    walls = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    return statistics.fmean(walls)


def _ratio(text: str) -> tuple[float, float]:
    a, b = text.split(":")
    return float(a), float(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--staleness", default="1,2", help="the N >= 1 to run beside the synchronous loop")
    ap.add_argument("--ratios", default="3:1,1:1,1:3", help="generation:update ratios to project")
    ap.add_argument("--tasks-per-iter", type=int, default=None, help="default: the suite's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--project-seconds", type=float, default=None,
                    help="per-iteration total of the projection (default: the measured one-core gen + update)")
    ap.add_argument("--project-iterations", type=int, default=8)
    ap.add_argument("--project-wall", type=float, default=1.0,
                    help="seconds one projected iteration takes: every phase and cost is scaled to it and the "
                    "results scaled back (the shares of ideal do not depend on it)")
    ap.add_argument("--skip-measured", action="store_true", help="projection only, with --project-seconds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()  # fmt: skip
    levels = [int(s) for s in args.staleness.split(",") if s.strip()]
    out: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_before": os.getloadavg()[0],
    }

    overhead = (0.0, 0.0)
    total = args.project_seconds
    if not args.skip_measured:
        default_threads = torch.get_num_threads()
        rows = [measure(0, args.iterations, args.tasks_per_iter, args.seed, default_threads)]
        one_core = measure(0, args.iterations, args.tasks_per_iter, args.seed, 1)
        one_core["mode"] = "sync, 1 thread"
        rows[0]["mode"] = f"sync, {default_threads} threads"
        rows.append(one_core)
        for n in levels:
            torch.set_num_threads(default_threads)
            r = measure(n, args.iterations, args.tasks_per_iter, args.seed, max(1, default_threads - 1))
            r["mode"] = f"N={n} (gen 1 + learn {max(1, default_threads - 1)} threads)"
            rows.append(r)
        torch.set_num_threads(default_threads)
        out["measured"] = rows
        base = rows[0]["wall_s"]
        ideal = max(one_core["gen_s"], one_core["update_s"])
        print(f"\nMeasured: {SUITE} SRPO, {args.iterations} iterations (means over iterations 2..), "
              f"{os.cpu_count()} cores")  # fmt: skip
        print(f"{'mode':34s} {'wall/it':>8s} {'gen':>7s} {'update':>7s} {'wait':>7s} {'speedup':>8s} {'stale':>6s}")
        for r in rows:
            print(
                f"{r['mode']:34s} {r['wall_s']:8.2f} {r['gen_s']:7.2f} {r['update_s']:7.2f} {r['wait_s']:7.2f} "
                f"{base / r['wall_s']:7.2f}x {r['staleness_mean']:6.2f}"
            )
        print(f"ideal max(gen, update) on one core each: {ideal:.2f} s/it; snapshot {rows[-1]['snapshot_s'] * 1e3:.1f} ms, "
              f"load into the copy {rows[-1]['load_s'] * 1e3:.1f} ms (one thread); load average before/after "
              f"{out['loadavg_before']:.1f}/{os.getloadavg()[0]:.1f} (other processes share the cores)")  # fmt: skip
        # the pipeline's own costs as it runs them: one learner thread (the last async run's)
        overhead = (rows[-1]["snapshot_s"], rows[-1]["load_s"])
        if total is None:
            total = one_core["gen_s"] + one_core["update_s"]
    if total is None:
        ap.error("--skip-measured needs --project-seconds")

    proj = []
    print(f"\nProjected: phases that hold no CPU (GPU-like), {total:.2f} s of gen + update per iteration, "
          f"the real pipeline and snapshot/load costs")  # fmt: skip
    head = f"{'gen:update':10s} {'gen':>6s} {'update':>6s} {'ideal':>6s} {'sync':>6s}"
    for n in levels:
        head += f" {f'N={n}':>6s} {'%ideal':>7s}"
    print(head + f" {'sync %ideal':>11s}")
    f = args.project_wall / total  # run at this scale, report at the measured one
    small = (overhead[0] * f, overhead[1] * f)
    for text in args.ratios.split(","):
        a, b = _ratio(text)
        gen, update = total * a / (a + b), total * b / (a + b)
        ideal = max(gen, update)
        sync = project(gen * f, update * f, 0, args.project_iterations, small) / f
        row = {"ratio": text, "gen_s": gen, "update_s": update, "ideal_s": ideal, "sync_s": sync}
        line = f"{text:10s} {gen:6.2f} {update:6.2f} {ideal:6.2f} {sync:6.2f}"
        for n in levels:
            wall = project(gen * f, update * f, n, args.project_iterations, small) / f
            row[f"n{n}_s"] = wall
            line += f" {wall:6.2f} {100 * ideal / wall:6.1f}%"
        print(line + f" {100 * ideal / sync:10.1f}%")
        proj.append(row)
    out["projected"] = proj
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
