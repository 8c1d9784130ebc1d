"""GPU smoke test (<= 8 minutes on one GPU): bf16 CUDA training of a tiny model with both backends.

For each backend (``hf``: the learner's own model generates; ``vllm``: a colocated vLLM engine
generates, weights are pushed into it after every update and truncated importance sampling corrects
the rollout/train mismatch) it runs a few SRPO iterations of :class:`learners.trainer.Trainer` with
``--device cuda --dtype bfloat16`` and prints generated tokens/s, peak GPU memory and the logged
mismatch (``rollout/logprob_abs_diff``, ``rollout/kl``). It imports on a CPU-only machine (nothing
touches CUDA before :func:`main`) and exits with a clear message when there is no GPU, or skips the
vLLM backend when vLLM is not installed.

    python -m benchmarks.perf.gpu_smoke --iterations 3
    python -m benchmarks.perf.gpu_smoke --model Qwen/Qwen2.5-0.5B-Instruct --iterations 2   # a real model
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _tiny_model(out: Path) -> str:
    """A small Qwen2-architecture model (vLLM supports it) with a tokenizer trained on env text."""
    from agents.tiny import fallback_corpus, init_tiny

    init_tiny(out, size="small", arch="qwen2", seed=0, corpus=fallback_corpus(1500, seed=1))
    return str(out)


def run_backend(
    backend: str, model: str, iterations: int, tasks: int, group: int, out: Path
) -> dict[str, Any]:
    """Train ``iterations`` SRPO iterations on CUDA in bf16; return throughput, memory and mismatch."""
    import torch

    from learners.trainer import TrainConfig, train

    torch.cuda.reset_peak_memory_stats()
    cfg = TrainConfig(
        algo="srpo", model=model, out_dir=str(out / backend), env_id="ProcArith-v0",
        env_kwargs={"workflow": "proposers-aggregator"}, iterations=iterations, tasks_per_iter=tasks,
        group_size=group, epochs=1, eval_every=0, save_every=0, device="cuda", dtype="bfloat16",
        backend=backend, max_new_tokens=64,
    )  # fmt: skip
    t0 = time.perf_counter()
    history = train(cfg, log=None)
    wall = time.perf_counter() - t0
    rows = [h for h in history if "rollout_s" in h]
    tokens = sum(h["team_tokens"] for h in rows)
    rollout_s = sum(h["rollout_s"] for h in rows)
    last = rows[-1]
    return {
        "backend": backend,
        "iterations": len(rows),
        "wall_s": round(wall, 1),
        "rollout_tokens_per_s": round(tokens / max(rollout_s, 1e-9), 1),
        "update_s_per_iteration": round(sum(h["update_s"] for h in rows) / len(rows), 2),
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "rollout/logprob_abs_diff": last.get("rollout/logprob_abs_diff"),
        "rollout/kl": last.get("rollout/kl"),
        "train_accuracy": last.get("train_accuracy"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir or hub id (default: a tiny Qwen2 built here)")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--backends", default="hf,vllm")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    from agents.vllm import vllm_available

    results = []
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        model = args.model or _tiny_model(Path(tmp) / "model")
        for backend in args.backends.split(","):
            if backend == "vllm" and not vllm_available():
                print("gpu_smoke: vllm is not installed, skipping the vllm backend", file=sys.stderr)
                continue
            res = run_backend(backend, model, args.iterations, args.tasks, args.group_size, Path(tmp))
            print(json.dumps(res), flush=True)
            results.append(res)
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
