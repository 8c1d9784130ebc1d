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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agents.hf import _cache_kwarg, _forward_params, _new_cache, _transformers_model
from agents.layout import pad_prompt_response
from learners.losses import entropy_from_logits, logprobs_from_logits

__all__ = [
    "PackedRows",
    "pack_rows",
    "packed_logprobs",
    "prompt_groups",
    "shared_prefix_logits",
    "shared_prefix_logprobs",
]


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


# --------------------------------------------------------------------------------------------------
# packing: one sequence per distinct prompt, a block attention mask instead of a KV cache
# --------------------------------------------------------------------------------------------------


@dataclass
class PackedRows:
    """Rows packed as ``prompt, response_1, response_2, ...`` per distinct prompt (see :func:`pack_rows`).

    Attributes:
        input_ids: ``[N, L]`` int64, packed sequences right-padded with ``pad_id``.
        position_ids: ``[N, L]`` int64: ``0..p-1`` on a prompt, ``p..p+t-1`` on each of its responses
            (the positions of the unpadded ``prompt + response`` row), 0 on padding.
        segment: ``[N, L]`` int64, the distinct prompt a token belongs to (-1 on padding).
        part: ``[N, L]`` int64, 0 on prompt tokens, ``1 + i`` on the tokens of row ``i``'s response
            (-1 on padding).
        src_seq, src_pos: ``[M]`` int64, where the output that predicts each of the ``M`` response
            tokens sits (row-major over rows, then tokens).
        dst_row, dst_col: ``[M]`` int64, the token's place in the ``[R, T]`` response layout.
        labels: ``[M]`` int64, the response tokens.
        shape: ``(R, T)``.
    """

    input_ids: Tensor
    position_ids: Tensor
    segment: Tensor
    part: Tensor
    src_seq: Tensor
    src_pos: Tensor
    dst_row: Tensor
    dst_col: Tensor
    labels: Tensor
    shape: tuple[int, int]

    def attention_mask(self, float_dtype: torch.dtype | None = None) -> Tensor:
        """``[N, 1, L, L]`` mask: a token sees the earlier tokens of its prompt and of its own response.

        Boolean (True: attend) for SDPA; with ``float_dtype`` the additive form eager attention wants
        (0 / dtype min). Padding queries see themselves only (a query with nothing to attend to is
        ``nan`` in SDPA; their outputs are never read).
        """
        seg, part = self.segment, self.part
        L = seg.shape[1]
        causal = torch.ones(L, L, dtype=torch.bool, device=seg.device).tril_()
        same_seg = seg[:, :, None] == seg[:, None, :]
        visible = (part[:, None, :] == 0) | (part[:, :, None] == part[:, None, :])
        allowed = (same_seg & visible & causal) | torch.eye(L, dtype=torch.bool, device=seg.device)
        allowed = allowed.unsqueeze(1)
        if float_dtype is None:
            return allowed
        zero = torch.zeros((), dtype=float_dtype, device=seg.device)
        return torch.where(allowed, zero, torch.finfo(float_dtype).min)

    @property
    def num_positions(self) -> int:
        """Real (non-padding) positions the packed forward computes."""
        return int((self.segment >= 0).sum())


