"""Trainer scale-out wiring without a vLLM install: pi_old recompute, mismatch, TIS, weight pushes."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import srpo_envs
from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutCollector
from learners.scale import ScaleOut

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)


def _trainer(policies: PolicyMap, **cfg) -> SimpleNamespace:
    """A stand-in trainer whose ``old_logprobs`` is the policy's own float32 recompute (the real
    trainer's, through its training forward, is tested in tests/learners/test_learners_tis.py)."""
    base = dict(
        backend="vllm", temperature=1.0, tis="auto", tis_cap=2.0, rollout_workers=0,
        dtype="float32", sharing="shared", model="", seed=0, ray_address=None, max_staleness=0,
        staleness_correction="decoupled",
    )  # fmt: skip

    def old_logprobs(rows):
        pol = policies.policies[0]
        return pol.compute_logprobs([r.prompt_ids for r in rows], [r.response_ids for r in rows], 1.0)

    from learners.trainer import TrainConfig  # the real config: ScaleOut takes its sections

    return SimpleNamespace(
        cfg=TrainConfig(**{**base, **cfg}),
        policies=policies,
        device=torch.device("cpu"),
        old_logprobs=old_logprobs,
    )


@pytest.fixture(scope="module")
def learner_and_batch(tiny_model_dir):
    from agents.hf import HFPolicy

    policy = HFPolicy(tiny_model_dir)
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator"),
        PolicyMap.shared(policy),
        SamplingParams(temperature=1.0, max_new_tokens=6),
    )
    return policy, collector.collect([0, 1], group_size=2, seed=4)


def test_prepare_recomputes_pi_old_logs_mismatch_and_weights_events(learner_and_batch) -> None:
    policy, batch = learner_and_batch
    # another engine's log-probs: the learner's plus a known per-token shift
    shift = 0.01
    shifted = dataclasses.replace(
        batch,
        rows=[
            dataclasses.replace(r, behaviour_logprobs=[x - shift for x in r.behaviour_logprobs])
            for r in batch.rows
        ],
    )
    scale = ScaleOut(_trainer(PolicyMap.shared(policy)))
    out, weights, stats = scale.prepare(shifted, ratio_level="event")
    assert stats["rollout/logprob_abs_diff"] == pytest.approx(shift, abs=1e-4)
    assert stats["rollout/kl"] > 0 and stats["rollout/refused_events"] == 0
    for new, old in zip(out.rows, batch.rows, strict=True):  # pi_old is the learner's own recompute
        assert (
            max(abs(a - b) for a, b in zip(new.behaviour_logprobs, old.behaviour_logprobs, strict=True))
            < 1e-4
        )
        assert new.meta["rollout_logprobs"] == [x - shift for x in old.behaviour_logprobs]
    # event level, norm "sum": exp(shift * tokens of the whole event), capped, on every loss token of
    # the event's rows
    by_event: dict[str, list[int]] = {}
    for i, r in enumerate(batch.rows):
        by_event.setdefault(r.event_id, []).append(i)
    for idx in by_event.values():
        tokens = sum(len(batch.rows[i].response_ids) for i in idx)
        expected = min(2.0, float(torch.exp(torch.tensor(shift * tokens, dtype=torch.float64))))
        for i in idx:
            row = batch.rows[i]
            on = [t for t in range(len(row.response_ids)) if row.response_mask[t]]
            assert all(weights[i, t].item() == pytest.approx(expected, rel=1e-3) for t in on)
            assert weights[i, len(row.response_ids) :].abs().sum() == 0  # padding: out of the loss
    hf = ScaleOut(_trainer(PolicyMap.shared(policy), backend="hf"))
    same, none, hf_stats = hf.prepare(batch, ratio_level="event")
    assert none is None and same.rows == batch.rows and "rollout/kl" not in hf_stats


def test_prepare_refuses_stale_events(learner_and_batch) -> None:
    policy, batch = learner_and_batch
    old_event = batch.rows[0].event_id
    rows = [dataclasses.replace(r, policy_version=-1) if r.event_id == old_event else r for r in batch.rows]
    scale = ScaleOut(_trainer(PolicyMap.shared(policy), backend="hf"))
    out, _, stats = scale.prepare(dataclasses.replace(batch, rows=rows), ratio_level="event")
    assert stats["rollout/refused_events"] == 1
    assert old_event not in {r.event_id for r in out.rows} and len(out.rows) < len(batch.rows)


def test_a_batch_whose_every_event_is_refused_is_an_error_that_names_the_lag(learner_and_batch) -> None:
    """Not an empty update that crashes in the batching (it did: "build_event_table needs at least one
    row") nor a silent no-op: the engine generated with other weights than it was sent."""
    policy, batch = learner_and_batch
    rows = [dataclasses.replace(r, policy_version=-2) for r in batch.rows]
    scale = ScaleOut(_trainer(PolicyMap.shared(policy), backend="hf"))
    with pytest.raises(RuntimeError, match=r"every event of this batch was refused: its rows are \[2\] policy versions"):
        scale.prepare(dataclasses.replace(batch, rows=rows), ratio_level="event")


class _Engine:
    """Records weight pushes like agents.vllm.VLLMPolicy.load_weights."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.pushes: list[tuple[int, float]] = []

    def load_weights(self, weights, policy_version=None) -> None:
        self.pushes.append((policy_version, float(next(iter(weights.values())).sum())))
        self.policy_version = policy_version


def test_weights_are_pushed_once_per_update(learner_and_batch) -> None:
    policy, _ = learner_and_batch
    scale = ScaleOut(_trainer(PolicyMap.shared(policy)))
    engine = _Engine()
    scale.rollout_policies = PolicyMap.shared(engine)
    scale.sync_weights()
    scale.sync_weights()  # nothing changed: no second push
    assert [v for v, _ in engine.pushes] == [policy.policy_version]
    with torch.no_grad():
        next(policy.model.parameters()).add_(1.0)
    policy.bump_version()
    scale.sync_weights()
    assert [v for v, _ in engine.pushes] == [policy.policy_version - 1, policy.policy_version]
    assert engine.pushes[1][1] != engine.pushes[0][1]  # the new weights, not the old ones


@pytest.mark.parametrize(("world_size", "local_rank", "current", "expected"), [(1, 0, 3, 3), (4, 2, 0, 2)])
def test_a_bare_cuda_device_gets_an_index_before_set_device(
    monkeypatch: pytest.MonkeyPatch, world_size: int, local_rank: int, current: int, expected: int
) -> None:
    """``--device cuda`` on one GPU: torch 2.11's ``set_device`` refuses a device without an index
    ("Expected a torch.device with a specified index"), which stopped every single-GPU run on an H200.
    The device is given its index first: the current GPU alone, the ``LOCAL_RANK`` one under a launch."""
    from learners.distributed import DistContext
    from learners.scale import ScaleOut

    seen: list[torch.device] = []

    def strict_set_device(device: torch.device) -> None:
        if device.index is None:
            raise ValueError(
                f"Expected a torch.device with a specified index or an integer, but got:{device}"
            )
        seen.append(device)

    monkeypatch.setattr(torch.cuda, "set_device", strict_set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    scale = object.__new__(ScaleOut)
    scale.dist = DistContext(rank=local_rank, world_size=world_size, local_rank=local_rank)
    assert scale.rank_device(torch.device("cuda")) == torch.device("cuda", expected)
    assert seen == [torch.device("cuda", expected)]
    assert scale.rank_device(torch.device("cpu")) == torch.device("cpu") and len(seen) == 1
