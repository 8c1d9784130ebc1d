"""What a decision costs: the wall time of the 8-algorithm x N-seed table on a suite, from measured jobs.

    python -m benchmarks.perf.bench_decision_table                       # quick-columns-routed, 2 workers
    python -m benchmarks.perf.bench_decision_table --workers 1 --algorithms srpo,mappo

What runs: the jobs of ``srpo bench compare`` (:func:`benchmarks.compare._jobs`, the same Ray pool of
``--workers`` processes with one share of the cores each): one start-model evaluation per worker (as in
the real table, where they are every worker's first jobs and the runs find warm workers: a cold worker's
first run was ~8% slower), then one training run of each of ``--algorithms`` (default: all eight) with the suite's ``bench quick``
training settings and the decision evaluation (default: the whole held-out split, k=4), side by side
as in the real table, so each job's time includes what its neighbour costs it. The figure printed is
the projected wall time of ``--algorithms`` x ``--seeds`` runs plus one start-model evaluation per
seed on ``--workers`` workers, beside the 45-minute target of issue 27; the time to start Ray and the
tables at the end are not in it (the real command's ``/usr/bin/time`` is the final word). Timings on a
shared CPU are noisy: the load average is printed with every line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace

TARGET_MIN = 45.0


def _load() -> str:
    try:
        return f"load {os.getloadavg()[0]:.1f}"
    except OSError:
        return "load ?"


def main() -> None:
    from benchmarks import compare, presets

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="quick-columns-routed")
    ap.add_argument("--eval-limit", type=int, default=128, help="problems per dataset (128: the whole split)")
    ap.add_argument("--eval-k", type=int, default=4)
    ap.add_argument("--algorithms", default=",".join(presets.BASELINES), help="one run of each is timed")
    ap.add_argument("--seeds", type=int, default=10, help="seeds of the projected table")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="runs at a time (Ray workers)")
    args = ap.parse_args()

    env = presets.TRAINING_ENVS[args.suite]
    algos = [a for a in args.algorithms.split(",") if a]
    unknown = sorted(set(algos) - set(presets.BASELINES))
    if unknown:
        raise SystemExit(f"unknown algorithms {unknown}; known: {sorted(presets.BASELINES)}")
    with tempfile.TemporaryDirectory(prefix="bench_decision_") as tmp:
        cfg = compare.CompareConfig(
            model=str(env.bundled_model), out_dir=tmp, suite=args.suite, workflow=env.workflow,
            env_id=env.env_id, env_kwargs=dict(env.env_kwargs), variants={a: presets.BASELINES[a] for a in algos},
            seeds=(0,), train=dict(presets.QUICK_SETTINGS[args.suite]["train"]), eval_k=args.eval_k,
            eval_limit=args.eval_limit, workers=args.workers,
        )  # fmt: skip
        from agents.ray_rollout import ensure_ray, shutdown_ray

        ensure_ray(None, num_cpus=args.workers * compare.worker_threads(args.workers))
        t0 = time.perf_counter()
        # as in the real table, each worker's first job is a start evaluation (one eval seed per worker);
        # the runs then find warm workers, and their start evaluation is the cached one of seed 0
        starts = []
        for (_, seed), out in compare._jobs(
            replace(cfg, seeds=tuple(range(args.workers)), variants={}), print
        ):
            starts.append(float(out.run_info["runtime"]["seconds"]))
            print(
                f"start eval, eval seed {seed}: {starts[-1]:.1f}s, {len(out.samples)} samples ({_load()})",
                flush=True,
            )
        start_s, run_s = statistics.median(starts), {}
        for (name, _), out in compare._jobs(cfg, print):
            if name != "start":
                run_s[name] = out.run["train_s"] + out.run["eval_s"]
                print(
                    f"{name}: train {out.run['train_s']:.1f}s + eval {out.run['eval_s']:.1f}s ({_load()})",
                    flush=True,
                )
        wall = time.perf_counter() - t0
        shutdown_ray()
    busy = len(starts) * start_s + sum(run_s.values())
    total = args.seeds * (start_s + sum(run_s.values())) / max(1, args.workers)
    print(
        f"{len(run_s) + len(starts)} jobs on {args.workers} worker(s): {wall:.1f}s wall for {busy:.1f}s of job time "
        f"(pool efficiency {busy / max(wall, 1e-9) / max(1, args.workers):.2f})"
    )
    print(
        f"projected {len(run_s)} algorithms x {args.seeds} seeds on {args.suite} "
        f"(eval {args.eval_limit}/dataset x k={args.eval_k}) on {args.workers} worker(s): {total / 60:.1f} min "
        f"(target < {TARGET_MIN:.0f} min: {'met' if total / 60 < TARGET_MIN else 'NOT met'}); "
        f"start eval {start_s:.1f}s per seed, runs {', '.join(f'{a} {s:.0f}s' for a, s in run_s.items())}"
    )


if __name__ == "__main__":
    main()
