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

from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agents.layout import pad_prompt_response
from agents.rows import Row, group_rows_by_event
from learners.losses import logprobs_from_logits

__all__ = [
    "Batch",
    "EventBatches",
    "EventTable",
    "MiniBatch",
    "build_event_table",
    "collate",
    "complete_events",
    "event_minibatches",
    "gather_response_logprobs",
    "micro_batch_bounds",
    "prefix_micro_batches",
    "shard_minibatch",
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


# --------------------------------------------------------------------------------------------------
# the batch's events, built once
# --------------------------------------------------------------------------------------------------


def _first_appearance_ids(keys: Sequence[Hashable]) -> tuple[Tensor, list[Hashable]]:
    """Dense ids ``0..G-1`` numbered in order of first appearance, and the distinct keys."""
    ids: dict[Hashable, int] = {}
    dense = [ids.setdefault(key, len(ids)) for key in keys]
    return torch.tensor(dense, dtype=torch.long), list(ids)


@dataclass
class EventTable:
    """Every index an advantage estimator or a loss needs, built once per rollout batch.

    Why one table: the events of a batch (which rows belong together, their rewards, their groups of
    comparable events, their episodes) used to be rebuilt from rows by every consumer (advantages,
    MAPPO's critic inputs, the critic step, minibatching). Here they are computed once and every
    consumer reads tensors plus indices.

    Events are numbered ``0..E-1`` in order of first appearance in ``rows``; episodes ``0..N-1`` and
    roles likewise. Rows of an event must agree on the event's reward and comparable key.

    Attributes:
        rows: the batch's rows, in input order (row ``i`` of every ``[R]`` tensor).
        event_ids: ``E`` event ids.
        event_rows: per event, the positions of its rows in ``rows`` sorted by member index.
        complete: per event, whether its rows are members ``0..K-1`` exactly once with one ``k``
            (incomplete events give their reward to their group's baseline but are never trained on).
        row_event: ``LongTensor[R]`` row -> event.
        row_episode: ``LongTensor[R]`` row -> episode.
        row_role: ``LongTensor[R]`` row -> index into ``roles``.
        event_reward: ``float64[E]`` the event's reward (:attr:`agents.rows.Row.reward`: the team
            outcome minus the event's own penalty).
        event_penalty: ``float64[E]`` the event's penalty (:attr:`agents.rows.Row.penalty`).
        event_k: ``LongTensor[E]`` the event's K.
        event_step: ``LongTensor[E]`` its step within the episode.
        event_group: ``LongTensor[E]`` group of comparable events: same task group and same
            ``(task_id, event_type, step)`` (:func:`learners.advantages.event_group_key`).
        event_episode: ``LongTensor[E]`` event -> episode.
        episode_ids: ``N`` episode ids.
        episode_group: ``LongTensor[N]`` episode -> task group (the G rollouts of one task).
        episode_outcome: ``float64[N]`` the episode's team outcome.
        roles: the distinct roles.
        episode_member_cost: ``float64[N]`` the part of the outcome the env charged for the members the
            episode sent (:attr:`agents.rows.Row.member_cost`; 0 where the env charges none).
    """

    rows: list[Row]
    event_ids: list[str]
    event_rows: list[list[int]]
    complete: list[bool]
    row_event: Tensor
    row_episode: Tensor
    row_role: Tensor
    event_reward: Tensor
    event_penalty: Tensor
    event_k: Tensor
    event_step: Tensor
    event_group: Tensor
    event_episode: Tensor
    episode_ids: list[str]
    episode_group: Tensor
    episode_outcome: Tensor
    roles: list[str]
    episode_member_cost: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_events(self) -> int:
        return len(self.event_ids)

    def first_rows(self) -> list[Row]:
        """The first row (member 0 where present) of every event, in event order."""
        return [self.rows[r[0]] for r in self.event_rows]

    def event_row(self, e: int) -> Row:
        return self.rows[self.event_rows[e][0]]

    def episode_return(self) -> Tensor:
        """``float64[N]`` the team's undiscounted return: outcome minus every event's penalty.

        The one reward definition every output-level algorithm reads (GRPO, RLOO, GSPO, Dr.GRPO,
        Dr. MAS); MAPPO's per-step rewards sum to it; SRPO's event reward is its per-event form.
        """
        pen = torch.zeros_like(self.episode_outcome).index_add_(0, self.event_episode, self.event_penalty)
        return self.episode_outcome - pen

    def without_member_cost(self) -> EventTable:
        """This table with the member cost added back to every reward term: what the outcome alone is
        (``TrainConfig.member_cost_advantage="apart"`` normalises it apart from the cost)."""
        cost = self.episode_member_cost if self.episode_member_cost is not None else torch.zeros_like(self.episode_outcome)
        return replace(
            self,
            event_reward=self.event_reward + cost[self.event_episode],
            episode_outcome=self.episode_outcome + cost,
            episode_member_cost=torch.zeros_like(cost),
        )

    def k_histogram(self) -> dict[int, int]:
        """K -> number of events with that K."""
        ks, counts = torch.unique(self.event_k, return_counts=True)
        return {int(k): int(c) for k, c in zip(ks.tolist(), counts.tolist(), strict=True)}


def build_event_table(rows: Sequence[Row]) -> EventTable:
    """Group rows into events once (see :class:`EventTable`).

    Raises:
        ValueError: no rows, rows of one event that disagree on reward, penalty or comparable key, or
            rows of one episode that disagree on its outcome or task group.
    """
    if not rows:
        raise ValueError("build_event_table needs at least one row")
    rows = list(rows)
    row_event, event_ids = _first_appearance_ids([r.event_id for r in rows])
    members: list[list[int]] = [[] for _ in event_ids]
    for i, e in enumerate(row_event.tolist()):
        members[e].append(i)
    event_rows = [sorted(m, key=lambda i: rows[i].member_index) for m in members]
    first = [rows[m[0]] for m in members]  # first *appearance*: the reference for agreement checks
    for e, m in enumerate(members):
        ref = first[e]
        for i in m[1:]:
            r = rows[i]
            if (r.reward, r.penalty, r.group_id, r.comparable_key) != (
                ref.reward,
                ref.penalty,
                ref.group_id,
                ref.comparable_key,
            ):
                raise ValueError(
                    f"rows of event {r.event_id!r} disagree: reward {ref.reward} vs {r.reward}, penalty "
                    f"{ref.penalty} vs {r.penalty}, key {(ref.group_id, *ref.comparable_key)} vs "
                    f"{(r.group_id, *r.comparable_key)}"
                )
    row_episode, episode_ids = _first_appearance_ids([r.episode_id for r in rows])
    row_role, roles = _first_appearance_ids([r.role for r in rows])
    event_episode = row_episode[torch.tensor([m[0] for m in members], dtype=torch.long)]
    episode_first: dict[int, Row] = {}
    for i, ep in enumerate(row_episode.tolist()):
        ref = episode_first.setdefault(ep, rows[i])
        mine = (rows[i].outcome_reward, rows[i].group_id, rows[i].member_cost)
        if (ref.outcome_reward, ref.group_id, ref.member_cost) != mine:
            raise ValueError(
                f"rows of episode {ref.episode_id!r} disagree on outcome_reward, group_id or member_cost: "
                f"{(ref.outcome_reward, ref.group_id, ref.member_cost)} vs {mine}"
            )
    episode_group, _ = _first_appearance_ids([episode_first[n].group_id for n in range(len(episode_ids))])
    event_group, _ = _first_appearance_ids([(r.group_id, *r.comparable_key) for r in first])
    return EventTable(
        rows=rows,
        event_ids=[str(e) for e in event_ids],
        event_rows=event_rows,
        complete=[_is_complete([rows[i] for i in m]) for m in event_rows],
        row_event=row_event,
        row_episode=row_episode,
        row_role=row_role,
        event_reward=torch.tensor([r.reward for r in first], dtype=torch.float64),
        event_penalty=torch.tensor([r.penalty for r in first], dtype=torch.float64),
        event_k=torch.tensor([r.k for r in first], dtype=torch.long),
        event_step=torch.tensor([r.step for r in first], dtype=torch.long),
        event_group=event_group,
        event_episode=event_episode,
        episode_ids=[str(e) for e in episode_ids],
        episode_group=episode_group,
        episode_outcome=torch.tensor(
            [episode_first[n].outcome_reward for n in range(len(episode_ids))], dtype=torch.float64
        ),
        roles=[str(r) for r in roles],
        episode_member_cost=torch.tensor(
            [episode_first[n].member_cost for n in range(len(episode_ids))], dtype=torch.float64
        ),
    )


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
        row_index: ``LongTensor[R]`` each row's position in the :class:`EventTable` it came from
            (gather per-row values such as advantages with it).
        event_pos: ``LongTensor[E_mb]`` each event's position in that table.
    """

    rows: list[Row]
    event_ids: list[str]
    event_index: Tensor
    dropped_events: int = 0
    row_index: Tensor | None = None
    event_pos: Tensor | None = None

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

    def collate(
        self,
        pad_id: int,
        dtype: torch.dtype = torch.float32,
        table: EventTable | None = None,
        advantages: Tensor | None = None,
        token_weights: Tensor | None = None,
    ) -> Batch:
        """:func:`collate` of the rows, carrying ``event_index``; with the :class:`EventTable` the
        minibatch came from, also each row's comparable group and role, and ``advantages`` (the
        table-wide ``[R_table]`` per-row tensor) and ``token_weights`` (table-wide ``[R_table, T']``
        per-token loss weights, ``T'`` at least this minibatch's response width) gathered with
        :attr:`row_index`."""
        extra: dict[str, Tensor] = {}
        if table is not None or advantages is not None or token_weights is not None:
            if self.row_index is None:
                raise ValueError("table indices need a minibatch built from an EventTable (row_index)")
            if advantages is not None:
                extra["advantages"] = advantages[self.row_index]
            if token_weights is not None:
                extra["token_weights"] = token_weights[self.row_index]
            if table is not None:
                extra["group_index"] = table.event_group[table.row_event[self.row_index]]
                extra["row_role"] = table.row_role[self.row_index]
        return collate(self.rows, pad_id, dtype=dtype, event_index=self.event_index, **extra)


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
    rows: Sequence[Row] | EventTable,
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
        rows: rows of any number of events, in any order, or the :class:`EventTable` built from them
            (the trainer passes the table so events are grouped once per batch).
        rows_per_batch / events_per_batch: packing targets (positive).
        seed: int / ``numpy.random.Generator`` / None for the event shuffle (same seed and same input
            order -> same minibatches).
        shuffle: False keeps events in order of first appearance.
    """
    if rows_per_batch is not None and rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be >= 1, got {rows_per_batch}")
    if events_per_batch is not None and events_per_batch < 1:
        raise ValueError(f"events_per_batch must be >= 1, got {events_per_batch}")
    if isinstance(rows, EventTable):
        table = rows
    elif not rows:
        return EventBatches([], 0, [])
    else:
        table = build_event_table(rows)
    order = [e for e in range(table.num_events) if table.complete[e]]
    dropped = [table.event_ids[e] for e in range(table.num_events) if not table.complete[e]]
    if shuffle and order:
        rng = np.random.default_rng(seed)
        order = [order[i] for i in rng.permutation(len(order))]

    groups: list[list[int]] = []
    cur: list[int] = []
    cur_rows = 0
    for e in order:
        k = len(table.event_rows[e])
        too_many_rows = rows_per_batch is not None and cur_rows + k > rows_per_batch
        too_many_events = events_per_batch is not None and len(cur) + 1 > events_per_batch
        if cur and (too_many_rows or too_many_events):
            groups.append(cur)
            cur, cur_rows = [], 0
        cur.append(e)
        cur_rows += k
    if cur:
        groups.append(cur)

    batches = []
    for ids in groups:
        positions = [i for e in ids for i in table.event_rows[e]]
        sizes = torch.tensor([len(table.event_rows[e]) for e in ids], dtype=torch.long)
        index = torch.repeat_interleave(torch.arange(len(ids), dtype=torch.long), sizes)
        batches.append(
            MiniBatch(
                [table.rows[i] for i in positions],
                [table.event_ids[e] for e in ids],
                index,
                len(dropped),
                row_index=torch.tensor(positions, dtype=torch.long),
                event_pos=torch.tensor(ids, dtype=torch.long),
            )
        )
    return EventBatches(batches, len(dropped), dropped)


def micro_batch_bounds(
    rows: Sequence[Row], event_index: Tensor, max_tokens: int | None
) -> list[tuple[int, int]]:
    """Split a minibatch's rows into contiguous, event-atomic ``[start, end)`` ranges.

    A range is closed when adding the next event would exceed ``max_tokens`` prompt + response
    tokens (an event over the budget goes alone: events are never split, SRPO's ratio needs all
    members). ``max_tokens=None``: one range. ``rows`` must be event after event (as
    :class:`MiniBatch` holds them).
    """
    n = len(rows)
    if max_tokens is None or n == 0:
        return [(0, n)]
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    idx = event_index.tolist()
    bounds: list[tuple[int, int]] = []
    start, used, i = 0, 0, 0
    while i < n:
        j = i
        cost = 0
        while j < n and idx[j] == idx[i]:
            cost += len(rows[j].prompt_ids) + len(rows[j].response_ids)
            j += 1
        if i > start and used + cost > max_tokens:
            bounds.append((start, i))
            start, used = i, 0
        used += cost
        i = j
    bounds.append((start, n))
    return bounds


def _trie_insert(trie: dict[int, Any], seq: Sequence[int]) -> int:
    """Insert ``seq`` into a nested-dict prefix tree; return how many nodes it added."""
    added = 0
    node = trie
    for tok in seq:
        child = node.get(tok)
        if child is None:
            child = node[tok] = {}
            added += 1
        node = child
    return added


def prefix_micro_batches(rows: Sequence[Row], event_index: Tensor, max_tokens: int | None) -> list[list[int]]:
    """Event-atomic micro-batches for a prefix-tree forward (:func:`learners.prefix.pack_rows`).

    Why not :func:`micro_batch_bounds`: a prefix-tree forward computes each distinct prefix once, so
    a micro-batch costs the nodes of its rows' prefix tree, not their summed lengths, and rows that
    share prefixes (a task's G samples, an episode's proposers) should land in the same micro-batch.
    Events are ordered by their smallest ``prompt + response`` sequence (so events on one prompt are
    adjacent) and a micro-batch is closed when the next event would take its tree past
    ``max_tokens`` nodes (an event over the budget goes alone; events are never split). The gradient
    is a sum over events, so the order only changes float summation order. ``max_tokens=None``: one
    micro-batch with every row in input order.

    Returns the row indices (into ``rows``) of each micro-batch.
    """
    n = len(rows)
    if n == 0:
        return []
    if max_tokens is None:
        return [list(range(n))]
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    members: dict[int, list[int]] = {}
    for i, e in enumerate(event_index.tolist()):
        members.setdefault(e, []).append(i)
    seqs = [(*r.prompt_ids, *r.response_ids) for r in rows]
    return prefix_chunks(seqs, list(members.values()), max_tokens)


def prefix_chunks(
    seqs: Sequence[Sequence[int]], groups: Sequence[list[int]], max_tokens: int
) -> list[list[int]]:
    """Groups of ``seqs`` (indices; a group is never split) in chunks whose prefix tree holds at most
    ``max_tokens`` nodes (a group over the budget goes alone), groups ordered by their smallest
    sequence so that groups sharing prefixes land in one chunk. Returns the indices of each chunk.
    The core of :func:`prefix_micro_batches`; MAPPO's packed critic chunks its states with it too."""
    order = sorted(groups, key=lambda m: min(tuple(seqs[i]) for i in m))
    out: list[list[int]] = []
    cur: list[int] = []
    trie: dict[int, Any] = {}
    used = 0
    for event_rows in order:
        cost = sum(_trie_insert(trie, seqs[i]) for i in event_rows)
        if cur and used + cost > max_tokens:
            out.append(cur)
            trie = {}
            cur, used = [], sum(_trie_insert(trie, seqs[i]) for i in event_rows)
        else:
            used += cost
        cur.extend(event_rows)
    out.append(cur)
    return out


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
        advantages: ``[R]`` per-row advantage (rows of an event share it), or None.
        group_index: ``[R]`` int64 each row's group of comparable events, or None.
        row_role: ``[R]`` int64 each row's role (index into :attr:`EventTable.roles`), or None.
        token_weights: ``[R, T]`` float per-token loss weights (token-level truncated importance
            sampling, ``LossConfig.token_weights``), or None.
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
    advantages: Tensor | None = None
    group_index: Tensor | None = None
    row_role: Tensor | None = None
    token_weights: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_events(self) -> int:
        return 0 if self.event_index is None or self.num_rows == 0 else int(self.event_index.max()) + 1

    def event_advantages(self) -> Tensor:
        """``[E]`` one advantage per event (rows of an event share it; read at each event's rows)."""
        if self.advantages is None or self.event_index is None:
            raise ValueError("event_advantages needs a batch collated with advantages and event_index")
        out = torch.zeros(self.num_events, dtype=self.advantages.dtype)
        return out.index_copy(0, self.event_index, self.advantages)

    def take(self, index: Sequence[int] | Tensor) -> Batch:
        """The rows ``index`` (in that order) with padding trimmed to their own widths.

        Equal to :func:`collate` of those rows (same ``pad_id``), without touching the rows again:
        the left-padded prompt block keeps its last ``P'`` columns and the response block its first
        ``T'``. ``event_index`` is renumbered ``0..E'-1`` in order of first appearance.
        """
        idx = torch.as_tensor(index, dtype=torch.long)
        if idx.numel() == 0:
            raise ValueError("take needs at least one row")
        P = self.prompt_width
        attn = self.attention_mask[idx]
        p_new = int(attn[:, :P].sum(-1).max())
        resp = self.response_attention[idx]
        t_new = int(resp.sum(-1).max())
        if t_new == 0:
            raise ValueError("no response tokens in the selected rows")
        cols = slice(P - p_new, P + t_new)
        event_index = None
        if self.event_index is not None:
            event_index = _first_appearance_ids(self.event_index[idx].tolist())[0]

        def rows_of(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[idx]

        return Batch(
            input_ids=self.input_ids[idx][:, cols],
            attention_mask=attn[:, cols],
            position_ids=self.position_ids[idx][:, cols],
            response_ids=self.response_ids[idx][:, :t_new],
            response_mask=self.response_mask[idx][:, :t_new],
            response_attention=resp[:, :t_new],
            old_logprobs=self.old_logprobs[idx][:, :t_new],
            rewards=self.rewards[idx],
            event_index=event_index,
            prompt_width=p_new,
            response_width=t_new,
            advantages=rows_of(self.advantages),
            group_index=rows_of(self.group_index),
            row_role=rows_of(self.row_role),
            token_weights=None if self.token_weights is None else self.token_weights[idx][:, :t_new],
        )

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
    advantages: Tensor | None = None,
    group_index: Tensor | None = None,
    row_role: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> Batch:
    """Pad rows into a :class:`Batch` (prompt left-padded, response right-padded).

    ``advantages`` (float, converted to ``dtype``), ``group_index`` and ``row_role`` are optional
    ``[R]`` per-row tensors carried along (see :meth:`MiniBatch.collate`); ``token_weights`` an
    optional ``[R, T']`` float tensor (``T'`` >= the response width ``T``; cut to ``T``, 0 on padding).

    Raises:
        ValueError: no rows, a row without prompt tokens, no response token in the whole batch, or
            an ``[R]`` tensor of the wrong length.
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
    for name, t in (
        ("event_index", event_index),
        ("advantages", advantages),
        ("group_index", group_index),
        ("row_role", row_role),
    ):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"{name} must be [R={n}], got {tuple(t.shape)}")
    if token_weights is not None and (
        token_weights.ndim != 2 or token_weights.shape[0] != n or token_weights.shape[1] < T
    ):
        raise ValueError(f"token_weights must be [R={n}, >= T={T}], got {tuple(token_weights.shape)}")

    input_ids, attention_mask, position_ids, _ = pad_prompt_response(
        [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id
    )  # the sampler's layout (agents.layout), so recomputed log-probs match the behaviour ones
    loss_mask = np.zeros((n, T), dtype=np.float64)
    old = np.zeros((n, T), dtype=np.float64)
    for i, r in enumerate(rows):
        t = t_lens[i]
        loss_mask[i, :t] = r.response_mask
        old[i, :t] = r.behaviour_logprobs
    response_attention = attention_mask[:, P:].to(dtype)
    weights = None if token_weights is None else token_weights[:, :T].to(dtype) * response_attention
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
        advantages=None if advantages is None else advantages.to(dtype),
        group_index=None if group_index is None else group_index.to(torch.long),
        row_role=None if row_role is None else row_role.to(torch.long),
        token_weights=weights,
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


# --------------------------------------------------------------------------------------------------
# data-parallel sharding
# --------------------------------------------------------------------------------------------------


def shard_minibatch(mb: MiniBatch, rank: int, world_size: int) -> MiniBatch:
    """This rank's share of a minibatch for a data-parallel update: whole events only.

    Why event-atomic: SRPO's ratio is a function of all K members of an event, so an event split
    across ranks would be computed from a subset of its members. Each rank takes a *contiguous* run of
    the minibatch's events, cut where the running prompt + response token count crosses
    ``rank / world_size`` of the total (so ranks get about equal compute); every event goes to exactly
    one rank and the shards concatenated in rank order are the minibatch. Everything that needs the
    whole batch (advantages, group statistics, the loss normaliser) must be computed before sharding:
    a shard only carries the rows, its re-numbered ``event_index`` and the table positions
    (``row_index``/``event_pos``) to gather such values. A rank may get no event (fewer events than
    ranks); it must still take part in the gradient all-reduce.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    idx = mb.event_index.tolist()
    cost = [0] * mb.num_events
    for row, e in zip(mb.rows, idx, strict=True):
        cost[e] += len(row.prompt_ids) + len(row.response_ids)
    total = sum(cost)
    owner: list[int] = []
    done = 0
    for c in cost:
        # the event belongs to the rank whose share of the total contains the event's midpoint
        owner.append(min(world_size - 1, int((done + c / 2) * world_size // max(total, 1))))
        done += c
    mine = [e for e in range(mb.num_events) if owner[e] == rank]
    local = {e: i for i, e in enumerate(mine)}
    positions = [i for i, e in enumerate(idx) if e in local]
    pos_t = torch.tensor(positions, dtype=torch.long)
    return MiniBatch(
        rows=[mb.rows[i] for i in positions],
        event_ids=[mb.event_ids[e] for e in mine],
        event_index=torch.tensor([local[idx[i]] for i in positions], dtype=torch.long),
        dropped_events=mb.dropped_events,
        row_index=None if mb.row_index is None else mb.row_index[pos_t],
        event_pos=None if mb.event_pos is None else mb.event_pos[torch.tensor(mine, dtype=torch.long)],
    )