def pack_rows(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    pad_id: int = 0,
    pack_len: int = 1024,
) -> PackedRows:
    """Pack rows so that each distinct prompt is computed once, followed by all its responses.

    Why packing rather than a KV cache (:func:`shared_prefix_logits`): one forward, no cache copies,
    no per-row padding to the longest prompt, and gradient checkpointing still applies. Each distinct
    prompt and its responses form a segment; segments are placed first-fit (longest first) into
    sequences of ``max(pack_len, longest segment)`` tokens, so several short segments share one
    sequence and the padding stays small. The attention mask (:meth:`PackedRows.attention_mask`) lets
    each response see its prompt and itself only, and the position ids restart at the prompt length
    for every response, so every output equals that of the row's own unpadded sequence.

    Raises ``ValueError`` on mismatched lengths, an empty prompt or no response token at all.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError("prompt_ids_list and response_ids_list differ in length")
    if not prompt_ids_list:
        raise ValueError("pack_rows needs at least one row")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("every prompt needs at least one token (it predicts the first response token)")
    if pack_len < 1:
        raise ValueError(f"pack_len must be >= 1, got {pack_len}")
    t_max = max(len(r) for r in response_ids_list)
    if t_max == 0:
        raise ValueError("no response tokens in the batch")
    uniq, index = prompt_groups(prompt_ids_list)
    members: list[list[int]] = [[] for _ in uniq]
    for i, g in enumerate(index):
        members[g].append(i)
    # Segments: a prompt and as many of its responses as fit in pack_len (the prompt is repeated
    # when they do not; dense attention costs segment length squared, so one very long segment per
    # prompt would cost more than the repeated prompt positions it saves).
    segments: list[tuple[int, list[int]]] = []
    seg_len: list[int] = []
    for g in range(len(uniq)):
        p = len(uniq[g])
        cur: list[int] = []
        used = p
        for i in members[g]:
            t = len(response_ids_list[i])
            if cur and used + t > pack_len:
                segments.append((g, cur))
                seg_len.append(used)
                cur, used = [], p
            cur.append(i)
            used += t
        segments.append((g, cur))
        seg_len.append(used)
    cap = max(pack_len, *seg_len)
    seqs: list[list[int]] = []  # segment indices per packed sequence
    fill: list[int] = []
    for g in sorted(range(len(segments)), key=lambda g: -seg_len[g]):
        for s, used in enumerate(fill):
            if used + seg_len[g] <= cap:
                seqs[s].append(g)
                fill[s] += seg_len[g]
                break
        else:
            seqs.append([g])
            fill.append(seg_len[g])
    n, width = len(seqs), max(fill)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    pos = np.zeros((n, width), dtype=np.int64)
    segment = np.full((n, width), -1, dtype=np.int64)
    part = np.full((n, width), -1, dtype=np.int64)
    m = sum(len(r) for r in response_ids_list)
    src_seq, src_pos = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    dst_row, dst_col = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    labels = np.zeros(m, dtype=np.int64)
    k = 0
    for s, groups in enumerate(seqs):
        at = 0
        for g in groups:
            prompt, seg_members = uniq[segments[g][0]], segments[g][1]
            p = len(prompt)
            ids[s, at : at + p] = prompt
            pos[s, at : at + p] = np.arange(p)
            segment[s, at : at + p] = g
            part[s, at : at + p] = 0
            last_prompt = at + p - 1
            at += p
            for i in seg_members:
                r = response_ids_list[i]
                t = len(r)
                if t == 0:
                    continue
                ids[s, at : at + t] = r
                pos[s, at : at + t] = np.arange(p, p + t)
                segment[s, at : at + t] = g
                part[s, at : at + t] = 1 + i
                # token 0 is predicted by the prompt's last output, token j by response token j-1
                src_seq[k : k + t] = s
                src_pos[k] = last_prompt
                src_pos[k + 1 : k + t] = np.arange(at, at + t - 1)
                dst_row[k : k + t] = i
                dst_col[k : k + t] = np.arange(t)
                labels[k : k + t] = r
                k += t
                at += t
    # row-major order of the [R, T] layout (rows, then tokens): a stable order for the flat outputs
    order = np.lexsort((dst_col, dst_row))
    as_t = torch.from_numpy
    return PackedRows(
        input_ids=as_t(ids),
        position_ids=as_t(pos),
        segment=as_t(segment),
        part=as_t(part),
        src_seq=as_t(src_seq[order]),
        src_pos=as_t(src_pos[order]),
        dst_row=as_t(dst_row[order]),
        dst_col=as_t(dst_col[order]),
        labels=as_t(labels[order]),
        shape=(len(prompt_ids_list), t_max),
    )


def _plain_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` when logits are exactly ``lm_head(decoder(...).last_hidden_state)``.

    Lets the packed forward project only the positions that predict response tokens. Models that
    scale or soft-cap their logits (Gemma, Cohere, ...) return None and get the full logits instead.
    """
    base = _transformers_model(model)
    cfg = getattr(base, "config", None)
    if cfg is None or any(
        getattr(cfg, a, None) not in (None, 1.0) for a in ("final_logit_softcapping", "logit_scale")
    ):
        return None
    get_decoder, get_head = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is base:
        return None
    return decoder, head


def packed_logprobs(
    model: Any,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_entropy: bool = False,
    pack_len: int = 1024,
    packed: PackedRows | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`shared_prefix_logprobs`'s result through one packed forward (:func:`pack_rows`).

    Returns ``(logprobs, mask, entropy)``: float32 ``[R, T]`` log-probs of ``softmax(logits / T)`` (0
    on padding), the ``[R, T]`` bool mask of real response tokens and, with ``with_entropy``, the
    per-token entropy (else None). Only the ``M`` positions that predict a response token go through
    the vocabulary projection and the log-softmax (not the prompt positions, not the padding). Pass
    ``packed`` to reuse a packing (e.g. for a reference model on the same rows).
    """
    if packed is None:
        packed = pack_rows(prompt_ids_list, response_ids_list, pad_id, pack_len)
    dev = next(model.parameters()).device
    base = _transformers_model(model)
    impl = getattr(getattr(base, "config", None), "_attn_implementation", "sdpa")
    param_dtype = next(model.parameters()).dtype
    mask4 = packed.attention_mask(None if impl == "sdpa" else param_dtype).to(dev)
    inputs = {
        "input_ids": packed.input_ids.to(dev),
        "attention_mask": mask4,
        "position_ids": packed.position_ids.to(dev),
        "use_cache": False,
    }
    src = (packed.src_seq.to(dev), packed.src_pos.to(dev))
    plain = _plain_head(model)
    if plain is not None:
        decoder, head = plain
        hidden = decoder(**inputs).last_hidden_state
        logits = head(hidden[src])  # [M, V]
    else:
        keep = {"logits_to_keep": 0} if "logits_to_keep" in _forward_params(model) else {}
        logits = model(**inputs, **keep).logits[src]
    labels = packed.labels.to(dev)
    flat = logprobs_from_logits(logits, labels, temperature).float()
    shape = packed.shape
    dst = (packed.dst_row.to(dev), packed.dst_col.to(dev))
    lp = torch.zeros(shape, dtype=flat.dtype, device=dev).index_put(dst, flat)
    mask = torch.zeros(shape, dtype=torch.bool, device=dev).index_put(
        dst, torch.ones_like(labels, dtype=torch.bool)
    )
    ent = None
    if with_entropy:
        e = entropy_from_logits(logits.float() / temperature)
        ent = torch.zeros(shape, dtype=e.dtype, device=dev).index_put(dst, e)
    return lp, mask, ent
