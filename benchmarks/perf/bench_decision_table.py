"""What a decision costs: the wall time of the 8-algorithm x N-seed table on a suite, from measured runs.

    python -m benchmarks.perf.bench_decision_table                          # quick-columns-routed, 2 runs
    python -m benchmarks.perf.bench_decision_table --eval-limit 128 --eval-k 4 --chunk-sizes 16,64

What runs: the start model's held-out evaluation and ``--runs`` (variant, seed) jobs of
:func:`benchmarks.compare.train_and_evaluate` with the suite's ``bench quick`` training settings and the
given evaluation (default: the whole held-out split, k=4), each timed (train and eval apart, wall and
process CPU). The figure printed is the projected wall time of ``--algorithms`` x ``--seeds`` runs plus
one start-model evaluation per seed, one run after another on this machine, beside the 45-minute target
of issue 27; ``--chunk-sizes`` also times the start evaluation with other generation batch sizes
(problems per collect call; samples do not depend on it). Timings on a shared CPU are noisy: the
process CPU time is the steadier number, and the load average is printed with every line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

TARGET_MIN = 45.0


def _load() -> str:
    try:
        return f"load {os.getloadavg()[0]:.1f}"
    except OSError:
        return "load ?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="quick-columns-routed")
    ap.add_argument("--eval-limit", type=int, default=128, help="problems per dataset (128: the whole split)")
    ap.add_argument("--eval-k", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2, help="training runs timed (srpo, grpo, ...)")
    ap.add_argument("--algorithms", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--chunk-sizes", default="16", help="generation batch sizes timed for the start eval")
    args = ap.parse_args()

    import torch

    from agents.hf import HFPolicy
    from agents.policy import PolicyMap, SamplingParams
    from benchmarks import presets
    from benchmarks.compare import CompareConfig, train_and_evaluate
    from benchmarks.evaluate import evaluate

    env = presets.TRAINING_ENVS[args.suite]
    train = dict(presets.QUICK_SETTINGS[args.suite]["train"])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48)
    policies = PolicyMap.shared(HFPolicy(str(env.bundled_model)))
    start_s = {}
    for chunk in [int(c) for c in args.chunk_sizes.split(",")]:
        t0, c0 = time.perf_counter(), time.process_time()
        res = evaluate(policies, args.suite, env.workflow, args.eval_k, sampling=sampling, limit=args.eval_limit,
                       seed=0, progress=False, chunk_size=chunk)
        start_s[chunk] = time.perf_counter() - t0
        print(f"start eval, chunk {chunk}: {start_s[chunk]:.1f}s wall, {time.process_time() - c0:.1f}s CPU, "
              f"{len(res.samples)} samples ({_load()}, {torch.get_num_threads()} threads)", flush=True)
    algos = list(presets.BASELINES)
    per_run = []
    with tempfile.TemporaryDirectory(prefix="bench_decision_") as tmp:
        cfg = CompareConfig(model=str(env.bundled_model), out_dir=tmp, suite=args.suite, workflow=env.workflow,
                            env_id=env.env_id, env_kwargs=dict(env.env_kwargs), train=train,
                            eval_k=args.eval_k, eval_limit=args.eval_limit)
        for i in range(args.runs):
            name = algos[i % len(algos)]
            t0 = time.perf_counter()
            out = train_and_evaluate(cfg, name, presets.BASELINES[name], seed=i)
            wall = time.perf_counter() - t0
            per_run.append(wall)
            print(f"{name} seed {i}: train {out.run['train_s']:.1f}s + eval {out.run['eval_s']:.1f}s = "
                  f"{wall:.1f}s ({_load()})", flush=True)
    run_s = statistics.median(per_run)
    start = min(start_s.values())
    total = args.algorithms * args.seeds * run_s + args.seeds * start
    print(f"projected {args.algorithms} algorithms x {args.seeds} seeds on {args.suite} "
          f"(eval {args.eval_limit}/dataset x k={args.eval_k}): {total / 60:.1f} min "
          f"(target < {TARGET_MIN:.0f} min: {'met' if total / 60 < TARGET_MIN else 'NOT met'}); "
          f"median run {run_s:.1f}s, start eval {start:.1f}s per seed")


if __name__ == "__main__":
    main()
