"""Tests of learners/batching.py: event-atomic minibatches (property-based) and collation/alignment."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.rows import Row
from learners.batching import (
    collate,
    complete_events,
    event_minibatches,
    gather_response_logprobs,
    prefix_micro_batches,
)
from learners.losses import logprobs_from_logits, srpo_loss
from tests._builders import make_row
from tests._numeric import F32, assert_close_scaled, scaled_atol

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)

# --------------------------------------------------------------------------------------------------
# event-atomic minibatches
# --------------------------------------------------------------------------------------------------


def test_prefix_micro_batches_group_shared_prefixes_and_bound_tree_nodes() -> None:
    """Events interleave two prompts; micro-batches put each prompt's events together (the budget
    counts prefix-tree nodes, not row lengths), never split an event, and cover every row once."""
    a, b = (1, 2, 3, 4, 5, 6), (9, 8, 7, 6, 5, 4)
    prompts = [a, b, a, b, a, b]
    rows = [
        make_row(f"e{e}/0", m, 2, prompt=p, response=(20 + e, 30 + m))
        for e, p in enumerate(prompts)
        for m in range(2)
    ]
    idx = torch.tensor([e for e in range(6) for _ in range(2)])
    assert prefix_micro_batches(rows, idx, None) == [list(range(12))]
    assert prefix_micro_batches([], idx[:0], 10) == []
    # one prompt's tree: 6 prompt nodes + 3 events x (1 shared first token + 2 leaves) = 15 nodes,
    # while the summed row lengths would be 6 x 8 = 48
    out = prefix_micro_batches(rows, idx, 15)
    assert sorted(i for mb in out for i in mb) == list(range(12))
    assert [sorted({int(idx[i]) for i in mb}) for mb in out] == [[0, 2, 4], [1, 3, 5]]
    # a budget below one event: each event alone, whole
    out = prefix_micro_batches(rows, idx, 1)
    assert len(out) == 6 and all(len({int(idx[i]) for i in mb}) == 1 and len(mb) == 2 for mb in out)
    with pytest.raises(ValueError, match="max_tokens"):
        prefix_micro_batches(rows, idx, 0)


# Each event: (K, defect) with defect in: ok, missing (one row lost), duplicate (a member twice),
# same_size_dup (K rows, one member twice), extra (a member index >= K), mixed_k (rows disagree on
# k).
DEFECTS = ["ok", "ok", "ok", "missing", "duplicate", "same_size_dup", "extra", "mixed_k"]


def _event_rows(i: int, k: int, defect: str) -> list[Row]:
    eid = f"ep{i}/0"
    rows = [make_row(eid, m, k) for m in range(k)]
    if defect == "missing":
        rows.pop(k // 2)
    elif defect == "duplicate":
        rows.append(make_row(eid, k - 1, k))
    elif defect == "extra":
        rows.append(make_row(eid, k, k))
    elif defect == "same_size_dup":  # K rows, but a member twice (K=1: an out-of-range index instead)
        rows[0] = make_row(eid, k - 1 if k > 1 else 1, k)
    elif defect == "mixed_k":
        rows[-1] = make_row(eid, k - 1, k + 1)
    return rows


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(1, 5), st.sampled_from(DEFECTS)), min_size=0, max_size=25),
    rows_per_batch=st.one_of(st.none(), st.integers(1, 12)),
    events_per_batch=st.one_of(st.none(), st.integers(1, 6)),
    seed=st.integers(0, 2**16),
    order_seed=st.randoms(use_true_random=False),
)
def test_event_minibatches_property(events, rows_per_batch, events_per_batch, seed, order_seed) -> None:
    rows: list[Row] = []
    expected_ok: dict[str, int] = {}
    expected_dropped = 0
    for i, (k, defect) in enumerate(events):
        event_rows = _event_rows(i, k, defect)
        rows += event_rows
        if defect == "ok":
            expected_ok[f"ep{i}/0"] = k
        elif event_rows:  # a K=1 event that lost its row is simply absent from the input
            expected_dropped += 1
    order_seed.shuffle(rows)  # rows of an event arrive in any order, interleaved with other events

    out = event_minibatches(rows, rows_per_batch, events_per_batch, seed=seed)
    assert out.dropped_events == expected_dropped
    assert len(out.dropped_event_ids) == expected_dropped
    seen = Counter()
    where: dict[str, int] = {}
    for b, mb in enumerate(out):
        assert mb.dropped_events == expected_dropped
        assert mb.event_index.dtype == torch.long and mb.event_index.shape == (mb.num_rows,)
        assert len(set(mb.event_ids)) == mb.num_events
        for j, row in enumerate(mb.rows):
            e = mb.event_ids[int(mb.event_index[j])]
            assert row.event_id == e
            assert where.setdefault(e, b) == b  # never split across minibatches
            seen[e] += 1
        # event_index is 0..E_mb-1, contiguous, non-decreasing; members ordered 0..K-1
        assert mb.event_index.tolist() == sorted(mb.event_index.tolist())
        assert set(mb.event_index.tolist()) == set(range(mb.num_events))
        for e_local, e in enumerate(mb.event_ids):
            members = [
                r.member_index
                for r, ix in zip(mb.rows, mb.event_index.tolist(), strict=True)
                if ix == e_local
            ]
            assert members == list(range(expected_ok[e]))
        if rows_per_batch is not None and mb.num_events > 1:
            assert mb.num_rows <= rows_per_batch
        if events_per_batch is not None:
            assert mb.num_events <= events_per_batch
    # every complete event exactly once and complete; no dropped event anywhere
    assert dict(seen) == expected_ok
    assert not set(seen) & set(out.dropped_event_ids)


def test_event_minibatches_packing_and_seed() -> None:
    rows = [r for i, k in enumerate([3, 1, 4, 2, 2, 6]) for r in _event_rows(i, k, "ok")]
    ordered = event_minibatches(rows, rows_per_batch=5, shuffle=False)
    assert [mb.event_ids for mb in ordered] == [["ep0/0", "ep1/0"], ["ep2/0"], ["ep3/0", "ep4/0"], ["ep5/0"]]
    assert [mb.num_rows for mb in ordered] == [4, 4, 4, 6]  # an oversize event goes alone, unsplit
    assert ordered[0].event_index.tolist() == [0, 0, 0, 1]
    by_events = event_minibatches(rows, events_per_batch=4, shuffle=False)
    assert [mb.num_events for mb in by_events] == [4, 2]
    assert len(event_minibatches(rows)) == 1
    a = event_minibatches(rows, rows_per_batch=5, seed=3)
    b = event_minibatches(rows, rows_per_batch=5, seed=3)
    assert [mb.event_ids for mb in a] == [mb.event_ids for mb in b]
    orders = {tuple(e for mb in event_minibatches(rows, seed=s) for e in mb.event_ids) for s in range(8)}
    assert len(orders) > 1  # the seed does shuffle events
    with pytest.raises(ValueError):
        event_minibatches(rows, rows_per_batch=0)


def test_complete_events_and_event_values() -> None:
    rows = _event_rows(0, 2, "ok") + _event_rows(1, 3, "missing") + _event_rows(2, 2, "duplicate")
    kept, dropped = complete_events(rows)
    assert list(kept) == ["ep0/0"] and dropped == ["ep1/0", "ep2/0"]
    mb = event_minibatches(rows + _event_rows(3, 1, "ok"), shuffle=False)[0]
    vals = mb.event_values({"ep0/0": 0.5, "ep3/0": -2.0, "ep1/0": 9.0})
    assert vals.tolist() == [0.5, -2.0]
    with pytest.raises(KeyError):
        mb.event_values({"ep0/0": 0.5})


# --------------------------------------------------------------------------------------------------
# collate and alignment with a real model forward
# --------------------------------------------------------------------------------------------------


def test_collate_layout() -> None:
    rows = [
        make_row(
            "e/0", 0, 2, prompt=(11, 12, 13), response=(21, 22), mask=(1, 0), lps=(-0.1, -0.2), reward=0.5
        ),
        make_row("e/0", 1, 2, prompt=(14,), response=(31, 32, 33, 34), lps=(-1, -2, -3, -4), reward=0.5),
    ]
    b = collate(rows, pad_id=0, event_index=torch.tensor([0, 0]))
    assert b.prompt_width == 3 and b.response_width == 4
    assert b.input_ids.tolist() == [[11, 12, 13, 21, 22, 0, 0], [0, 0, 14, 31, 32, 33, 34]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 0], [0, 0, 0, 1, 2, 3, 4]]
    assert b.response_ids.tolist() == [[21, 22, 0, 0], [31, 32, 33, 34]]
    assert b.response_mask.tolist() == [[1, 0, 0, 0], [1, 1, 1, 1]]
    assert b.response_attention.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    # exact by design: the same Python floats converted to float32 once each way, no arithmetic
    assert torch.equal(b.old_logprobs, torch.tensor([[-0.1, -0.2, 0, 0], [-1, -2, -3, -4]]))
    assert b.old_logprobs.dtype == torch.float32 and b.input_ids.dtype == torch.long
    assert b.rewards.tolist() == [0.5, 0.5]
    assert b.event_index.tolist() == [0, 0]
    assert collate(rows, 0, dtype=torch.float64).old_logprobs.dtype == torch.float64
    with pytest.raises(ValueError, match="prompt"):
        collate([make_row("e/0", 0, 1, prompt=())], 0)
    with pytest.raises(ValueError):
        collate([], 0)


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gather_matches_unpadded_forward(tiny_model, attn: str) -> None:
    model = tiny_model
    model.config._attn_implementation = attn
    g = torch.Generator().manual_seed(1)
    shapes = [(3, 5), (7, 2), (1, 6), (4, 4)]
    rows = [
        make_row(
            f"e{i}/0",
            0,
            1,
            prompt=torch.randint(1, 61, (p,), generator=g).tolist(),
            response=torch.randint(1, 61, (t,), generator=g).tolist(),
            mask=[1] * (t - 1) + [0],
        )
        for i, (p, t) in enumerate(shapes)
    ]
    batch = collate(rows, pad_id=0)
    full = model(**batch.model_inputs()).logits
    kept = model(**batch.model_inputs(), logits_to_keep=batch.response_width + 1).logits
    lp_full = gather_response_logprobs(full, batch)
    lp_kept = gather_response_logprobs(kept, batch)
    assert lp_full.shape == batch.old_logprobs.shape
    for i, row in enumerate(rows):
        ids = torch.tensor([row.prompt_ids + row.response_ids])
        logits = model(input_ids=ids).logits[0]
        p, t = len(row.prompt_ids), len(row.response_ids)
        ref = logprobs_from_logits(logits[p - 1 : p + t - 1], torch.tensor(row.response_ids))
        # padded batch vs one unpadded row: float32, another summation order; scaled (tests/_numeric.py)
        assert_close_scaled(lp_full[i, :t], ref, F32, msg=f"{attn} {i}")
        assert_close_scaled(lp_kept[i, :t], ref, F32, msg=f"{attn} {i}")
    with pytest.raises(ValueError):
        gather_response_logprobs(full[:, -batch.response_width :], batch)


def test_gather_feeds_srpo_loss_end_to_end(tiny_model) -> None:
    """On-policy (old = current log-probs) every event ratio is 1, so the loss is -mean(A) and the
    gradient reaches the model through the gathered log-probs only where the mask is 1."""
    model = tiny_model
    model.config._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(2)
    rows = [
        make_row(
            f"e{e}/0",
            m,
            k,
            prompt=torch.randint(1, 61, (2 + m,), generator=g).tolist(),
            response=torch.randint(1, 61, (3 + e,), generator=g).tolist(),
        )
        for e, k in enumerate([2, 1, 3])
        for m in range(k)
    ]
    mb = event_minibatches(rows, shuffle=False)[0]
    batch = mb.collate(pad_id=0)
    with torch.no_grad():
        behaviour = gather_response_logprobs(model(**batch.model_inputs()).logits, batch)
    adv = mb.event_values({"e0/0": 1.0, "e1/0": -0.5, "e2/0": 2.0})
    model.zero_grad()
    lp = gather_response_logprobs(model(**batch.model_inputs()).logits, batch)
    loss, stats = srpo_loss(lp, behaviour, batch.response_mask, batch.event_index, adv)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=scaled_atol(adv.mean().item(), F32))
    assert stats["clip_frac"] == 0.0 and stats["mean_k"] == pytest.approx(2.0)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(gr).all() for gr in grads)
    assert any(gr.abs().sum() > 0 for gr in grads)
