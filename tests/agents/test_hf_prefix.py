"""Shared-prefix prefill in HFPolicy.generate: each distinct prompt is prefilled once, rollouts unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from agents.hf import HFPolicy
from agents.policy import GenerationRequest, SamplingParams
from srpo_common import sha256_json

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)

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


def test_prefill_once_per_prompt_and_rows_identical(tiny_model_dir, monkeypatch) -> None:
    import agents.hf as hf

    torch.set_num_threads(1)
    monkeypatch.setattr(hf, "PREFILL_FORWARD_COST", 10**9)  # no length buckets: sharing alone
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


def test_length_buckets_are_the_cheapest_split() -> None:
    """The dynamic programme against every split of small sorted inputs (brute force)."""
    import itertools
    import random

    import pytest

    from agents.hf import length_buckets

    def cost(lengths, buckets, c0):  # noqa: ANN001, ANN202
        return sum(c0 + len(b) * lengths[b[0]] for b in buckets)

    rng = random.Random(0)
    for _ in range(200):
        lengths = sorted((rng.randrange(1, 300) for _ in range(rng.randrange(1, 8))), reverse=True)
        c0 = rng.choice([0, 16, 64, 1000])
        got = length_buckets(lengths, c0)
        assert [i for b in got for i in b] == list(range(len(lengths)))  # consecutive, every row once
        n = len(lengths)
        best = min(
            cost(lengths, [list(range(a, b)) for a, b in itertools.pairwise((0, *cuts, n))], c0)
            for r in range(n)
            for cuts in itertools.combinations(range(1, n), r)
        )
        assert cost(lengths, got, c0) == best
    assert length_buckets([200, 190, 10, 8], 64) == [[0, 1], [2, 3]]
    assert length_buckets([20, 19, 10, 8], 64) == [[0, 1, 2, 3]]  # padding cheaper than a forward
    with pytest.raises(ValueError, match="longest first"):
        length_buckets([3, 5], 64)


def test_prompts_of_very_different_lengths_are_prefilled_in_buckets_with_the_same_samples(
    tiny_model_dir, monkeypatch
) -> None:
    """An aggregator-like batch (short and long prompts): prefilled at two widths instead of padding
    every row to the longest, the sampled tokens are the same and the log-probs equal to rounding;
    it fails if the merged cache misplaces a bucket's keys (tokens would change)."""
    import agents.hf as hf

    torch.set_num_threads(1)
    policy = HFPolicy(tiny_model_dir, max_batch_size=32)
    vocab = policy.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    reqs = []
    for i in range(12):  # 6 long and 6 short prompts, a group of two samples each
        n = 150 + i if i < 6 else 12 + i
        ids = torch.randint(5, vocab, (n,), generator=g).tolist()
        for s in range(2):
            sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=100 * i + s)
            reqs.append(GenerationRequest(agent=f"a{i}", role="r", prompt="", prompt_ids=ids, sampling=sp))

    def run(share: bool) -> tuple[list[list[int]], list[list[float]], list[tuple[int, int]]]:
        policy.share_prefix = share
        shapes: list[tuple[int, int]] = []

        def hook(_m, args, kwargs):  # noqa: ANN001, ANN202
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids.shape[1] > 1:
                shapes.append(tuple(ids.shape))

        handle = policy.model.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            gens = policy.generate(reqs)
        finally:
            handle.remove()
        return [x.token_ids for x in gens], [x.logprobs for x in gens], shapes

    for share in (True, False):
        tokens, logps, shapes = run(share)
        rows = 6 if share else 12
        assert shapes == [(rows, 155), (rows, 23)]  # one batch, prefilled as the long rows, then the short
        monkeypatch.setattr(hf, "PREFILL_FORWARD_COST", 10**9)  # one bucket: the full-width prefill
        ref_tokens, ref_logps, ref_shapes = run(share)
        monkeypatch.undo()
        assert ref_shapes == [(2 * rows, 155)]
        assert tokens == ref_tokens
        diffs = [
            abs(a - b) for xs, ys in zip(logps, ref_logps, strict=True) for a, b in zip(xs, ys, strict=True)
        ]
        assert len(diffs) > 100 and max(diffs) <= 1e-5


def test_growing_cache_gives_the_concatenating_caches_logits_bit_for_bit(tiny_model_dir) -> None:
    """Prefill, decode steps past the reserved room (regrowth), dropping rows and repeating them:
    the logits equal a plain DynamicCache's exactly."""
    from agents.kv_cache import generation_cache, new_cache

    torch.set_num_threads(1)
    policy = HFPolicy(tiny_model_dir)
    model = policy.model.eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (4, 9), generator=g)
    attn = torch.ones_like(ids)
    attn[2, :3] = 0  # a left-padded row
    pos = (attn.cumsum(-1) - 1).clamp_min(0)

    def run(cache) -> list[torch.Tensor]:  # noqa: ANN001
        out, a, p, x = [], attn, pos[:, -1:] + 1, ids
        with torch.inference_mode():
            out.append(policy._forward(x, a, pos, cache))
            for step in range(6):
                tok = out[-1].argmax(-1, keepdim=True)
                if step == 2:  # drop row 1
                    keep = torch.tensor([0, 2, 3])
                    cache.batch_select_indices(keep)
                    a, p, tok = a[keep], p[keep], tok[keep]
                if step == 4:
                    cache.batch_repeat_interleave(2)
                    a, p, tok = (
                        a.repeat_interleave(2, 0),
                        p.repeat_interleave(2, 0),
                        tok.repeat_interleave(2, 0),
                    )
                a = torch.cat([a, a.new_ones(len(a), 1)], dim=-1)
                out.append(policy._forward(tok, a, p, cache))
                p = p + 1
        return out

    plain = run(new_cache(model))
    growing_cache = generation_cache(model, reserve=2)  # room for 2 tokens: regrows while decoding
    assert type(growing_cache.layers[0]).__name__ == "GrowingLayer"
    growing = run(growing_cache)
    assert len(plain) == len(growing) == 7
    for a, b in zip(plain, growing, strict=True):
        assert torch.equal(a, b)
