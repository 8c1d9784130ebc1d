"""``--max-staleness N``: the trainer's generator thread, admission, correction and exact resume.

The kill test runs real processes: a run killed with SIGKILL mid-run (its generator thread holding
in-flight batches) and resumed from its last checkpoint ends with the weights and metrics of an
uninterrupted run, bit for bit (CPU, fixed threads: every batch is a deterministic function of
(seed, iteration, the weights it was generated with), and the checkpoint carries those weights).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from learners.checkpoint import checkpoint_iteration, load_checkpoint
from learners.trainer import TrainConfig, train
from tests._builders import checkpoint_run_config

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("rollout_s", "update_s", "rollout_wait_s")

# the child: a run whose rewards always favour sample g0 (so the weights move every iteration)
_CHILD = r"""
import json, sys, torch
torch.set_num_threads(2)
from agents.rollout import RolloutCollector
from learners.trainer import TrainConfig, train
from tests._builders import g0_wins
collect = RolloutCollector.collect
def rewarded(self, *a, **k):
    batch = collect(self, *a, **k)
    g0_wins(batch.rows)
    return batch
RolloutCollector.collect = rewarded
cfg = TrainConfig.from_dict(json.loads(sys.argv[1]))
train(cfg, resume=sys.argv[2] == "resume", log=None)
"""


def _config(model: Path, out: Path, n: int, iterations: int = 8) -> TrainConfig:
    return checkpoint_run_config(model, out, iterations=iterations, max_staleness=n, tasks_per_iter=2)


def _child(cfg: TrainConfig, mode: str) -> subprocess.Popen:
    from dataclasses import asdict

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(asdict(cfg)), mode],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 600) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("n", [2])
def test_sigkill_during_an_async_run_resumes_exactly(tiny_model_dir: Path, tmp_path: Path, n: int) -> None:
    full = tmp_path / "full"
    _finish(_child(_config(tiny_model_dir, full, n), "fresh"))

    run = tmp_path / "killed"
    proc = _child(_config(tiny_model_dir, run, n), "fresh")
    deadline = time.monotonic() + 600
    while (checkpoint_iteration(run) or 0) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)  # mid-run: batches 4..3+N in flight (or being generated)
    proc.wait()
    killed_at = checkpoint_iteration(run)
    assert proc.returncode == -signal.SIGKILL and killed_at is not None and 3 <= killed_at < 8, killed_at
    state = load_checkpoint(run)
    carried = sorted(int(k) for k in state["async_snapshots"])
    assert carried == sorted({max(0, t - 1 - n) for t in range(killed_at + 1, killed_at + n + 1)} - {killed_at})

    _finish(_child(_config(tiny_model_dir, run, n), "resume"))
    assert _metrics(run) == _metrics(full)
    wa, wb = load_checkpoint(full)["models"]["model0"], load_checkpoint(run)["models"]["model0"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bit-identical by design (same kernels and inputs)
    staleness = [r["rollout/staleness_max"] for r in _metrics(full)]
    assert max(staleness) == n  # the rows really were N versions behind


def test_max_staleness_config_is_checked() -> None:
    with pytest.raises(ValueError, match="max_staleness must be an integer >= 0"):
        TrainConfig(algo="srpo", model="m", max_staleness=-1)
    with pytest.raises(ValueError, match="staleness_correction must be one of"):
        TrainConfig(algo="srpo", model="m", max_staleness=1, staleness_correction="areal")
    with pytest.raises(ValueError, match="in-process vLLM engine shares the learner's device.*backend=openai"):
        TrainConfig(algo="srpo", model="m", max_staleness=1, backend="vllm")
    TrainConfig(algo="srpo", model="m", max_staleness=1, backend="openai", sharing="lora", base_url="http://h/v1")
    with pytest.raises(ValueError, match="--tis off leaves no level"):
        TrainConfig(algo="srpo", model="m", max_staleness=1, tis="off")
    TrainConfig(algo="srpo", model="m", max_staleness=1, tis="off", staleness_correction="none")


def test_async_run_logs_staleness_and_the_correction(tiny_model_dir: Path, tmp_path: Path) -> None:
    """N = 2 with rewards that move the weights: iteration t trains on rows of the weights after
    iteration max(0, t-3), the correction's weights are logged (ESS < 1 once rows are stale and the
    policy moved), and the plain-clip ablation logs no correction."""
    from agents.rollout import RolloutCollector
    from tests._builders import g0_wins

    collect = RolloutCollector.collect

    def rewarded(self, *a, **k):
        batch = collect(self, *a, **k)
        g0_wins(batch.rows)
        return batch

    mp = pytest.MonkeyPatch()
    mp.setattr(RolloutCollector, "collect", rewarded)
    try:
        hist = train(_config(tiny_model_dir, tmp_path / "a", 2, iterations=5), log=None)
        plain = train(
            checkpoint_run_config(
                tiny_model_dir, tmp_path / "b", iterations=5, max_staleness=2, tasks_per_iter=2,
                staleness_correction="none",
            ),
            log=None,
        )  # fmt: skip
    finally:
        mp.undo()
    assert [h["rollout/weights_of"] for h in hist] == [0, 0, 0, 1, 2]
    assert [h["rollout/staleness_max"] for h in hist] == [0, 1, 2, 2, 2]
    assert all(h["rollout/stale_dropped"] == 0 and h["rollout/refused_events"] == 0 for h in hist)
    assert hist[0]["rollout/tis_ess"] == pytest.approx(1.0, abs=1e-9)  # on-policy: every weight 1
    assert hist[-1]["rollout/tis_ess"] < 1.0 and hist[-1]["rollout/mismatch_kl"] > 0
    assert "rollout/tis_ess" not in plain[-1] and plain[-1]["rollout/staleness_max"] == 2


@pytest.mark.slow
def test_ray_rollout_workers_generate_the_async_batches(tiny_model_dir: Path, tmp_path: Path) -> None:
    """N = 1 with one Ray rollout worker: the generator thread pushes each batch's snapshot to the
    worker before collecting, so the run samples the tokens the in-process generator samples (the
    worker's float32 log-probs may differ in the last bits: other process, same kernels) and every
    batch comes from the weights the bound assigns, rows one version behind. A worker SIGKILLed as it
    is about to generate iteration 3's batch (weights 1, the learner at 2) is replaced, gets that
    batch's weights again, and the run is the same run."""
    import os
    import signal

    import ray

    from agents.ray_rollout import RayRolloutCollector, ensure_ray, shutdown_ray
    from agents.rollout import RolloutCollector
    from tests._builders import g0_wins

    def rewarded(collect):
        def run(self, *a, **k):
            batch = collect(self, *a, **k)
            g0_wins(batch.rows)
            return batch

        return run

    mp = pytest.MonkeyPatch()
    mp.setattr(RolloutCollector, "collect", rewarded(RolloutCollector.collect))
    mp.setattr(RayRolloutCollector, "collect", rewarded(RayRolloutCollector.collect))
    started = not ray.is_initialized()
    if started:
        ensure_ray(num_cpus=2)
    try:
        local = train(_config(tiny_model_dir, tmp_path / "local", 1, iterations=4), log=None)
        remote = train(
            checkpoint_run_config(
                tiny_model_dir, tmp_path / "ray", iterations=4, max_staleness=1, tasks_per_iter=2,
                rollout_workers=1,
            ),
            log=None,
        )  # fmt: skip
        pools: list = []

        def killing(collect):
            def run(self, *a, **k):
                pools.append(self.pool)
                if len(pools) == 3:  # iteration 3's batch, generated while the learner updates on iteration 2
                    os.kill(self.pool.pids()[0], signal.SIGKILL)
                return collect(self, *a, **k)

            return run

        mp.setattr(RayRolloutCollector, "collect", killing(RayRolloutCollector.collect))
        killed = train(
            checkpoint_run_config(
                tiny_model_dir, tmp_path / "killed", iterations=4, max_staleness=1, tasks_per_iter=2,
                rollout_workers=1,
            ),
            log=None,
        )  # fmt: skip
    finally:
        mp.undo()
        if started:
            shutdown_ray()
    assert pools[-1].recoveries == 1
    keys = (*("team_tokens", "mean_response_len", "rows", "train_accuracy", "rollout/weights_of"), "actor/loss")
    assert [{k: h[k] for k in keys} for h in killed] == [{k: h[k] for k in keys} for h in remote]
    assert [h["rollout/weights_of"] for h in remote] == [0, 0, 1, 2]
    assert [h["rollout/staleness_max"] for h in remote] == [0, 1, 1, 1]
    same = ("team_tokens", "mean_response_len", "rows", "train_accuracy", "rollout/staleness")
    assert [{k: h[k] for k in same} for h in remote] == [{k: h[k] for k in same} for h in local]
    for a, b in zip(remote, local, strict=True):
        assert a["actor/loss"] == pytest.approx(b["actor/loss"], abs=1e-4 * max(1.0, abs(b["actor/loss"])))
