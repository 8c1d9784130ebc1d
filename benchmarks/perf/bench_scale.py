"""Scale-out numbers on this machine: Ray rollout workers and the data-parallel learner.

Prints (and writes ``--out`` as JSON):

* rollout episodes/s in this process and with 1 and 2 Ray workers (every worker and the in-process
  run use ``--threads`` torch threads, so the comparison is per-core honest), plus Ray's
  per-iteration overhead in ms: the 1-worker wall time minus the in-process wall time of the same
  collection, and the time of one weight broadcast (``ray.put`` + every actor's ``load_state_dict``);
* learner rows/s of :meth:`learners.trainer.Trainer.update` on one fixed rollout batch with 1 and 2
  processes (``torchrun --standalone --nproc_per_node N``; gloo on CPU), each process with
  ``--threads`` torch threads.

On a 2-core machine two workers cannot beat one by much: the numbers show the overhead honestly.

    python -m benchmarks.perf.bench_scale --model agents/checkpoints/mini-columns-sft --iters 3
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV_ID = "ProcArith-v0"


def _env_kwargs() -> dict[str, Any]:
    return {"workflow": "proposers-aggregator", "dataset": "procedural-columns"}


def bench_rollout(model: str, tasks: int, group: int, iters: int, threads: int, max_new_tokens: int) -> dict:
    """Episodes/s in-process and with 1 and 2 Ray workers; Ray overhead per iteration and per broadcast."""
    import torch

    import srpo_envs
    from agents.policy import SamplingParams
    from agents.ray_rollout import HFPolicyFactory, RolloutWorkerPool, model_states
    from agents.rollout import RolloutCollector

    env_fn = functools.partial(srpo_envs.make, ENV_ID, **_env_kwargs())
    probe = env_fn()
    roles = tuple(sorted({probe.role_of(a) for a in probe.possible_agents}))
    factory = HFPolicyFactory(model, roles)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    seeds = list(range(iters))
    task_ids = list(range(tasks))
    episodes = tasks * group * iters
    out: dict[str, Any] = {"tasks": tasks, "group_size": group, "iterations": iters, "threads": threads}

    torch.set_num_threads(threads)
    local = RolloutCollector(env_fn, factory(), sampling)
    local.collect(task_ids, group, seed=999)  # warm-up
    t0 = time.perf_counter()
    for s in seeds:
        local.collect(task_ids, group, seed=s)
    local_s = time.perf_counter() - t0
    out["in_process_episodes_per_s"] = episodes / local_s

    from agents.ray_rollout import ensure_ray

    ensure_ray(num_cpus=2)
    try:
        for n in (1, 2):
            pool = RolloutWorkerPool(factory, n, torch_threads=threads, num_cpus=2 / n)
            collector = pool.collector(env_fn, sampling)
            collector.collect(task_ids, group, seed=999)
            t0 = time.perf_counter()
            for s in seeds:
                collector.collect(task_ids, group, seed=s)
            wall = time.perf_counter() - t0
            out[f"ray_{n}_workers_episodes_per_s"] = episodes / wall
            if n == 1:
                out["ray_overhead_ms_per_iteration"] = 1000 * (wall - local_s) / iters
                states = model_states(factory())
                t0 = time.perf_counter()
                for _ in range(3):
                    pool.load_weights(states, None)
                out["ray_weight_broadcast_ms"] = 1000 * (time.perf_counter() - t0) / 3
            pool.shutdown()
    finally:
        from agents.ray_rollout import shutdown_ray

        shutdown_ray()
    return out


def _learner_worker(model: str, rows_file: str, reps: int, threads: int, result_file: str) -> None:
    """Runs under torchrun: time ``Trainer.update`` on the saved batch (rank 0 writes the result)."""
    import torch

    from agents.rollout import RolloutBatch
    from agents.rows import load_rows
    from learners.trainer import TrainConfig, Trainer

    torch.set_num_threads(threads)
    cfg = TrainConfig(
        algo="srpo", model=model, env_id=ENV_ID, env_kwargs=_env_kwargs(), epochs=1, eval_every=0,
        save_every=0, out_dir=tempfile.mkdtemp(prefix="bench_scale_"), device="cpu",
    )  # fmt: skip
    trainer = Trainer(cfg, log=None)
    rows = load_rows(rows_file)

    def fresh() -> RolloutBatch:
        # stamp the rows with the learner's current version: older rows are refused as stale
        version = int(trainer.policies.policies[0].policy_version)
        return RolloutBatch(rows=[dataclasses.replace(r, policy_version=version) for r in rows], episodes=[])

    trainer.update(fresh(), 1)  # warm-up
    wall = 0.0
    for i in range(reps):
        batch = fresh()
        t0 = time.perf_counter()
        trainer.update(batch, 2 + i)
        wall += time.perf_counter() - t0
    if trainer.dist.is_main:
        Path(result_file).write_text(json.dumps({"rows_per_s": reps * len(batch.rows) / wall, "s": wall}))


def bench_learner(model: str, tasks: int, group: int, reps: int, threads: int, max_new_tokens: int) -> dict:
    """Learner rows/s with 1 and 2 torchrun processes on one fixed batch."""
    import srpo_envs
    from agents.policy import SamplingParams
    from agents.ray_rollout import HFPolicyFactory
    from agents.rollout import RolloutCollector
    from agents.rows import save_rows

    env_fn = functools.partial(srpo_envs.make, ENV_ID, **_env_kwargs())
    probe = env_fn()
    roles = tuple(sorted({probe.role_of(a) for a in probe.possible_agents}))
    collector = RolloutCollector(
        env_fn, HFPolicyFactory(model, roles)(), SamplingParams(max_new_tokens=max_new_tokens)
    )
    batch = collector.collect(list(range(tasks)), group, seed=0)
    out: dict[str, Any] = {"rows": len(batch.rows), "reps": reps, "threads_per_process": threads}
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = str(save_rows(batch.rows, Path(tmp) / "rows.jsonl"))
        for n in (1, 2):
            result = Path(tmp) / f"learner{n}.json"
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                "-m", "benchmarks.perf.bench_scale", "--learner-worker", model, rows_file, str(reps), str(threads),
                str(result),
            ]  # fmt: skip
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
            out[f"learner_{n}_processes_rows_per_s"] = json.loads(result.read_text())["rows_per_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--learner-worker":
        _learner_worker(argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="agents/checkpoints/mini-columns-sft")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker / process")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--skip-learner", action="store_true")
    ap.add_argument("--skip-rollout", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    if not args.skip_rollout:
        results["rollout"] = bench_rollout(
            args.model, args.tasks, args.group_size, args.iters, args.threads, args.max_new_tokens
        )
    if not args.skip_learner:
        results["learner"] = bench_learner(
            args.model, args.tasks, args.group_size, args.iters, args.threads, args.max_new_tokens
        )
    text = json.dumps(results, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
