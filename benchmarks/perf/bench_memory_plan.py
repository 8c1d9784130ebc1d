"""The memory plan (learners.memory_plan) against the measured peak of a training step, on CPU.

    python -m benchmarks.perf.bench_memory_plan          # 8 cases: full/LoRA x ckpt off/on x 256/1024 tokens
    python -m benchmarks.perf.bench_memory_plan --tokens 1024 --sharing lora --foreach

A mid-size Qwen2 model (about 45M parameters: H=512, 8 layers, GQA 8/4 heads, I=1792, V=32000, tied
embeddings) is built from a config here, randomly initialised, and one minibatch step runs the way
:class:`learners.trainer.Trainer` runs it: a micro-batch of ``--tokens`` tokens (rows of 40 prompt + 216
response tokens, the response share of long answers) after earlier ones (their gradients allocated), a
forward under bf16 autocast
with ``logits_to_keep = T + 1``, :func:`learners.losses.logprobs_from_logits` outside autocast, a
policy-gradient loss and ``backward``; then gradient clipping and the AdamW step (``--foreach``: the
multi-tensor implementation GPUs default to; CPU defaults to the per-tensor loop). AdamW's moments
exist already (a step on zero gradients ran before measuring), as in the trainer's steady state.

Why the profiler: on CPU there is no ``torch.cuda.max_memory_allocated``, and RSS counts the allocator's
cached pages, libraries and the Python heap (too coarse to check a 15% coefficient). ``torch.profiler``
with ``profile_memory=True`` records every allocation and free of the CPU allocator with its running
total since profiling started; the peak of a phase is the tensors alive at its start (weights,
moments, and gradients at the step: counted from their storages) plus the largest running total
inside it. Printed per case: the plan's terms that apply on CPU (weights, gradients, moments,
activations, logits, autocast weight copies, AdamW step temporaries), its phase peaks (train, step),
the measured ones and the ratio plan / measured. The GPU-only terms (CUDA context and fragmentation,
the vLLM share) are left out of both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

PROMPT, RESPONSE = 40, 216  #: tokens per row: a response share of 216 / 256 = 0.84
MIB = 2**20

#: The measured model: Qwen2 class (GQA, q/k/v biases, tied embeddings), about 45M parameters.
CONFIG = dict(
    hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1792,
    vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=2048, rms_norm_eps=1e-6, model_type="qwen2",
)  # fmt: skip


@dataclass
class Case:
    sharing: str  # shared (full fine-tuning) or lora
    checkpointing: bool
    tokens: int  # per micro-batch
    foreach: bool


def _build(case: Case) -> tuple[Any, list[Any]]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agents.lora import default_lora_config

    cfg = {k: v for k, v in CONFIG.items() if k != "model_type"}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg), dtype=torch.float32)
    if case.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case.sharing == "lora":
        from peft import get_peft_model

        model = get_peft_model(model, default_lora_config(r=8))
        if case.checkpointing:
            model.enable_input_require_grads()
    model.train()
    return model, [p for p in model.parameters() if p.requires_grad]


def _micro_batches(case: Case, n: int = 2) -> list[dict[str, Any]]:
    import torch

    rows = max(1, case.tokens // (PROMPT + RESPONSE))
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(10, CONFIG["vocab_size"], (rows, PROMPT + RESPONSE), generator=g)
        adv = torch.randn(rows, 1, generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "adv": adv})
    return out


def _storage_bytes(tensors: list[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _peak_during(fn: Any) -> int:
    """Largest running total of CPU allocations (bytes, net of frees) while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not mem:
        return 0
    # the running total carries over from earlier profiling sessions in this process: count from the
    # total just before this session's first event
    start = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    return max(0, *(e["args"]["Total Allocated"] - start for e in mem))


