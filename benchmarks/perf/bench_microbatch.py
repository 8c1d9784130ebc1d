"""Peak memory and time of one policy update with and without micro-batching.

Rolls out one batch with the shipped warm start, then runs the trainer's update once per setting in a
fresh subprocess (so each peak RSS is its own) and prints the update time and the RSS the update
added. With ``max_tokens_per_microbatch`` the backward runs per event-atomic micro-batch, so the
activation memory follows the micro-batch, not the minibatch; the gradient is the same (see
``tests/learners/test_learners_update.py``).

    python -m benchmarks.perf.bench_microbatch [--tasks 16 --group-size 8 --budgets none,2048,512]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-columns-sft"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _one(budget: int | None, tasks: int, group_size: int, threads: int) -> dict[str, float]:
    import torch

    from learners.trainer import TrainConfig, Trainer

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            model=str(MODEL),
            out_dir=tmp,
            env_id="MathVerify-v0",
            env_kwargs={"dataset": "procedural-columns", "difficulty": [2, 3]},
            tasks_per_iter=tasks,
            group_size=group_size,
            epochs=1,
            rows_per_batch=100_000,  # one minibatch: the worst case for memory
            forward_rows=100_000,
            max_tokens_per_microbatch=budget,
            eval_every=0,
            save_every=0,
        )
        trainer = Trainer(cfg, log=None)
        batch = trainer.collector.collect(list(range(tasks)), group_size, seed=0)
        before = _peak_rss_mb()
        t0 = time.perf_counter()
        stats = trainer.update(batch, iteration=1)
        seconds = time.perf_counter() - t0
    return {
        "rows": float(len(batch.rows)),
        "update_s": seconds,
        "peak_rss_mb": _peak_rss_mb(),
        "update_added_mb": _peak_rss_mb() - before,
        "loss": stats["actor/loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--budgets", default="none,2048,512", help="comma-separated token budgets; none = off")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        budget = None if args.child == "none" else int(args.child)
        print(json.dumps(_one(budget, args.tasks, args.group_size, args.threads)))
        return
    print(f"{'budget':>8} {'rows':>6} {'update s':>9} {'peak RSS MB':>12} {'update +MB':>11} {'loss':>12}")
    for b in args.budgets.split(","):
        cmd = [sys.executable, "-m", "benchmarks.perf.bench_microbatch", "--child", b.strip()]
        cmd += [
            "--tasks",
            str(args.tasks),
            "--group-size",
            str(args.group_size),
            "--threads",
            str(args.threads),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        print(
            f"{b:>8} {r['rows']:>6.0f} {r['update_s']:>9.2f} {r['peak_rss_mb']:>12.0f} "
            f"{r['update_added_mb']:>11.0f} {r['loss']:>12.6f}"
        )


if __name__ == "__main__":
    main()
