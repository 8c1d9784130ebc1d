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
float rounding (``tests/learners/test_learners_prefix.py`` checks 1e-5, gradients included): same positions (the
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

from agents.kv_cache import cache_kwarg, forward_params, new_cache, transformers_model
from agents.layout import pad_prompt_response
from learners.losses import entropy_from_logits, logprobs_from_logits

__all__ = [
    "PackedRows",
    "pack_rows",
    "packed_logprobs",
    "packed_inputs",
    "packed_logits",
    "prefix_tree_size",
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
    if "logits_to_keep" in forward_params(model):
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
    cache_kw = cache_kwarg(model)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in forward_params(model) else {}
    cache = new_cache(model)
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
# packing: the rows' prefix tree in a few sequences, an ancestor attention mask instead of a KV cache
# --------------------------------------------------------------------------------------------------


@dataclass
class PackedRows:
    """Rows packed as a prefix tree (see :func:`pack_rows`).

    Attributes:
        input_ids: ``[N, L]`` int64, the tree's nodes (one token each) in depth-first order, several
            trees per sequence, right-padded with ``pad_id``.
        position_ids: ``[N, L]`` int64, each node's depth, i.e. its position in every row that passes
            through it (0 on padding).
        subtree_end: ``[N, L]`` int64, one past the last node of each node's subtree (node ``j`` is an
            ancestor of node ``i`` iff ``j <= i < subtree_end[j]``); padding: its own index + 1.
        real: ``[N, L]`` bool, False on padding.
        src_seq, src_pos: ``[U]`` int64, the distinct nodes whose outputs predict response tokens.
        src_index: ``[M]`` int64, for each of the ``M`` response tokens (rows, then tokens), its
            predicting node in ``src_*``.
        dst_row, dst_col: ``[M]`` int64, the token's place in the ``[R, T]`` response layout.
        labels: ``[M]`` int64, the response tokens.
        shape: ``(R, T)``.
    """

    input_ids: Tensor
    position_ids: Tensor
    subtree_end: Tensor
    real: Tensor
    src_seq: Tensor
    src_pos: Tensor
    src_index: Tensor
    dst_row: Tensor
    dst_col: Tensor
    labels: Tensor
    shape: tuple[int, int]

    def attention_mask(self, float_dtype: torch.dtype | None = None) -> Tensor:
        """``[N, 1, L, L]`` mask: a node sees its ancestors and itself, i.e. exactly its row's prefix.

        Boolean (True: attend) for SDPA; with ``float_dtype`` the additive form eager attention wants
        (0 / dtype min). A padding query sees itself only (its output is never read).
        """
        L = self.subtree_end.shape[1]
        j = torch.arange(L, device=self.subtree_end.device)
        i = j[:, None]
        allowed = ((j <= i) & (i < self.subtree_end[:, None, :])).unsqueeze(1)
        if float_dtype is None:
            return allowed
        zero = torch.zeros((), dtype=float_dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(float_dtype).min)

    @property
    def num_positions(self) -> int:
        """Real (non-padding) positions the packed forward computes."""
        return int(self.real.sum())


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_tree_size(sequences: Sequence[Sequence[int]]) -> int:
    """Nodes of the prefix tree of ``sequences``: the positions a shared-prefix forward computes."""
    seqs = sorted(tuple(s) for s in sequences)
    return sum(len(s) - (_lcp(s, seqs[k - 1]) if k else 0) for k, s in enumerate(seqs))


def pack_rows(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    pad_id: int = 0,
    pack_len: int = 256,
) -> PackedRows:
    """Pack rows as their prefix tree: every distinct prefix of ``prompt + response`` computed once.

    Why: a rollout batch repeats itself. A task's G samples share the question, the proposers of an
    episode share their prompt, aggregator prompts share the question and often candidates, and a
    low-entropy policy repeats the first response tokens; on a quick-math batch 50k row positions are
    8k distinct prefixes. A causal model's output at a position depends only on the tokens up to it,
    so one node per distinct prefix, attending to its ancestors (:meth:`PackedRows.attention_mask`)
    at its depth as position id, gives every row exactly the outputs of its own unpadded sequence.
    Why packing rather than a KV cache (:func:`shared_prefix_logits`): one forward, no cache copies,
    sharing beyond whole prompts, and gradient checkpointing still applies.

    Rows are sorted lexicographically (so the tree is laid out depth-first and each row adds the
    suffix after its longest common prefix with the previous row) and cut into runs whose tree has at
    most ``pack_len`` nodes (a row longer than that goes alone): attention is dense over a packed
    sequence, so its cost grows with the square of the length, and a run's cut repeats only the
    shared prefix. Runs are placed first-fit (longest first) into sequences of ``max(pack_len,
    longest run)`` tokens.

    Raises ``ValueError`` on mismatched lengths, an empty prompt, no response token at all or a
    ``pack_len`` below 1.
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
    seqs = [
        tuple(int(t) for t in p) + tuple(int(t) for t in r)
        for p, r in zip(prompt_ids_list, response_ids_list, strict=True)
    ]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    # runs of consecutive (sorted) rows whose tree fits pack_len; shared[k]: nodes row k reuses
    runs: list[list[int]] = []
    run_len: list[int] = []
    shared: dict[int, int] = {}
    prev: tuple[int, ...] | None = None
    for i in order:
        common = _lcp(seqs[i], prev) if prev is not None else 0
        if runs and run_len[-1] + len(seqs[i]) - common <= pack_len:
            runs[-1].append(i)
            run_len[-1] += len(seqs[i]) - common
        else:
            common = 0
            runs.append([i])
            run_len.append(len(seqs[i]))
        shared[i] = common
        prev = seqs[i]
    cap = max(pack_len, *run_len)
    packs: list[list[int]] = []  # run indices per packed sequence
    fill: list[int] = []
    for g in sorted(range(len(runs)), key=lambda g: -run_len[g]):
        for s, used in enumerate(fill):
            if used + run_len[g] <= cap:
                packs[s].append(g)
                fill[s] += run_len[g]
                break
        else:
            packs.append([g])
            fill.append(run_len[g])
    n, width = len(packs), max(fill)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    pos = np.zeros((n, width), dtype=np.int64)
    end = np.tile(np.arange(1, width + 1, dtype=np.int64), (n, 1))
    real = np.zeros((n, width), dtype=bool)
    m = sum(len(r) for r in response_ids_list)
    src_flat = np.zeros(m, dtype=np.int64)  # predicting node as seq * width + pos
    dst_row, dst_col = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    labels = np.zeros(m, dtype=np.int64)
    k = 0
    for s, run_ids in enumerate(packs):
        at = 0
        for g in run_ids:
            start = at
            parent: list[int] = []
            path: list[int] = []
            for i in runs[g]:
                seq, common = seqs[i], shared[i]
                path = path[:common]
                new = len(seq) - common
                if new:  # a duplicate row adds no node
                    parent.extend([path[-1] if path else -1, *range(at, at + new - 1)])
                path.extend(range(at, at + new))
                ids[s, at : at + new] = seq[common:]
                pos[s, at : at + new] = np.arange(common, len(seq))
                at += new
                p, t = len(prompt_ids_list[i]), len(response_ids_list[i])
                if t:
                    # response token j sits at depth p + j and is predicted by the node at depth p + j - 1
                    src_flat[k : k + t] = s * width + np.asarray(path[p - 1 : p + t - 1])
                    dst_row[k : k + t] = i
                    dst_col[k : k + t] = np.arange(t)
                    labels[k : k + t] = response_ids_list[i]
                    k += t
            size = np.ones(at - start, dtype=np.int64)
            for node in range(at - 1, start - 1, -1):  # children come after their parent
                par = parent[node - start]
                if par >= 0:
                    size[par - start] += size[node - start]
            end[s, start:at] = np.arange(start, at) + size
            real[s, start:at] = True
    uniq, src_index = np.unique(src_flat, return_inverse=True)
    order_m = np.lexsort((dst_col, dst_row))  # rows, then tokens
    as_t = torch.from_numpy
    return PackedRows(
        input_ids=as_t(ids),
        position_ids=as_t(pos),
        subtree_end=as_t(end),
        real=as_t(real),
        src_seq=as_t(uniq // width),
        src_pos=as_t(uniq % width),
        src_index=as_t(src_index.reshape(-1)[order_m]),
        dst_row=as_t(dst_row[order_m]),
        dst_col=as_t(dst_col[order_m]),
        labels=as_t(labels[order_m]),
        shape=(len(prompt_ids_list), t_max),
    )


def _plain_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` when logits are exactly ``lm_head(decoder(...).last_hidden_state)``.

    Lets the packed forward project only the nodes that predict response tokens. Models that scale
    or soft-cap their logits (Gemma, Cohere, ...) return None and get the full logits instead.
    """
    base = transformers_model(model)
    from torch.distributed.fsdp import FSDPModule

    if isinstance(base, FSDPModule):  # its root parameters are gathered only by the root's own forward
        return None
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


def packed_inputs(model: Any, packed: PackedRows) -> tuple[dict[str, Any], tuple[Tensor, Tensor]]:
    """The forward keywords of a packed batch on ``model``'s device (the ancestor mask in the form its
    attention implementation wants) and the ``(seq, pos)`` index of its predicting nodes."""
    param = next(model.parameters())
    impl = getattr(getattr(transformers_model(model), "config", None), "_attn_implementation", "sdpa")
    mask = packed.attention_mask(None if impl == "sdpa" else param.dtype)
    inputs = {
        "input_ids": packed.input_ids.to(param.device),
        "attention_mask": mask.to(param.device),
        "position_ids": packed.position_ids.to(param.device),
        "use_cache": False,
    }
    return inputs, (packed.src_seq.to(param.device), packed.src_pos.to(param.device))


def packed_logits(model: Any, packed: PackedRows) -> Tensor:
    """``[U, V]`` logits of the distinct predicting nodes (``packed.src_*``), one packed forward."""
    inputs, src = packed_inputs(model, packed)
    plain = _plain_head(model)
    if plain is not None:
        decoder, head = plain
        return head(decoder(**inputs).last_hidden_state[src])
    keep = {"logits_to_keep": 0} if "logits_to_keep" in forward_params(model) else {}
    return model(**inputs, **keep).logits[src]


def packed_logprobs(
    model: Any,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_entropy: bool = False,
    pack_len: int = 256,
    packed: PackedRows | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`shared_prefix_logprobs`'s result through one prefix-tree forward (:func:`pack_rows`).

    Returns ``(logprobs, mask, entropy)``: ``[R, T]`` log-probs of ``softmax(logits / T)`` (float32 for
    half-precision logits, else their dtype; 0 on padding), the ``[R, T]`` bool mask of real response
    tokens and, with ``with_entropy``, the per-token entropy (else None). Only the distinct nodes that predict a response token go through
    the vocabulary projection and the log-softmax (not the prompts, not the padding, and a prefix
    shared by several rows once). Pass ``packed`` to reuse a packing (e.g. for a reference model).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if packed is None:
        packed = pack_rows(prompt_ids_list, response_ids_list, pad_id, pack_len)
    logits = packed_logits(model, packed)
    dev = logits.device
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature != 1.0:
        z = z / temperature
    node = packed.src_index.to(dev)
    labels = packed.labels.to(dev)
    flat = z[node, labels] - torch.logsumexp(z, dim=-1)[node]
    dst = (packed.dst_row.to(dev), packed.dst_col.to(dev))
    lp = torch.zeros(packed.shape, dtype=flat.dtype, device=dev).index_put(dst, flat)
    mask = torch.zeros(packed.shape, dtype=torch.bool, device=dev)
    mask[dst] = True
    ent = None
    if with_entropy:
        e = entropy_from_logits(z)[node]
        ent = torch.zeros(packed.shape, dtype=e.dtype, device=dev).index_put(dst, e)
    return lp, mask, ent
