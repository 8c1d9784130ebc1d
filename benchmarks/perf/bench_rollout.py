"""Rollout throughput: the full collector (env + prompts + batched HFPolicy) vs a bare ``model.generate``.

    python -m benchmarks.perf.bench_rollout [--size tiny] [--tasks 16] [--group 4] [--tokens 32]

Both sides generate for exactly the same prompts (the observations the env produced, rendered with
the same chat template) and the same number of new tokens per request (EOS ignored on both sides),
so the difference is the collector's overhead: env stepping, prompt building, bookkeeping, rows.
Target: overhead <= 20%.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

import srpo_envs
from agents.hf import HFPolicy
from agents.policy import GenerationRequest, PolicyMap, SamplingParams
from agents.rollout import RolloutCollector
from agents.tiny import init_tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--model", default=None, help="model dir (default: build a tiny one)")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or tempfile.mkdtemp(prefix="srpo-bench-")
    if args.model is None:
        init_tiny(model_dir, size=args.size, seed=0)
    policy = HFPolicy(model_dir)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.tokens, ignore_eos=True)
    collector = RolloutCollector(lambda: srpo_envs.make("ProcArith-v0"), PolicyMap.shared(policy), sampling)

    # Capture every round's requests so the bare baseline sees identical prompts.
    rounds: list[list[GenerationRequest]] = []
    original = policy.generate

    def recording(requests):
        rounds.append(list(requests))
        return original(requests)

    policy.generate = recording  # type: ignore[method-assign]
    collector.collect(list(range(args.tasks)), args.group, seed=0)
    policy.generate = original  # type: ignore[method-assign]

    tok = policy.tokenizer
    tok.padding_side = "left"
    encoded = [[policy.encode_prompt(r) for r in reqs] for reqs in rounds]

    def bare() -> int:
        n = 0
        for prompts in encoded:
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), policy.pad_id)
            attn = torch.zeros_like(ids)
            for i, p in enumerate(prompts):
                ids[i, width - len(p) :] = torch.tensor(p)
                attn[i, width - len(p) :] = 1
            with torch.inference_mode():
                out = policy.model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    do_sample=True,
                    max_new_tokens=args.tokens,
                    min_new_tokens=args.tokens,
                    pad_token_id=policy.pad_id,
                    top_p=1.0,
                    temperature=1.0,
                )
            n += (out.shape[1] - width) * len(prompts)
        return n

    def collect() -> int:
        batch = collector.collect(list(range(args.tasks)), args.group, seed=0)
        return sum(len(r.response_ids) for r in batch.rows)

    results = {}
    for name, fn in (("bare model.generate", bare), ("collector", collect)):
        fn()  # warm-up
        times, tokens = [], 0
        for _ in range(args.repeats):
            t = time.perf_counter()
            tokens = fn()
            times.append(time.perf_counter() - t)
        best = min(times)
        results[name] = tokens / best
        print(f"{name:22s} {tokens:6d} tokens  {best:7.2f}s  {tokens / best:8.0f} tok/s")
    overhead = results["bare model.generate"] / results["collector"] - 1
    print(f"collector overhead vs bare generate: {overhead:+.1%} (target <= +20%)")


if __name__ == "__main__":
    main()
