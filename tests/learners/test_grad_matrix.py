"""Every memory saver leaves the gradient alone: the gradient matrix of issue 48.

For each algorithm (SRPO, GRPO, MAPPO with its critic) and each parameter sharing (shared, per-role,
LoRA per role) one minibatch is stepped through every combination of gradient checkpointing (on/off),
prefix-tree packing (on/off) and token-budget micro-batching (one micro-batch / several), and every
trainable parameter's gradient (the critic's too) is compared with the plain path (no checkpointing,
no prefix tree, one micro-batch). float32 on CPU; the tolerance is ``1e-5 * max|grad|`` of the plain
path (the packed and chunked forwards sum in another order, so equality is up to float rounding).

LoRA B matrices are made non-zero first: at initialisation B = 0, so every adapter's output is 0
whichever adapter is active, and a recompute under the wrong adapter would go unseen. That is the bug
this matrix was written for: non-reentrant gradient checkpointing recomputes each layer during
``backward`` with whichever adapter is active *then*, while the trainer activates a role's adapter only
around its forward (``agents.hf.adapter_scope``).

Run: ``python -m pytest tests/learners/test_grad_matrix.py -q`` (the failing cells are listed in the message).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learners.batching import micro_batch_bounds, prefix_micro_batches
from learners.trainer import Trainer
from tests._builders import update_check_config, update_inputs

ALGOS = ("srpo", "grpo", "mappo")
SHARINGS = ("shared", "per-role", "lora")


def _perturb(trainer: Trainer) -> None:
    """Non-zero LoRA B matrices and critic head (both start at zero, which hides wrong recomputes and
    zeroes the critic backbone's gradient), the same values in every trainer of a test."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for pol in trainer.distinct_models():
            for name, p in sorted(pol.model.named_parameters()):
                if "lora_B" in name:
                    p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        if trainer.critic is not None:
            head = trainer.critic.head
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.5)


def _named_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every trainable parameter's gradient (zeros where it got none), policies and critic."""
    out: dict[str, torch.Tensor] = {}
    for i, pol in enumerate(trainer.distinct_models()):
        for name, p in pol.model.named_parameters():
            if p.requires_grad:
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                out[f"model{i}.{name}"] = g.detach().clone()
    if trainer.critic is not None:
        for name, p in trainer.critic.named_parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            out[f"critic.{name}"] = g.detach().clone()
    return out


def _count_layer_calls(trainer: Trainer) -> dict:
    """Calls of every model's first decoder layer (hooks outside its checkpoint: once per forward) and
    of its MLP (inside the checkpoint: again at each recompute); ``hooks`` to remove."""
    calls: dict = {"layer": 0, "inside": 0, "hooks": []}

    def bump(key: str) -> object:
        def hook(*_: object) -> None:
            if torch.is_grad_enabled():
                calls[key] += 1

        return hook

    for pol in trainer.distinct_models():
        layer = next(m for n, m in pol.model.named_modules() if n.endswith("layers.0"))
        calls["hooks"] += [
            layer.register_forward_pre_hook(bump("layer")),
            layer.mlp.register_forward_pre_hook(bump("inside")),
        ]
    return calls


#: the cell that failed before the fix runs in every quick pass; the rest of the matrix is slow (CI runs it)
_FAST = {("srpo", "lora")}


@pytest.mark.parametrize(
    ("algo", "sharing"),
    [
        pytest.param(a, s, marks=pytest.mark.numeric if (a, s) in _FAST else pytest.mark.slow, id=f"{a}-{s}")
        for a in ALGOS
        for s in SHARINGS
    ],
)
def test_gradient_is_the_plain_paths_under_every_memory_saver(
    algo: str, sharing: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The 8 cells (checkpointing x prefix tree x micro-batching) of one (algorithm, sharing) pair."""
    trainers = {
        gc: Trainer(
            update_check_config(
                tiny_model_dir,
                tmp_path / f"gc{int(gc)}",
                algo=algo,
                sharing=sharing,
                gradient_checkpointing=gc,
                critic_lr=0.0,  # MAPPO: the critic's weights stay put too (the policy's lr is 0)
            ),
            log=None,
        )
        for gc in (False, True)
    }
    for t in trainers.values():
        _perturb(t)
    plain = trainers[False]
    table, adv, mb, loss_fn, unit = update_inputs(plain)
    assert len({r.role for r in mb.rows}) == 2  # both roles in the minibatch (SRPO couples them)
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in mb.rows)
    budget = max(tokens // 4, 1)
    assert len(micro_batch_bounds(mb.rows, mb.event_index, budget)) >= 3
    assert len(prefix_micro_batches(mb.rows, mb.event_index, budget)) >= 2

    def step(gc: bool, tree: bool, micro: bool) -> dict[str, torch.Tensor]:
        t = trainers[gc]
        t.updater.event_values = plain.updater.event_values  # MAPPO: the same "old" values for the value clip
        t.reconfigure(prefix_tree=tree, max_tokens_per_microbatch=budget if micro else None)
        if t.critic is not None:
            t.critic.pack_len = t.cfg.pack_len if tree else None
        calls = _count_layer_calls(t)
        t.updater.minibatch_step(mb, table, adv, loss_fn, unit)
        for h in calls.pop("hooks"):
            h.remove()
        # checkpointing really recomputes (the layer's inside runs again in backward), and only with it:
        # a cell where checkpointing silently stayed off would compare the plain path with itself
        assert calls["layer"] > 0 and (calls["inside"] > calls["layer"]) == gc, calls
        if t.critic is not None:
            t.critic_optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
            t.updater.critic_step(mb, table, adv)
        return _named_grads(t)

    ref = step(False, False, False)
    # the tolerance scales with each model's own gradients (the critic's are orders above the LoRA's)
    scales = {
        who: max(float(g.abs().max()) for k, g in ref.items() if k.split(".")[0] == who)
        for who in {k.split(".")[0] for k in ref}
    }
    assert min(scales.values()) > 0
    if sharing == "lora":  # every role's adapter trains (both its A and B)
        assert all(float(g.abs().max()) > 0 for k, g in ref.items() if "lora_" in k)
    failures = []
    for gc in (False, True):
        for tree in (False, True):
            for micro in (False, True):
                if not (gc or tree or micro):
                    continue
                got = step(gc, tree, micro)
                assert got.keys() == ref.keys()
                rel = {k: float((got[k] - ref[k]).abs().max()) / scales[k.split(".")[0]] for k in ref}
                worst = max(rel, key=rel.__getitem__)
                if rel[worst] > 1e-5:
                    scale = scales[worst.split(".")[0]]
                    failures.append(
                        f"checkpointing={gc} prefix_tree={tree} micro={micro}: max |diff| "
                        f"{rel[worst] * scale:.3g} at {worst} (tolerance {1e-5 * scale:.3g} = 1e-5 x max|grad|)"
                    )
    assert not failures, f"{algo}/{sharing}: gradients differ from the plain path:\n" + "\n".join(failures)