def measure(case: Case) -> dict[str, int]:
    """Peak bytes of the train phase (a micro-batch's forward + backward, gradients of earlier micro-batches
    already allocated) and of the optimizer step."""
    import torch

    from learners.losses import logprobs_from_logits

    model, params = _build(case)
    opt = torch.optim.AdamW(params, lr=1e-5, foreach=case.foreach)
    mbs = _micro_batches(case, 1)
    t = RESPONSE

    def train_phase() -> None:
        for mb in mbs:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(
                    input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], logits_to_keep=t + 1
                ).logits
            n = logits.shape[1]
            lp = logprobs_from_logits(logits[:, n - t - 1 : n - 1], mb["input_ids"][:, -t:])
            loss = -(lp * mb["adv"]).sum() / lp.numel()
            del logits
            loss.backward()

    def step_phase() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    for p in params:  # AdamW's moments exist from here on, as in the trainer's steady state
        p.grad = torch.zeros_like(p)
    opt.step()
    # the gradients of the minibatch's earlier micro-batches: allocated, accumulated into by this one
    weights = _storage_bytes(list(model.parameters()) + list(model.buffers()))
    moments = _storage_bytes([v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)])
    grads = _storage_bytes([p.grad for p in params])
    train_peak = weights + moments + grads + _peak_during(train_phase)
    step_peak = weights + moments + grads + _peak_during(step_phase)
    return {"weights": weights, "moments": moments, "gradients": grads, "train": train_peak, "step": step_peak}


def planned(case: Case) -> dict[str, int]:
    from learners.memory_plan import ModelShape, PlanOptions, plan_memory

    shape = ModelShape.from_config(CONFIG, name="qwen2-45M")
    opts = PlanOptions(
        sharing=case.sharing,
        roles=1,
        lora_rank=8,
        dtype="bfloat16",
        gradient_checkpointing=case.checkpointing,
        microbatch_tokens=case.tokens,
        response_share=RESPONSE / (PROMPT + RESPONSE),
        foreach=case.foreach,
        backend="hf",
        generation_tokens=0,  # a training step: no rollout in it
    )
    plan = plan_memory(shape, opts, 1 << 50, suggest=False)
    return {"items": dict(plan.items), **plan.phase_peaks(cpu=True)}  # type: ignore[dict-item]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[256, 1024], help="tokens per micro-batch")
    ap.add_argument("--sharing", nargs="*", default=["shared", "lora"], choices=["shared", "lora"])
    ap.add_argument("--checkpointing", nargs="*", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--foreach", action="store_true", help="AdamW's multi-tensor step (the GPU default)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    print(f"model: Qwen2 config {CONFIG}; rows of {PROMPT}+{RESPONSE} tokens; "
          f"bf16 autocast, float32 master weights; AdamW foreach={args.foreach}")  # fmt: skip
    head = f"{'case':<34s}{'phase':<7s}{'plan MiB':>10s}{'measured MiB':>14s}{'plan/meas':>10s}"
    print(head)
    worst = 0.0
    for sharing in args.sharing:
        for ck in args.checkpointing:
            for tokens in args.tokens:
                case = Case(sharing, ck == "on", tokens, args.foreach)
                t0 = time.perf_counter()
                meas = measure(case)
                plan = planned(case)
                name = f"{'full' if sharing == 'shared' else 'lora'} ckpt={ck} T={tokens}"
                for phase in ("train", "step"):
                    ratio = plan[phase] / meas[phase]
                    worst = max(worst, abs(ratio - 1))
                    print(f"{name:<34s}{phase:<7s}{plan[phase] / MIB:10.1f}{meas[phase] / MIB:14.1f}{ratio:10.3f}")
                print(f"{'':<34s}(weights {meas['weights'] / MIB:.1f}, moments {meas['moments'] / MIB:.1f}, "
                      f"gradients {meas['gradients'] / MIB:.1f} MiB measured; {time.perf_counter() - t0:.0f} s)")  # fmt: skip
    print(f"largest |plan / measured - 1|: {worst:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
