"""Rollout collection: rows match the env's events, one batched call per round, save/load."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import srpo_envs
from agents.policy import Generation, GenerationRequest, PolicyMap
from agents.rollout import RolloutCollector
from agents.rows import group_rows_by_event, load_rows, save_rows


class EchoPolicy:
    """A policy double: answers ``\\boxed{<n>}`` with n from the request seed; ids are code points."""

    policy_version = 3

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.calls.append(len(requests))
        out = []
        for r in requests:
            text = f"\\boxed{{{(r.sampling.seed or 0) % 3 + 1}}}"
            ids = [ord(c) for c in text]
            prompt = r.prompt if isinstance(r.prompt, str) else r.prompt[-1]["content"]
            out.append(
                Generation(text, ids, [-0.5] * len(ids), [ord(c) % 256 for c in prompt[:20]], 3, "stop")
            )
        return out


@pytest.mark.parametrize("workflow", ["proposers-aggregator", "solver-verifier", "routed"])
def test_rows_match_events(workflow: str, tmp_path) -> None:
    policy = EchoPolicy()
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow=workflow), PolicyMap.shared(policy)
    )
    batch = collector.collect([0, 1, 2], group_size=4, seed=7)
    assert len(batch.episodes) == 12
    by_event = group_rows_by_event(batch.rows)
    n_events = 0
    for events in batch.events.values():
        for e in events:
            n_events += 1
            rows = by_event[e.event_id]
            assert tuple(r.agent for r in rows) == e.members
            assert all(r.k == e.k == len(rows) for r in rows)
            assert all(r.reward == e.reward and r.event_type == e.event_type for r in rows)
            assert all(r.pre_state_id == e.pre_state_id for r in rows)
            assert [r.member_index for r in rows] == list(range(len(rows)))
    assert n_events == len(by_event)
    # every round batched all active agents of all 12 envs into one call
    assert policy.calls[0] == sum(len(evs[0].members) for evs in batch.events.values())
    # groups: the 4 rollouts of a task share a group id, tasks differ
    assert len({r.group_id for r in batch.rows}) == 3
    assert all(r.policy_version == 3 for r in batch.rows)
    for ep in batch.episodes:
        assert ep.team_tokens == sum(len(r.response_ids) for r in batch.rows if r.episode_id == ep.episode_id)
    for suffix in (".jsonl", ".parquet"):
        path = save_rows(batch.rows, tmp_path / f"rows{suffix}")
        assert load_rows(path) == batch.rows


def test_collection_is_reproducible() -> None:
    def run() -> list:
        c = RolloutCollector(
            lambda: srpo_envs.make("ProcArith-v0", workflow="routed"), PolicyMap.shared(EchoPolicy())
        )
        return c.collect([0, 5], group_size=3, seed=11).rows

    assert run() == run()


@pytest.mark.parametrize("workflow", ["proposers-aggregator", "solver-verifier", "routed"])
def test_tiny_model_rollout_rows_match_events(workflow: str, tiny_model_dir) -> None:
    from agents.hf import HFPolicy
    from agents.policy import SamplingParams

    policy = HFPolicy(tiny_model_dir)
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow=workflow),
        PolicyMap.shared(policy),
        SamplingParams(temperature=1.0, max_new_tokens=12),
    )
    batch = collector.collect([0, 1], group_size=2, seed=3)
    by_event = group_rows_by_event(batch.rows)
    for events in batch.events.values():
        for e in events:
            rows = by_event[e.event_id]
            assert tuple(r.agent for r in rows) == e.members and all(
                r.k == e.k for r in rows
            )
            for r in rows:
                assert r.response_text == e.outputs[r.agent]
                assert len(r.behaviour_logprobs) == len(r.response_ids) > 0
    recomputed = policy.compute_logprobs(
        [r.prompt_ids for r in batch.rows], [r.response_ids for r in batch.rows]
    )
    diff = max(
        abs(a - b)
        for r, lp in zip(batch.rows, recomputed, strict=True)
        for a, b in zip(r.behaviour_logprobs, lp, strict=True)
    )
    assert diff <= 1e-4
