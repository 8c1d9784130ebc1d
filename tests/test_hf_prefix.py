"""Shared-prefix prefill in HFPolicy.generate: each distinct prompt is prefilled once, rollouts unchanged."""

from __future__ import annotations

from dataclasses import replace

import torch

from agents.hf import HFPolicy
from agents.policy import GenerationRequest, SamplingParams
from srpo_common import sha256_json

PROMPTS = ["Problem: What is 12 + 7?\nSolution:", "hi", "The answer is " * 4]


def _requests() -> list[GenerationRequest]:
    """Each prompt sampled 5 times (a group), per-request seeds, uneven lengths so rows get pruned."""
    base = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12)
    out = []
    for i in range(15):
        sp = replace(base, seed=1000 + i, max_new_tokens=4 + (i * 5) % 9)
        out.append(GenerationRequest(agent=f"a{i}", role="solver", prompt=PROMPTS[i % 3], sampling=sp))
    return out


def _run(policy: HFPolicy, share: bool) -> tuple[str, list[list[float]], list[int]]:
    """Hash of every generated field but the log-probs, the log-probs, and each prefill's batch size."""
    policy.share_prefix = share
    widths: list[int] = []

    def hook(_m, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids.shape[1] > 1:  # decode steps feed one token per row
            widths.append(int(ids.shape[0]))

    handle = policy.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        gens = policy.generate(_requests())
    finally:
        handle.remove()
    rows = [(g.token_ids, g.text, g.finish_reason, g.stop_reason, g.prompt_ids) for g in gens]
    return sha256_json(rows), [g.logprobs for g in gens], widths


def test_prefill_once_per_prompt_and_rows_identical(tiny_model_dir) -> None:
    torch.set_num_threads(1)
    policy = HFPolicy(tiny_model_dir, max_batch_size=8)  # 15 requests: two batches (8 + 7)
    without, lp_without, widths_without = _run(policy, share=False)
    with_sharing, lp_with, widths_with = _run(policy, share=True)
    assert widths_without == [8, 7]
    assert widths_with == [2, 2]  # longest prompts first: 5 + 3 rows, then 2 + 5 rows of two prompts each
    assert with_sharing == without  # identical tokens, texts, finish reasons
    # Log-probs: the same computation on fewer rows. CPU GEMM kernels may round a 2-row LM head
    # differently from an 8-row one (an ulp), as row pruning mid-decode already does; the shipped
    # warm start's rollouts hash bit-identical (python -m benchmarks.perf.fingerprint).
    diffs = [
        abs(a - b) for xs, ys in zip(lp_with, lp_without, strict=True) for a, b in zip(xs, ys, strict=True)
    ]
    assert len(diffs) > 50 and max(diffs) <= 1e-5
