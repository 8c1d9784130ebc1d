"""The team breakdown behind benchmarks/perf/bench_headroom.py, on a policy double with known answers."""

from __future__ import annotations

from collections.abc import Sequence

import srpo_envs
from agents.policy import Generation, GenerationRequest, PolicyMap
from agents.rollout import RolloutCollector
from benchmarks.perf.bench_headroom import team_breakdown


class VotingPolicy:
    """proposer_0/1 answer 5, proposer_2 answers 7, the aggregator picks 7 (the minority)."""

    policy_version = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for r in requests:
            text = "\\boxed{7}" if r.agent in ("proposer_2", "aggregator") else "x \\boxed{5}"
            ids = [ord(c) for c in text]
            out.append(Generation(text, ids, [-0.1] * len(ids), [1, 2], 0, "stop"))
        return out


def test_team_breakdown_counts_votes_and_copies() -> None:
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator"),
        PolicyMap.shared(VotingPolicy()),
    )
    batch = collector.collect([0, 1, 2], group_size=2, seed=0)
    gold = {e.task_id: "5" for e in batch.episodes}
    out = team_breakdown(batch, gold)
    assert out["proposer"] == 2 / 3
    assert out["majority"] == 1.0  # two of three say 5
    assert out["copies"] == 1.0  # 7 is a candidate's answer
    assert out["team"] == batch.accuracy
    out = team_breakdown(batch, {e.task_id: "7" for e in batch.episodes})
    assert (out["proposer"], out["majority"]) == (1 / 3, 0.0)
