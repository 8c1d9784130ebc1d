"""Rollout/training mismatch: stale-row refusal, truncated importance weights, mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch

from agents.rows import Row
from learners.offpolicy import mismatch_metrics, refuse_stale_events, tis_weights

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)


def _row(event: str, member: int, version: int) -> Row:
    return Row(
        event_id=event, episode_id="ep", pre_state_id="s", event_type="t", step=0, agent=f"a{member}",
        role="r", member_index=member, k=2, prompt_ids=[1], response_ids=[2], response_mask=[1],
        behaviour_logprobs=[-1.0], policy_version=version, task_id="t", group_id="g", reward=0.0,
    )  # fmt: skip


def test_stale_events_are_refused_whole() -> None:
    rows = [_row("e0", 0, 5), _row("e0", 1, 5), _row("e1", 0, 5), _row("e1", 1, 3), _row("e2", 0, 4)]
    kept, refused = refuse_stale_events(rows, lambda r: 5, max_lag=1)
    assert [r.event_id for r in kept] == ["e0", "e0", "e2"]  # e1 has a member 2 versions behind
    assert refused == 1
    kept, refused = refuse_stale_events(rows, lambda r: 5, max_lag=0)
    assert [r.event_id for r in kept] == ["e0", "e0"] and refused == 2
    with pytest.raises(ValueError, match="newer"):
        refuse_stale_events(rows, lambda r: 4)


def test_tis_weights_token_sequence_event() -> None:
    train = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -1.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    tok = tis_weights(train, rollout, mask, level="token", cap=1.5)
    expected = torch.tensor([[min(math.exp(0.5), 1.5), math.exp(-1.0), 1.0], [math.exp(0.2), 1.0, 0.0]])
    assert torch.allclose(tok, expected.double())
    seq = tis_weights(train, rollout, mask, level="sequence", cap=10.0)
    assert torch.allclose(seq[0], torch.full((3,), math.exp(-0.5), dtype=torch.float64))
    assert torch.allclose(seq[1], torch.tensor([math.exp(0.2), math.exp(0.2), 0.0], dtype=torch.float64))
    ev = tis_weights(train, rollout, mask, level="event", cap=10.0, event_index=torch.tensor([0, 0]))
    assert torch.allclose(ev[0], torch.full((3,), math.exp(-0.3), dtype=torch.float64))
    capped = tis_weights(train + 50, rollout, mask, level="event", cap=2.0, event_index=torch.tensor([0, 0]))
    assert torch.equal(capped, 2.0 * mask.double())  # huge products are capped, never inf
    assert not tok.requires_grad
    with pytest.raises(ValueError):
        tis_weights(train, rollout, mask, level="event")


def test_mismatch_metrics() -> None:
    mask = torch.tensor([[1, 1, 0]])
    same = mismatch_metrics(torch.tensor([[-1.0, -2.0, 3.0]]), torch.tensor([[-1.0, -2.0, -9.0]]), mask)
    assert same["rollout/logprob_abs_diff"] == 0.0 and same["rollout/kl"] == 0.0
    m = mismatch_metrics(torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.1, -1.8, 0.0]]), mask)
    assert m["rollout/logprob_abs_diff"] == pytest.approx(0.15)
    k3 = [(math.exp(d) - 1 - d) for d in (0.1, -0.2)]
    assert m["rollout/kl"] == pytest.approx(sum(k3) / 2)
