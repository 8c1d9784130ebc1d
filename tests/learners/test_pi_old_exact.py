"""pi_old in the training composition: the first on-policy ratio is exactly 1 under bf16 autocast.

The ratio divides the training forward's log-probs by pi_old. pi_old used to be recomputed in batch
order (its own chunks), while training forwards shuffled event minibatches, split into token-budget
micro-batches, length-sorted per-policy chunks, prefix-tree packs and data-parallel shards: under bf16
autocast two compositions of the same rows round differently (~1e-3 in a log-prob), so the first ratio
was only about 1. Now pi_old comes from the very forwards of epoch 0 (``PolicyUpdate.composed_old_logprobs``).

With ``lr=0`` the weights never move, so *every* minibatch's ratio must be exactly 1: each training
forward is bit-identical to the no-grad forward pi_old was taken from (same kernels, same inputs, same
padding; CPU kernels are deterministic). The checks are therefore exact equality, by design.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

#: several minibatches, token-budget micro-batches, 2-row forward chunks, bf16 autocast, no step
COMPOSITION = dict(
    dtype="bfloat16",
    lr=0.0,
    epochs=1,
    minibatches_per_iter=3,
    max_tokens_per_microbatch=60,
    forward_rows=2,
    max_new_tokens=8,
    eval_every=0,
    save_every=0,
    seed=3,
    device="cpu",
)


def _record_ratios(monkeypatch: Any, seen: list[tuple[float, int]]) -> None:
    """Wrap the trainer's policy loss: record ``max |log pi - log pi_old|`` over each micro-batch's loss
    tokens (and their count) before the real loss runs."""
    import learners.update as update_mod

    real_get = update_mod.get_policy_loss

    def get(name: str) -> Any:
        loss = real_get(name)

        def fn(lp, old, mask, *rest):  # noqa: ANN001, ANN002, ANN202
            on = mask != 0
            seen.append((float((lp.detach() - old)[on].abs().max()), int(on.sum())))
            return loss.fn(lp, old, mask, *rest)

        return dataclasses.replace(loss, fn=fn)

    monkeypatch.setattr(update_mod, "get_policy_loss", get)


def _batch(model_dir: Path, out: Path) -> Any:
    from learners.trainer import TrainConfig, Trainer
    from tests._builders import g0_wins

    trainer = Trainer(TrainConfig(model=str(model_dir), out_dir=str(out), **COMPOSITION), log=None)
    batch = trainer.collector.collect([0, 1, 2], group_size=2, seed=5)
    g0_wins(batch.rows)
    return batch


@pytest.mark.numeric  # bit-exact by design, also under the other CPU kernel sets (.ci/run)
@pytest.mark.parametrize("prefix_tree", [False, True])
@pytest.mark.parametrize("algo", ["srpo", "grpo"])
def test_first_ratio_is_exactly_one_in_bf16(
    algo: str, prefix_tree: bool, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from learners.trainer import TrainConfig, Trainer

    batch = _batch(tiny_model_dir, tmp_path / "collect")
    cfg = TrainConfig(
        algo=algo,
        model=str(tiny_model_dir),
        out_dir=str(tmp_path / "t"),
        prefix_tree=prefix_tree,
        **COMPOSITION,
    )
    trainer = Trainer(cfg, log=None)
    assert trainer.scale.recomputes_pi_old()  # bf16: pi_old is the learner's recompute
    seen: list[tuple[float, int]] = []
    _record_ratios(monkeypatch, seen)
    trainer.update(batch, iteration=1)
    assert len(seen) >= 4 and sum(n for _, n in seen) > 0  # several minibatches x micro-batches
    assert max(d for d, _ in seen) == 0.0, seen  # bit-exact by design (see the module docstring)


def _dp_worker(rank: int, port: int, model_dir: str, rows_path: str, out: str) -> None:
    import json
    import os

    import torch.distributed as dist

    from agents.rollout import RolloutBatch
    from agents.rows import load_rows
    from learners.trainer import TrainConfig, Trainer

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    batch = RolloutBatch(rows=load_rows(rows_path), episodes=[])
    result = {}
    try:
        for prefix_tree in (False, True):
            cfg = TrainConfig(
                algo="srpo",
                model=model_dir,
                out_dir=f"{out}/t{int(prefix_tree)}",
                prefix_tree=prefix_tree,
                **COMPOSITION,
            )
            trainer = Trainer(cfg, log=None)
            assert trainer.dist.world_size == 2
            seen: list[tuple[float, int]] = []
            _record_ratios(mp, seen)
            trainer.update(batch, iteration=1)
            mp.undo()
            result[str(prefix_tree)] = seen
    finally:
        dist.destroy_process_group()
    with open(f"{out}/ratios-{rank}.json", "w") as f:
        json.dump(result, f)


@pytest.mark.slow
def test_first_ratio_is_exactly_one_on_two_data_parallel_ranks(tiny_model_dir: Path, tmp_path: Path) -> None:
    """2 gloo ranks, each training its event-atomic shard of every minibatch (with and without the
    prefix tree): every rank's ratios are exactly 1 too."""
    import json

    import torch.multiprocessing as mp

    from agents.rows import save_rows

    batch = _batch(tiny_model_dir, tmp_path / "collect")
    rows_path = save_rows(batch.rows, tmp_path / "rows.jsonl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_dp_worker, args=(port, str(tiny_model_dir), str(rows_path), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        result = json.loads((tmp_path / f"ratios-{rank}.json").read_text())
        for prefix_tree, seen in result.items():
            assert len(seen) >= 2 and sum(n for _, n in seen) > 0, (rank, prefix_tree)
            assert max(d for d, _ in seen) == 0.0, (rank, prefix_tree, seen)
