"""Shared-prefix forward for policy updates: each distinct prompt once, its KV cache reused by its responses.

Why: a rollout batch repeats prompts. A task's G samples start from the same question, and in a
proposers round every proposer of an episode reads the same prompt, so in a 512-row SRPO batch ~77%
of the positions a per-row forward computes are prompt tokens and most of them are copies (16
prompts repeated 24 times). Recomputing them costs time and, worse, keeps their activations for the
backward pass. Here the distinct prompts of a micro-batch go through the model once (with gradients),
their KV cache is expanded to the rows that share them (an index, whose backward sums the rows'
gradients into the shared prompt), and then only the response tokens are forwarded against that cache.

The result equals the per-row path (:func:`learners.batching.collate` + one forward +
:func:`learners.batching.gather_response_logprobs`, or :func:`agents.hf.response_logprobs`) up to
float rounding (``tests/test_learners_prefix.py`` checks 1e-5, gradients included): same positions (the
unpadded ones), same masks, same ``log_softmax(logits / T)`` convention.

Gradient checkpointing: transformers drops the KV cache of a checkpointed layer in training mode
(the backward replay would write it twice), so with checkpointing on the helpers fall back to one
per-row forward; the numbers are the same, only the saving is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agents.hf import _cache_kwarg, _forward_params, _new_cache
from agents.layout import pad_prompt_response
from learners.losses import entropy_from_logits, logprobs_from_logits

__all__ = ["prompt_groups", "shared_prefix_logits", "shared_prefix_logprobs"]


def prompt_groups(prompt_ids_list: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """Distinct prompts in order of first appearance and, per row, the index of its prompt."""
    slot: dict[tuple[int, ...], int] = {}
    index = [slot.setdefault(tuple(int(t) for t in p), len(slot)) for p in prompt_ids_list]
    return [list(p) for p in slot], index


def _checkpointing(model: Any) -> bool:
    """Is gradient checkpointing active for the next forward (it only acts in training mode)?"""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    attr = (
        "is_activation_checkpointing"
        if hasattr(base, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return bool(getattr(base, attr, False)) and base.training and torch.is_grad_enabled()


def _per_row_logits(
    model: Any, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int, r_len: int
) -> Tensor:
    """Fallback: ``[left-padded prompt | right-padded response]`` in one forward, logits ``[R, T, V]``."""
    dev = next(model.parameters()).device
    ids, attn, pos, _ = pad_prompt_response(prompts, responses, pad_id)
    kwargs: dict[str, Any] = {"use_cache": False}
    if "logits_to_keep" in _forward_params(model):
        kwargs["logits_to_keep"] = r_len + 1
    out = model(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev), **kwargs)
    return out.logits[:, -(r_len + 1) : -1]


def shared_prefix_logits(
    model: Any,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    pad_id: int = 0,
) -> tuple[Tensor, Tensor]:
    """Logits that predict each response token, with every distinct prompt forwarded once.

    Returns ``(logits, mask)``: ``logits[i, j]`` (``[R, T, V]``, the model's dtype) is the distribution
    of response token ``j`` of row ``i`` (i.e. the output at the position before it) and ``mask``
    (``[R, T]`` bool) marks real response tokens; ``T`` is the longest response. Gradients flow to the
    model when enabled. Rows may come in any order; rows with equal ``prompt_ids`` share the prompt
    forward. Raises ``ValueError`` on mismatched lengths, an empty prompt or no response token at all.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError("prompt_ids_list and response_ids_list differ in length")
    if not prompt_ids_list:
        raise ValueError("shared_prefix_logits needs at least one row")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("every prompt needs at least one token (it predicts the first response token)")
    r_len = max(len(r) for r in response_ids_list)
    if r_len == 0:
        raise ValueError("no response tokens in the batch")
    dev = next(model.parameters()).device
    b = len(prompt_ids_list)
    mask = torch.zeros(b, r_len, dtype=torch.bool)
    for i, r in enumerate(response_ids_list):
        mask[i, : len(r)] = True
    mask = mask.to(dev)
    if _checkpointing(model):
        return _per_row_logits(model, prompt_ids_list, response_ids_list, pad_id, r_len), mask

    uniq, index = prompt_groups(prompt_ids_list)
    p_ids, p_attn, p_pos, p_len = pad_prompt_response(uniq, None, pad_id)
    p_ids, p_attn, p_pos = p_ids.to(dev), p_attn.to(dev), p_pos.to(dev)
    cache_kw = _cache_kwarg(model)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}
    cache = _new_cache(model)
    out = model(
        input_ids=p_ids,
        attention_mask=p_attn,
        position_ids=p_pos,
        use_cache=True,
        **{cache_kw: cache},
        **keep,
    )
    if cache.get_seq_length() != p_len:  # a model/config that ignores the cache: do not guess
        raise RuntimeError("the model did not fill the KV cache; use the per-row forward for it")
    rows = torch.tensor(index, device=dev)
    first = out.logits[:, -1:][rows]  # [R, 1, V]: the prompt's last position predicts response token 0
    if r_len == 1:
        return first, mask
    cache.batch_select_indices(rows)  # rows sharing a prompt share (and sum gradients into) its keys/values
    # Response token j (j < T-1) is the input that predicts token j+1; the last one predicts nothing.
    r_ids = torch.full((b, r_len - 1), pad_id, dtype=torch.long)
    for i, r in enumerate(response_ids_list):
        n = min(len(r), r_len - 1)
        r_ids[i, :n] = torch.as_tensor(list(r[:n]), dtype=torch.long)
    r_ids = r_ids.to(dev)
    attn = torch.cat([p_attn[rows], mask[:, : r_len - 1].long()], dim=-1)
    r_pos = p_attn.sum(-1)[rows].unsqueeze(-1) + torch.arange(r_len - 1, device=dev)
    rest = model(
        input_ids=r_ids, attention_mask=attn, position_ids=r_pos, use_cache=True, **{cache_kw: cache}
    )
    return torch.cat([first, rest.logits], dim=1), mask


def shared_prefix_logprobs(
    model: Any,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``log_softmax(logits / T)`` of every response token (float32 ``[R, T]``, 0 on padding), its mask
    and, with ``with_entropy``, the per-token entropy of ``softmax(logits / T)`` (else ``None``).

    The layout matches :func:`learners.batching.collate`'s ``[R, T]`` response tensors, so the result
    drops into the trainer's loss in place of ``gather_response_logprobs`` (pad ``T`` as it does).
    """
    logits, mask = shared_prefix_logits(model, prompt_ids_list, response_ids_list, pad_id)
    labels = torch.zeros(mask.shape, dtype=torch.long, device=logits.device)
    for i, r in enumerate(response_ids_list):
        labels[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    lp = logprobs_from_logits(logits, labels, temperature).float().masked_fill(~mask, 0.0)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits.float() / temperature).masked_fill(~mask, 0.0)
    return lp, mask, ent
