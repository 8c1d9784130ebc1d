"""Shared-prefix update forward (learners/prefix.py) equals the per-row path, values and gradients."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from learners.batching import collate, gather_response_logprobs
from learners.prefix import (
    pack_rows,
    packed_logprobs,
    prefix_tree_size,
    prompt_groups,
    shared_prefix_logits,
    shared_prefix_logprobs,
)
from tests._builders import update_check_config, update_inputs
from tests._numeric import F32, F64, assert_close_scaled, scaled_atol

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    m.train()  # the learner's mode (no dropout in these configs)
    return m


def _rows(vocab: int = 256) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts of different lengths, shared by 4, 3 and 1 rows, responses of uneven length."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (11, 5, 17)]
    owner = [0, 1, 0, 2, 1, 0, 1, 0]
    lens = [7, 1, 12, 3, 9, 12, 4, 2]
    responses = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lens]
    return [list(prompts[o]) for o in owner], responses


def _per_row(model, prompts, responses, temperature: float) -> torch.Tensor:
    """The trainer's path: collate -> one forward with logits_to_keep -> gather."""
    rows = [
        SimpleNamespace(
            prompt_ids=p,
            response_ids=r,
            response_mask=[1] * len(r),
            behaviour_logprobs=[0.0] * len(r),
            reward=0.0,
        )
        for p, r in zip(prompts, responses, strict=True)
    ]
    batch = collate(rows, pad_id=0)  # type: ignore[arg-type]  # collate reads only these fields
    logits = model(**batch.model_inputs(), logits_to_keep=batch.response_width + 1).logits
    return gather_response_logprobs(logits, batch, temperature) * batch.response_attention


def test_prompt_groups_first_appearance() -> None:
    uniq, index = prompt_groups([[1, 2], [3], [1, 2], [3], [4]])
    assert uniq == [[1, 2], [3], [4]]
    assert index == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_gradients_match_the_per_row_path(model, temperature: float) -> None:
    prompts, responses = _rows()
    weights = torch.randn(
        len(prompts), max(len(r) for r in responses), generator=torch.Generator().manual_seed(1)
    )
    model.zero_grad(set_to_none=True)
    ref = _per_row(model, prompts, responses, temperature)
    (ref * weights).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    lp, mask, ent = shared_prefix_logprobs(model, prompts, responses, temperature, with_entropy=True)
    (lp * weights).sum().backward()
    assert mask.sum().item() == sum(len(r) for r in responses)
    # two computations of the same float32 numbers: per-tensor tolerances scaled to the max (tests/_numeric.py)
    assert_close_scaled(lp.detach(), ref.detach(), F32)
    for n, p in model.named_parameters():
        assert_close_scaled(p.grad, ref_grads[n], F32, msg=n)
    assert ent is not None and bool((ent[mask] > 0).all()) and bool((ent[~mask] == 0).all())


def test_prompts_are_forwarded_once(model) -> None:
    """The saving itself: the first forward sees 3 distinct prompts, the second only response tokens."""
    prompts, responses = _rows()
    shapes: list[tuple[int, ...]] = []
    hook = model.model.embed_tokens.register_forward_hook(
        lambda _m, args, _o: shapes.append(tuple(args[0].shape))
    )
    try:
        with torch.no_grad():
            shared_prefix_logits(model, prompts, responses)
    finally:
        hook.remove()
    assert shapes == [(3, 17), (8, 11)]


def test_checkpointing_falls_back_to_the_per_row_forward(tiny_model_dir) -> None:
    m = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    enable = getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable
    enable()
    m.train()
    prompts, responses = _rows()
    lp, _, _ = shared_prefix_logprobs(m, prompts, responses)
    with torch.no_grad():
        ref = _per_row(m, prompts, responses, 1.0)
    assert_close_scaled(lp.detach(), ref, F32)


def test_bad_input_is_rejected(model) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        shared_prefix_logits(model, [[1]], [])
    with pytest.raises(ValueError, match="at least one token"):
        shared_prefix_logits(model, [[]], [[1]])
    with pytest.raises(ValueError, match="no response tokens"):
        shared_prefix_logits(model, [[1]], [[]])


# -------------------------------------------------------------------------------- packing


