"""Checkpoints: no pickle, sha256-checked, atomically published, exact resume, honest --resume.

Every trainer-level test here fails on commit 646320c (``checkpoint.pt`` via ``torch.save`` /
``torch.load(weights_only=False)``): the pickle payload runs, ``--resume`` with nothing to resume from
silently starts over, a torn metrics line crashes the resume, and a fresh ``Trainer.train()`` appends
to stale metrics.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from learners import checkpoint as ckpt
from learners.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from learners.trainer import Trainer, train
from tests._builders import checkpoint_run_config

ROOT = Path(__file__).resolve().parents[2]


def _iterations(run: Path) -> list[int]:
    return [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _same(a, b) -> bool:
    """Deep equality that also compares tensor dtypes and bits, numpy arrays and NaN."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# ------------------------------------------------------------------------------------------ format
def test_state_round_trips_exactly_without_pickle(tmp_path: Path) -> None:
    tied = torch.randn(4, 3)
    base = torch.arange(12.0)
    opt_param = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([opt_param], lr=1e-3)
    opt_param.grad = torch.ones(3)
    opt.step()
    state = {
        "iteration": 3,
        "config": {"env_kwargs": {"difficulty": [2, 3]}, "lr": 3e-4, "name": "x"},
        "models": {"model0": {"embed.weight": tied, "lm_head.weight": tied, "norm": torch.ones(3).bfloat16()}},
        "views": [base[:6], base[6:]],  # share one storage: must be stored separately
        "optimizer": opt.state_dict(),  # int keys, tuples (betas), None, 0-d tensors
        "odd": {"$tensor": 1, 5: "int key", "nan": float("nan"), "inf": (float("inf"), -float("inf"))},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
    }
    save_checkpoint(tmp_path, state)
    files = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert files == ["manifest.json", "state.json", "tensors.safetensors"]
    from safetensors import safe_open

    with safe_open(tmp_path / "checkpoint" / "tensors.safetensors", "pt") as fh:
        keys = set(fh.keys())
    assert "models/model0/embed.weight" in keys and "models/model0/lm_head.weight" not in keys  # tied: once
    loaded = load_checkpoint(tmp_path)
    assert _same(state, loaded)
    assert loaded["models"]["model0"]["embed.weight"] is loaded["models"]["model0"]["lm_head.weight"]
    # a loaded optimizer state drives a real optimizer (int param ids and betas tuple came back)
    opt.load_state_dict(loaded["optimizer"])
    with pytest.raises(TypeError, match="no pickle fallback"):
        save_checkpoint(tmp_path / "bad", {"obj": object()})


def test_rng_state_restores_exactly() -> None:
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    saved = ckpt.encode_state(ckpt.capture_rng_state())
    want = (torch.rand(5), random.random(), np.random.rand(3))
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    ckpt.restore_rng_state(ckpt.decode_state(*saved))
    got = (torch.rand(5), random.random(), np.random.rand(3))
    assert torch.equal(want[0], got[0]) and want[1] == got[1] and np.array_equal(want[2], got[2])


@pytest.mark.parametrize("target", ["tensors.safetensors", "state.json"])
def test_flipped_bytes_are_a_one_line_error_naming_the_file(tmp_path: Path, target: str) -> None:
    save_checkpoint(tmp_path, {"iteration": 1, "w": torch.randn(64, 64), "note": "x" * 400})
    path = tmp_path / "checkpoint" / target
    data = bytearray(path.read_bytes())
    start = len(data) // 2 - 48
    data[start : start + 96] = bytes(b ^ 0xFF for b in data[start : start + 96])
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "corrupt" in msg


def test_incomplete_or_tampered_manifest_is_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"iteration": 1, "w": torch.ones(2)})
    manifest = tmp_path / "checkpoint" / "manifest.json"
    good = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**good, "files": {}}))  # a manifest that vouches for nothing
    with pytest.raises(CheckpointError, match="must list exactly"):
        load_checkpoint(tmp_path)
    manifest.unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(tmp_path)


