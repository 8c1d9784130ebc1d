"""Event-atomic minibatching and collation of :class:`agents.rows.Row` into training tensors.

SRPO's ratio is a function of *all* K outputs of an event, so an event must never be split across
minibatches (its ratio would be computed from a subset of its members) and an incomplete event (rows
lost, duplicated) must not be trained on. :func:`event_minibatches` enforces both; the rest is plain
padding.

Tensor layout produced by :func:`collate` (what a trainer must know):

* ``input_ids`` ``[R, P + T]`` = prompt **left**-padded to width ``P`` followed by the response
  **right**-padded to width ``T`` (verl's layout). Every row's response therefore occupies the same
  columns ``P .. P+T-1``, so response-token logits are one slice, ``logits[:, P-1 : P+T-1]``, and the
  model may be called with ``logits_to_keep=T + 1`` (HF) to skip the vocabulary projection over the
  prompt. :func:`gather_response_logprobs` accepts either full or kept logits.
* ``position_ids`` must be passed to the model: with left padding the default ``arange`` positions
  would be shifted per row. They are ``cumsum(attention_mask) - 1`` (0 on padding), i.e. exactly
  the positions of the unpadded sequence.
* ``[R, T]`` response tensors (``response_ids``, ``response_mask``, ``old_logprobs``) are aligned
  with ``Row.response_ids`` / ``Row.response_mask`` / ``Row.behaviour_logprobs``; padding has mask 0.
  Float tensors are float32 by default (``dtype=``), ids and masks of the model input are int64.
* Every row needs at least one prompt token (the first response token must be predicted by some
  position).
* Left padding creates query rows that attend to nothing (the pad positions). SDPA / flash attention
  and HF eager attention in float32/bf16 handle them (outputs at real tokens are exact; checked in
  tests against unpadded forwards), but HF *eager* attention in **float64** turns them into ``nan``
  that leaks into real positions: use ``sdpa`` if you run a model in float64.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from agents.rows import Row, group_rows_by_event
from learners.losses import logprobs_from_logits

__all__ = [
    "Batch",
    "EventBatches",
    "MiniBatch",
    "collate",
    "complete_events",
    "event_minibatches",
    "gather_response_logprobs",
]


# --------------------------------------------------------------------------------------------------
# event-atomic minibatches
# --------------------------------------------------------------------------------------------------


def _is_complete(rows: Sequence[Row]) -> bool:
    """Rows (sorted by member index) hold members ``0..K-1`` exactly once and agree on ``K``."""
    k = rows[0].k
    if k < 1 or any(r.k != k for r in rows):
        return False
    return [r.member_index for r in rows] == list(range(k))


def complete_events(rows: Sequence[Row]) -> tuple[dict[str, list[Row]], list[str]]:
    """Split rows into complete events and the ids of dropped ones.

    An event is kept iff its rows have member indices exactly ``0..K-1`` (so: not fewer rows than
    ``k``, no duplicate member index, none out of range) and agree on ``k``.

    Returns:
        ``(events, dropped_ids)``: ``event_id -> rows sorted by member_index`` in order of first
        appearance, and the dropped event ids in the same order.
    """
    kept: dict[str, list[Row]] = {}
    dropped: list[str] = []
    for event_id, event_rows in group_rows_by_event(rows).items():
        if _is_complete(event_rows):
            kept[event_id] = event_rows
        else:
            dropped.append(event_id)
    return kept, dropped


@dataclass
class MiniBatch:
    """Whole events packed together.

    Attributes:
        rows: the rows, event after event, each event's rows in member order.
        event_ids: the minibatch's events; ``event_ids[i]`` is event ``i`` of ``event_index``.
        event_index: ``LongTensor[R]`` row -> minibatch-local event ``0..E_mb-1`` (what
            :func:`learners.losses.srpo_loss` takes).
        dropped_events: incomplete events dropped from the *whole input* the minibatches were built
            from (the same number on every minibatch of one call; log it, do not sum it).
    """

    rows: list[Row]
    event_ids: list[str]
    event_index: Tensor
    dropped_events: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_events(self) -> int:
        return len(self.event_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(sum(r.response_mask) for r in self.rows)

    def event_values(self, values: Mapping[str, float], dtype: torch.dtype = torch.float32) -> Tensor:
        """``[E_mb]`` tensor of per-event values (e.g. advantages) in this minibatch's event order.

        ``values`` maps event id -> value, e.g. ``dict(zip(*event_advantages_from_rows(rows)))``
        after ``.tolist()`` of the tensor.
        """
        missing = [e for e in self.event_ids if e not in values]
        if missing:
            raise KeyError(f"no value for {len(missing)} event(s), e.g. {missing[0]!r}")
        return torch.tensor([float(values[e]) for e in self.event_ids], dtype=dtype)

    def collate(self, pad_id: int, dtype: torch.dtype = torch.float32) -> Batch:
        """:func:`collate` of the rows, carrying ``event_index``."""
        return collate(self.rows, pad_id, dtype=dtype, event_index=self.event_index)


@dataclass
class EventBatches:
    """Result of :func:`event_minibatches`: the minibatches plus what was dropped (iterable)."""

    batches: list[MiniBatch]
    dropped_events: int
    dropped_event_ids: list[str]

    def __iter__(self) -> Iterator[MiniBatch]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> MiniBatch:
        return self.batches[i]


def event_minibatches(
    rows: Sequence[Row],
    rows_per_batch: int | None = None,
    events_per_batch: int | None = None,
    seed: int | np.random.Generator | None = None,
    shuffle: bool = True,
) -> EventBatches:
    """Drop incomplete events, shuffle whole events, pack them into minibatches.

    Packing is greedy in (shuffled) event order: a minibatch is closed when adding the next event
    would exceed ``rows_per_batch`` rows or ``events_per_batch`` events (whichever are given; neither:
    one minibatch). An event larger than ``rows_per_batch`` goes alone in its own minibatch: it is
    never split. Hence minibatches hold *at most* ``rows_per_batch`` rows except for such events.

    Args:
        rows: rows of any number of events, in any order.
        rows_per_batch / events_per_batch: packing targets (positive).
        seed: int / ``numpy.random.Generator`` / None for the event shuffle (same seed and same input
            order -> same minibatches).
        shuffle: False keeps events in order of first appearance.
    """
    if rows_per_batch is not None and rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be >= 1, got {rows_per_batch}")
    if events_per_batch is not None and events_per_batch < 1:
        raise ValueError(f"events_per_batch must be >= 1, got {events_per_batch}")
    events, dropped = complete_events(rows)
    order = list(events)
    if shuffle and order:
        rng = np.random.default_rng(seed)
        order = [order[i] for i in rng.permutation(len(order))]

    groups: list[list[str]] = []
    cur: list[str] = []
    cur_rows = 0
    for event_id in order:
        k = len(events[event_id])
        too_many_rows = rows_per_batch is not None and cur_rows + k > rows_per_batch
        too_many_events = events_per_batch is not None and len(cur) + 1 > events_per_batch
        if cur and (too_many_rows or too_many_events):
            groups.append(cur)
            cur, cur_rows = [], 0
        cur.append(event_id)
        cur_rows += k
    if cur:
        groups.append(cur)

    batches = []
    for ids in groups:
        mb_rows = [r for e in ids for r in events[e]]
        sizes = torch.tensor([len(events[e]) for e in ids], dtype=torch.long)
        index = torch.repeat_interleave(torch.arange(len(ids), dtype=torch.long), sizes)
        batches.append(MiniBatch(mb_rows, list(ids), index, len(dropped)))
    return EventBatches(batches, len(dropped), dropped)


# --------------------------------------------------------------------------------------------------
# collation
# --------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Padded tensors for one forward pass (layout: see the module docstring).

    Attributes:
        input_ids: ``[R, P+T]`` int64, prompt left-padded, response right-padded with ``pad_id``.
        attention_mask: ``[R, P+T]`` int64, 1 on real (prompt or response) tokens.
        position_ids: ``[R, P+T]`` int64, positions of the unpadded sequence (0 on padding).
        response_ids: ``[R, T]`` int64, the response tokens (``pad_id`` on padding).
        response_mask: ``[R, T]`` float, the loss mask: ``Row.response_mask``, 0 on padding.
        response_attention: ``[R, T]`` float, 1 on every real response token (policy or env text).
        old_logprobs: ``[R, T]`` float, ``Row.behaviour_logprobs``, 0 on padding.
        rewards: ``[R]`` float, ``Row.reward``.
        event_index: ``[R]`` int64 or None (set when collated from a :class:`MiniBatch`).
        prompt_width: ``P``.
        response_width: ``T``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    response_ids: Tensor
    response_mask: Tensor
    response_attention: Tensor
    old_logprobs: Tensor
    rewards: Tensor
    event_index: Tensor | None
    prompt_width: int
    response_width: int

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def model_inputs(self) -> dict[str, Tensor]:
        """Keyword arguments for an HF causal LM forward (add ``logits_to_keep=T+1`` if wanted)."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }

    def to(self, device: torch.device | str) -> Batch:
        """Copy with every tensor moved to ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)


def collate(
    rows: Sequence[Row],
    pad_id: int,
    dtype: torch.dtype = torch.float32,
    event_index: Tensor | None = None,
) -> Batch:
    """Pad rows into a :class:`Batch` (prompt left-padded, response right-padded).

    Raises:
        ValueError: no rows, a row without prompt tokens, no response token in the whole batch, or
            ``event_index`` of the wrong length.
    """
    n = len(rows)
    if n == 0:
        raise ValueError("collate needs at least one row")
    p_lens = np.array([len(r.prompt_ids) for r in rows], dtype=np.int64)
    t_lens = np.array([len(r.response_ids) for r in rows], dtype=np.int64)
    if (p_lens == 0).any():
        raise ValueError("every row needs >= 1 prompt token (the first response token is predicted from it)")
    P, T = int(p_lens.max()), int(t_lens.max())
    if T == 0:
        raise ValueError("no response tokens in the batch")
    if event_index is not None and tuple(event_index.shape) != (n,):
        raise ValueError(f"event_index must be [R={n}], got {tuple(event_index.shape)}")

    ids = np.full((n, P + T), pad_id, dtype=np.int64)
    attn = np.zeros((n, P + T), dtype=np.int64)
    loss_mask = np.zeros((n, T), dtype=np.float64)
    old = np.zeros((n, T), dtype=np.float64)
    for i, r in enumerate(rows):
        p, t = p_lens[i], t_lens[i]
        ids[i, P - p : P] = r.prompt_ids
        ids[i, P : P + t] = r.response_ids
        attn[i, P - p : P + t] = 1
        loss_mask[i, :t] = r.response_mask
        old[i, :t] = r.behaviour_logprobs
    input_ids = torch.from_numpy(ids)
    attention_mask = torch.from_numpy(attn)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0) * attention_mask
    response_attention = attention_mask[:, P:].to(dtype)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        response_ids=input_ids[:, P:].clone(),
        response_mask=torch.from_numpy(loss_mask).to(dtype) * response_attention,
        response_attention=response_attention,
        old_logprobs=torch.from_numpy(old).to(dtype),
        rewards=torch.tensor([r.reward for r in rows], dtype=dtype),
        event_index=None if event_index is None else event_index.to(torch.long),
        prompt_width=P,
        response_width=T,
    )


def gather_response_logprobs(logits: Tensor, batch: Batch, temperature: float = 1.0) -> Tensor:
    """``[R, T]`` log-probs of the response tokens, aligned with ``batch.old_logprobs``.

    ``logits`` is ``[R, N, V]`` covering the *last* ``N`` positions of ``batch.input_ids`` with
    ``N >= T + 1``: the full ``[R, P+T, V]`` output, or the output of ``logits_to_keep=T + 1``.
    Response token ``j`` sits at column ``P + j`` and is predicted by the logits at ``P + j - 1``, so
    the slice is ``logits[:, N-T-1 : N-1]``. Half-precision logits are upcast to float32; padded
    positions hold finite garbage (mask them).
    """
    T = batch.response_width
    if logits.ndim != 3 or logits.shape[0] != batch.num_rows:
        raise ValueError(f"logits must be [R={batch.num_rows}, N, V], got {tuple(logits.shape)}")
    n = logits.shape[1]
    if n < T + 1 or n > batch.input_ids.shape[1]:
        raise ValueError(f"logits cover {n} positions; need T+1={T + 1} .. P+T={batch.input_ids.shape[1]}")
    labels = batch.response_ids.to(logits.device)
    return logprobs_from_logits(logits[:, n - T - 1 : n - 1], labels, temperature)
