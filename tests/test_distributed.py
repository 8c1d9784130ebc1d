"""Data-parallel learner: event-atomic sharding of a minibatch across ranks."""

from __future__ import annotations

import pytest
import torch

from agents.rows import Row
from learners.batching import event_minibatches, shard_minibatch


def _row(event_id: str, member: int, k: int, n_tokens: int) -> Row:
    return Row(
        event_id=event_id,
        episode_id=event_id.split("/")[0],
        pre_state_id="s",
        event_type="t",
        step=0,
        agent=f"a{member}",
        role="r",
        member_index=member,
        k=k,
        prompt_ids=[5, 6],
        response_ids=[7] * n_tokens,
        response_mask=[1] * n_tokens,
        behaviour_logprobs=[-0.1] * n_tokens,
        policy_version=0,
        task_id="t",
        group_id="g",
        reward=1.0,
    )


def _rows(ks: list[int]) -> list[Row]:
    return [_row(f"ep{e}/0", m, k, n_tokens=1 + (3 * e + m) % 7) for e, k in enumerate(ks) for m in range(k)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("ks", [[1, 3, 2, 4, 1, 2], [4], [2, 2, 2, 2, 2, 2, 2, 2]])
def test_shards_partition_the_minibatch_by_whole_events(ks: list[int], world_size: int) -> None:
    (mb,) = event_minibatches(_rows(ks), seed=3)
    shards = [shard_minibatch(mb, r, world_size) for r in range(world_size)]
    # concatenated in rank order, the shards are the minibatch: nothing lost, duplicated or reordered
    assert [r for s in shards for r in s.rows] == mb.rows
    assert [e for s in shards for e in s.event_ids] == mb.event_ids
    assert torch.equal(torch.cat([s.row_index for s in shards]), mb.row_index)
    for s in shards:
        # whole events only, event_index renumbered 0..E_shard-1 in order
        assert s.event_index.tolist() == sorted(s.event_index.tolist())
        assert sorted(set(s.event_index.tolist())) == list(range(s.num_events))
        for e, event_id in enumerate(s.event_ids):
            members = [r for r, i in zip(s.rows, s.event_index.tolist(), strict=True) if i == e]
            assert {r.event_id for r in members} == {event_id}
            assert [r.member_index for r in members] == list(range(members[0].k))
    if world_size <= len(ks):  # enough events: every rank works, shares are about equal in tokens
        tokens = [sum(len(r.prompt_ids) + len(r.response_ids) for r in s.rows) for s in shards]
        assert min(tokens) > 0
        biggest_event = max(
            sum(len(r.prompt_ids) + len(r.response_ids) for r in mb.rows if r.event_id == e)
            for e in mb.event_ids
        )
        assert max(tokens) - min(tokens) <= 2 * biggest_event


def test_shard_rejects_bad_rank() -> None:
    (mb,) = event_minibatches(_rows([1, 2]), seed=0)
    with pytest.raises(ValueError):
        shard_minibatch(mb, 2, 2)