# ------------------------------------------------------------------------------------------ publishing
def test_publish_is_atomic_and_keeps_the_previous_checkpoint_until_the_new_one_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, {"iteration": 1, "w": torch.zeros(3)})
    save_checkpoint(tmp_path, {"iteration": 2, "w": torch.ones(3)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no .prev, no temp left
    assert ckpt.checkpoint_iteration(tmp_path) == 2

    def dies_midway(tensors, filename, metadata=None):  # a crash after half the bytes hit the disk
        Path(filename).write_bytes(b"\x00" * 100)
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", dies_midway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, {"iteration": 3, "w": torch.full((3,), 3.0)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert torch.equal(load_checkpoint(tmp_path)["w"], torch.ones(3))

    # killed between the two renames: only checkpoint.prev (complete) is there, plus a finished temp dir
    os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.prev")
    (tmp_path / ".checkpoint.tmp-dead").mkdir()
    (tmp_path / ".checkpoint.tmp-dead" / "tensors.safetensors").write_bytes(b"junk")
    assert load_checkpoint(tmp_path)["iteration"] == 2
    monkeypatch.undo()
    save_checkpoint(tmp_path, {"iteration": 4, "w": torch.zeros(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert load_checkpoint(tmp_path)["iteration"] == 4


def test_only_rank_zero_writes(tmp_path: Path) -> None:
    assert save_checkpoint(tmp_path / "r1", {"iteration": 1}, rank=1) is None
    assert not (tmp_path / "r1").exists()
    assert save_checkpoint(tmp_path / "r0", {"iteration": 1}, rank=0) == tmp_path / "r0" / "checkpoint"


_RANK_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from learners.checkpoint import load_checkpoint, save_checkpoint
    from learners.metrics_log import append_metrics, reset_metrics, trim_metrics
    rank, run, store = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)  # DDP replicas: identical on every rank
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    state = {"iteration": 5, "model": model.state_dict(), "optimizer": opt.state_dict(),
             "who": "rank0" if rank == 0 else "rank1 must not be written"}
    out = save_checkpoint(run, state)
    assert (out is None) == (rank != 0), out
    loaded = load_checkpoint(run)  # every rank reads the full state after the barrier
    assert loaded["who"] == "rank0" and torch.equal(loaded["model"]["weight"], model.weight.detach())
    metrics = f"{run}/metrics.jsonl"  # rank 0 alone writes metrics; trim/reset are collective
    reset_metrics(metrics)
    append_metrics(metrics, {"iteration": 5})
    append_metrics(metrics, {"iteration": 6})
    dist.barrier()
    assert [m["iteration"] for m in trim_metrics(metrics, 5)] == [5]
    dist.destroy_process_group()
    """
)


def test_two_rank_save_loads_in_one_process(tmp_path: Path) -> None:
    """A checkpoint written under a 2-rank gloo group (rank 0 writes) loads in a plain process."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"iteration": 1}\n')  # stale: reset on rank 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run, store = tmp_path / "run", tmp_path / "store"
    procs = [
        subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(r), str(run), str(store)], env=env)
        for r in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    state = load_checkpoint(run)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    assert state["iteration"] == 5 and opt.state_dict()["state"][0]["step"].item() == 1.0
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 5}\n'


# ------------------------------------------------------------------------------------------ trainer
class _Killed(Exception):
    pass


def test_resume_after_a_kill_is_bit_identical_and_trims_metrics(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after logging iteration 2 but before its checkpoint: resume replays 2 exactly."""
    full = train(checkpoint_run_config(tiny_model_dir, tmp_path / "full"), log=None)

    run = tmp_path / "killed"
    original = Trainer.save_checkpoint

    def killed_at_2(self: Trainer):
        if self.iteration == 2:  # iteration 2 is in metrics.jsonl, its checkpoint never written
            raise _Killed
        return original(self)

    monkeypatch.setattr(Trainer, "save_checkpoint", killed_at_2)
    with pytest.raises(_Killed):
        train(checkpoint_run_config(tiny_model_dir, run), log=None)
    monkeypatch.undo()
    assert _iterations(run) == [1, 2]
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"iteration": 3, "loss": 0.')  # a torn line too (killed mid-append)

    logs: list[str] = []
    resumed = train(checkpoint_run_config(tiny_model_dir, run), resume=True, log=logs.append)
    assert "resumed srpo from iteration 1" in logs
    assert _iterations(run) == [1, 2] == [h["iteration"] for h in resumed]
    drop = ("rollout_s", "update_s")
    assert [{k: v for k, v in h.items() if k not in drop} for h in resumed] == [
        {k: v for k, v in h.items() if k not in drop} for h in full
    ]
    wa, wb = load_checkpoint(tmp_path / "full")["models"], load_checkpoint(run)["models"]
    assert all(torch.equal(wa["model0"][k], wb["model0"][k]) for k in wa["model0"])


def test_a_finished_run_resumed_with_more_iterations_trains_on_as_one_longer_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """2 iterations, then --resume with iterations=3: bit-identical to 3 iterations at once; resuming
    a checkpoint past the requested iterations is an error that leaves the run alone."""
    full = train(checkpoint_run_config(tiny_model_dir, tmp_path / "full", iterations=3), log=None)
    run = tmp_path / "extended"
    train(checkpoint_run_config(tiny_model_dir, run, iterations=2), log=None)
    logs: list[str] = []
    extended = train(checkpoint_run_config(tiny_model_dir, run, iterations=3), resume=True, log=logs.append)
    assert "resumed srpo from iteration 2" in logs
    assert [h["iteration"] for h in extended] == [1, 2, 3] == _iterations(run)
    drop = ("rollout_s", "update_s")
    assert [{k: v for k, v in h.items() if k not in drop} for h in extended] == [
        {k: v for k, v in h.items() if k not in drop} for h in full
    ]
    wa, wb = load_checkpoint(tmp_path / "full")["models"], load_checkpoint(run)["models"]
    assert all(torch.equal(wa["model0"][k], wb["model0"][k]) for k in wa["model0"])
    with pytest.raises(ckpt.CheckpointConfigError, match=r"at iteration 3, past --iterations 2"):
        train(checkpoint_run_config(tiny_model_dir, run, iterations=2), resume=True, log=None)
    assert _iterations(run) == [1, 2, 3] and load_checkpoint(run)["iteration"] == 3


def test_pickle_checkpoint_in_the_run_dir_never_executes(tiny_model_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"iteration": 1, "models": Payload()}, run / "checkpoint.pt")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt is an old pickle checkpoint and is never loaded"):
        train(checkpoint_run_config(tiny_model_dir, run), resume=True, log=None)
    assert not marker.exists()
    # beside a real checkpoint the pickle is ignored too
    trainer = Trainer(checkpoint_run_config(tiny_model_dir, run, iterations=1), log=None)
    trainer.iteration = 1
    trainer.save_checkpoint()
    history = train(checkpoint_run_config(tiny_model_dir, run, iterations=1), resume=True, log=None)
    assert history == [] and not marker.exists()


def test_resume_with_nothing_to_resume_from_is_an_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".checkpoint.tmp-x1y2").mkdir(parents=True)  # killed during the first checkpoint write
    (run / ".checkpoint.tmp-x1y2" / "tensors.safetensors").write_bytes(b"\x00" * 64)
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1}\n')
    with pytest.raises(CheckpointError) as info:
        train(checkpoint_run_config(tiny_model_dir, run), resume=True, log=None)
    msg = str(info.value)
    assert "\n" not in msg and "no checkpoint to resume from" in msg and "killed during its first" in msg
    assert _iterations(run) == [0, 1]  # nothing touched


def test_corrupt_checkpoint_stops_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(checkpoint_run_config(tiny_model_dir, run, iterations=1), log=None)
    with pytest.raises(ckpt.CheckpointConfigError, match=re.escape("differs in ['lr']")):
        train(checkpoint_run_config(tiny_model_dir, run, iterations=1, lr=1e-3), resume=True, log=None)
    path = run / "checkpoint" / "tensors.safetensors"
    data = bytearray(path.read_bytes())
    data[-200:-104] = bytes(b ^ 0x5A for b in data[-200:-104])  # 96 bytes of weight data
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint file {path} is corrupt")):
        train(checkpoint_run_config(tiny_model_dir, run, iterations=1), resume=True, log=None)


def test_fresh_start_never_appends_to_stale_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(4)))
    Trainer(checkpoint_run_config(tiny_model_dir, run, iterations=1, save_every=0), log=None).train()
    assert _iterations(run) == [1]
    # the module-level entry point also drops a stale checkpoint a later --resume would pick up
    save_checkpoint(run, {"iteration": 9})
    train(checkpoint_run_config(tiny_model_dir, run, iterations=1, save_every=0), log=None)
    assert _iterations(run) == [1] and ckpt.find_checkpoint(run) is None


def test_cli_resume_without_checkpoint_prints_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    result = CliRunner().invoke(app, ["train", "--model", "unused", "--out", str(tmp_path), "--resume"])
    assert result.exit_code == 2
    assert "error: --resume: no checkpoint to resume from" in result.output
