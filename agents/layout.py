"""The one token layout every forward pass over (prompt, response) pairs uses.

``[left-padded prompt | right-padded response]``: all prompts end at the same column ``P`` (the
prompt width), so response token ``j`` of every row sits at column ``P + j`` and is predicted by the
logits at ``P + j - 1``; position ids count real tokens only, so a row's positions do not depend on
how much padding its batch needed. The sampler's prefill (:class:`agents.hf.HFPolicy`), the
behaviour-log-prob recompute (:func:`agents.hf.response_logprobs`) and the learner's batches
(:func:`learners.batching.collate`) all build their inputs here: the recomputed log-probs match the
sampled ones (ratio exactly 1 on-policy) only because the three layouts are the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_prompt_response(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]] | None,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(input_ids, attention_mask, position_ids, P)`` for the rows, all ``[B, P + T]`` int64 on CPU.

    ``responses=None`` lays out prompts only (``T = 0``: a generation prefill). Padding holds
    ``pad_id`` with attention 0 and position 0. Every prompt needs at least one token (the first
    response token is predicted from the last prompt token).
    """
    if responses is not None and len(responses) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    b = len(prompts)
    p_width = max((len(p) for p in prompts), default=0)
    r_width = max((len(r) for r in responses), default=0) if responses is not None else 0
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    ids = torch.full((b, p_width + r_width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_width + r_width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, p_width - len(p) : p_width] = torch.as_tensor(list(p), dtype=torch.long)
        end = p_width
        if responses is not None and len(responses[i]):
            r = responses[i]
            ids[i, p_width : p_width + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            end = p_width + len(r)
        attn[i, p_width - len(p) : end] = 1
    pos = (attn.cumsum(-1) - 1).clamp_min(0) * attn
    return ids, attn, pos, p_width