def _tree_rows(vocab: int = 256) -> tuple[list[list[int]], list[list[int]]]:
    """_rows plus what a prefix tree must handle: a prompt that is a prefix of another, responses
    sharing their first tokens, an exact duplicate row and an empty response."""
    prompts, responses = _rows(vocab)
    prompts += [prompts[0][:6], prompts[1], prompts[1], prompts[0]]
    responses += [[9, 8, 7], responses[1] + [5, 6], list(responses[4]), []]
    return prompts, responses


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("pack_len", [1, 24, 64])
def test_packed_logprobs_and_gradients_match_the_per_row_path(
    model, temperature: float, pack_len: int
) -> None:
    """pack_len=1: every row alone; 24: runs cut inside a shared prefix; 64: runs share sequences."""
    prompts, responses = _tree_rows()
    weights = torch.randn(
        len(prompts), max(len(r) for r in responses), generator=torch.Generator().manual_seed(1)
    )
    model.zero_grad(set_to_none=True)
    ref = _per_row(model, prompts, responses, temperature)
    (ref * weights).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    lp, mask, ent = packed_logprobs(
        model, prompts, responses, temperature, with_entropy=True, pack_len=pack_len
    )
    (lp * weights).sum().backward()
    assert mask.sum().item() == sum(len(r) for r in responses)
    # two computations of the same float32 numbers: per-tensor tolerances scaled to the max (tests/_numeric.py)
    assert_close_scaled(lp.detach(), ref.detach(), F32)
    for n, p in model.named_parameters():
        assert_close_scaled(p.grad, ref_grads[n], F32, msg=n)
    assert ent is not None and bool((ent[mask] > 0).all()) and bool((ent[~mask] == 0).all())


def test_pack_rows_computes_each_distinct_prefix_once() -> None:
    prompts, responses = _tree_rows()
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    distinct = {tuple(s[:n]) for s in seqs for n in range(1, len(s) + 1)}
    packed = pack_rows(prompts, responses, pack_len=10_000)
    assert packed.num_positions == len(distinct) == prefix_tree_size(seqs)
    assert packed.input_ids.shape[0] == 1
    assert packed.num_positions < sum(map(len, seqs))
    # every distinct predicting node projected once: as many as distinct prefixes ending before a response token
    predictors = {
        tuple((p + r)[: len(p) + j]) for p, r in zip(prompts, responses, strict=True) for j in range(len(r))
    }
    assert packed.src_seq.numel() == len(predictors)
    # a node attends to its ancestors: as many keys as its depth + 1
    mask = packed.attention_mask()[0, 0]
    real = packed.real[0]
    assert torch.equal(mask.sum(-1)[real], packed.position_ids[0][real] + 1)


def test_packed_eager_attention_and_bad_input(tiny_model_dir) -> None:
    m = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    prompts, responses = _tree_rows()
    with torch.no_grad():
        lp, _, _ = packed_logprobs(m, prompts, responses, pack_len=64)
        ref = _per_row(m, prompts, responses, 1.0)
    assert_close_scaled(lp, ref, F32)
    with pytest.raises(ValueError, match="differ in length"):
        pack_rows([[1]], [])
    with pytest.raises(ValueError, match="at least one token"):
        pack_rows([[]], [[1]])
    with pytest.raises(ValueError, match="no response tokens"):
        pack_rows([[1]], [[]])
    with pytest.raises(ValueError, match="pack_len"):
        pack_rows([[1]], [[1]], pack_len=0)


# -------------------------------------------------------------------------------- in the trainer


@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("srpo", {"kl_coef": 0.1, "entropy_coef": 0.01}),
        ("srpo", {"gradient_checkpointing": True}),
        ("grpo", {}),
    ],
)
def test_trainer_prefix_tree_gives_the_per_row_gradient(
    algo: str, extra: dict, tiny_model_dir, tmp_path
) -> None:
    """prefix_tree=True (whole minibatch, and >= 3 prefix micro-batches) == the per-row path, float64."""
    from learners.batching import prefix_micro_batches
    from learners.trainer import Trainer

    cfg = update_check_config(
        tiny_model_dir,
        tmp_path,
        algo=algo,
        dtype="float64",
        pack_len=16,  # small: several packed sequences and runs cut inside shared prefixes
        **extra,
    )
    trainer = Trainer(cfg, log=None)
    table, adv, mb, loss_fn, unit = update_inputs(trainer)

    def grads() -> torch.Tensor:
        return torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None])

    results = []
    budget = max(prefix_tree_size([(*r.prompt_ids, *r.response_ids) for r in mb.rows]) // 4, 1)
    assert len(prefix_micro_batches(mb.rows, mb.event_index, budget)) >= 3
    for tree, tokens in ((False, None), (True, None), (True, budget)):
        trainer.reconfigure(prefix_tree=tree, max_tokens_per_microbatch=tokens)
        out = trainer.updater.minibatch_step(mb, table, adv, loss_fn, unit)
        results.append((grads().clone(), out))
    (g_ref, ref), *others = results
    assert g_ref.abs().sum() > 0
    for g, out in others:
        assert_close_scaled(g, g_ref, F64)  # float64, another summation order: scaled to max|g_ref|
        assert out["loss"] == pytest.approx(ref["loss"], abs=scaled_atol(ref["loss"], F64))
