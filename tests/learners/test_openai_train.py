"""``srpo train --backend openai`` against a stand-in vLLM server (HF model + runtime LoRA routes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from agents.policy import Generation  # noqa: E402
from agents.rollout import RolloutBatch  # noqa: E402
from agents.rows import Row  # noqa: E402
from learners.trainer import TrainConfig, Trainer, train  # noqa: E402


def _cfg(model: Path, out: Path, **kw) -> TrainConfig:
    base = dict(
        model=str(model), out_dir=str(out), iterations=2, tasks_per_iter=2, group_size=2, epochs=1,
        max_new_tokens=8, eval_every=0, save_every=0, lr=5e-3, sharing="lora", backend="openai",
        base_url="http://127.0.0.1:9/v1",
    )
    base.update(kw)
    return TrainConfig(**base)


def test_openai_backend_config_says_what_it_needs(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="backend=openai needs base_url"):
        _cfg(tiny_model_dir, tmp_path, base_url=None)
    with pytest.raises(ValueError, match="no endpoint that replaces a model's full weights"):
        _cfg(tiny_model_dir, tmp_path, sharing="shared")
    with pytest.raises(ValueError, match="rollout_workers must be 0"):
        _cfg(tiny_model_dir, tmp_path, rollout_workers=1)


def test_two_iterations_through_a_served_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from srpo_envs.env_server import serve_in_thread
    from tests._hf_openai_server import create_app

    # the server's "generation_config" sets top_k=5: only the neutral sampling set the requests name
    # (top_k=-1, ...) keeps its samples on the learner's softmax(z/T); before it they were truncated
    app = create_app(tiny_model_dir, default_top_k=5)
    srv = serve_in_thread(app)
    logged: list[str] = []
    try:
        history = train(
            _cfg(tiny_model_dir, tmp_path, base_url=f"{srv.url}/v1", temperature=0.8, served_concurrency=3),
            log=logged.append,
        )
    finally:
        srv.stop()
    assert any(line.startswith("served log-probs probe: mean |server - learner|") for line in logged), logged
    for body in app.state.standin["bodies"]:
        assert body["top_k"] == -1 and body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0, body
        assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    calls = app.state.standin["calls"]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [h["iteration"] for h in history][-2:] == [1, 2]
    for m in lines[1:]:
        # the server's ids, prompt ids and behaviour log-probs came through HTTP exactly: the learner's
        # pi_old recompute equals them to float32 round-off, so every TIS weight is 1
        assert m["rollout/logprob_max_abs_diff"] < 1e-4, m["rollout/logprob_max_abs_diff"]
        assert abs(m["rollout/tis_weight_mean"] - 1.0) < 1e-3
        assert m["rollout/refused_events"] == 0.0
    loads = [n for kind, n in calls if kind == "load"]
    roles = {n.split("@")[0] for n in loads}
    assert roles == {"proposer", "aggregator"}
    assert len(loads) == 2 * len(roles)  # version 0 at the start, version 1 after the first update
    assert {n for kind, n in calls if kind == "unload"} == {n for n in loads if n.endswith("-v0")}
    generated = {n for kind, n in calls if kind == "generate"}
    assert generated <= set(loads) and any(n.endswith("-v1") for n in generated)


def test_an_asynchronous_run_serves_each_batch_the_version_its_bound_assigns(tiny_model_dir: Path, tmp_path: Path) -> None:
    """max_staleness 1 through a served model: iteration t's rollouts come from the adapters of version
    max(0, t - 2), pushed from the learner's snapshot while it updates (never version 2, which a synchronous
    run serves at iteration 3); the probe ran before the generator; stale rows are weighed, not gated."""
    from srpo_envs.env_server import serve_in_thread
    from tests._hf_openai_server import create_app

    app = create_app(tiny_model_dir)
    srv = serve_in_thread(app)
    logged: list[str] = []
    try:
        history = train(
            _cfg(tiny_model_dir, tmp_path, base_url=f"{srv.url}/v1", iterations=3, max_staleness=1), log=logged.append
        )
    finally:
        srv.stop()
    assert any(line.startswith("served log-probs probe") for line in logged), logged
    assert [h["rollout/weights_of"] for h in history] == [0, 0, 1]
    assert [h["rollout/staleness_max"] for h in history] == [0, 1, 1]
    assert history[0]["rollout/tis_ess"] == pytest.approx(1.0, abs=1e-3)  # on-policy: server = learner
    assert history[-1]["rollout/mismatch_kl"] > 0 and history[-1]["rollout/refused_events"] == 0
    calls = app.state.standin["calls"]
    generated = [n for kind, n in calls if kind == "generate"]
    assert {n.rsplit("-", 1)[1] for n in generated} == {"v0", "v1"}, generated
    first_v1 = next(i for i, n in enumerate(generated) if n.endswith("-v1"))
    assert all(n.endswith("-v1") for n in generated[first_v1:])  # batch 3 alone, after batches 1-2 and the probe
    loads = [n for kind, n in calls if kind == "load"]
    assert sorted({n.rsplit("-", 1)[1] for n in loads}) == ["v0", "v1"]


def test_an_adapter_written_from_a_snapshot_is_the_snapshots(tiny_model_dir: Path, tmp_path: Path) -> None:
    """save_lora_adapter(state_dict=...) writes the weights of the snapshot, not the live model's (which the
    learner updates meanwhile): byte-equal to the adapter the live model wrote at that version."""
    import torch
    from safetensors.torch import load_file

    from agents.lora import default_lora_config, lora_policy_map
    from agents.vllm import save_lora_adapter

    model = lora_policy_map(str(tiny_model_dir), ["proposer", "aggregator"], default_lora_config(r=4))["proposer"].model
    snap = {k: v.detach().clone() for k, v in model.state_dict().items()}
    live = save_lora_adapter(model, "proposer", tmp_path / "live")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B.proposer" in name:
                p.add_(1.0)
    later = save_lora_adapter(model, "proposer", tmp_path / "later")
    old = save_lora_adapter(model, "proposer", tmp_path / "old", state_dict=snap)
    a, b, c = (load_file(str(d / "adapter_model.safetensors")) for d in (live, later, old))
    assert a.keys() == c.keys() and all(torch.equal(a[k], c[k]) for k in a)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert (live / "adapter_config.json").read_text() == (old / "adapter_config.json").read_text()


def test_evaluation_only_rows_are_refused_with_the_reason(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path, backend="hf", base_url=None), log=None)
    reason = "the server returned no token ids (not a vLLM server with return_token_ids)"
    row = Row(
        event_id="e/0", episode_id="e", pre_state_id="s", event_type="propose", step=0, agent="proposer_0",
        role="proposer", member_index=0, k=1, prompt_ids=[1, 2], response_ids=[], response_mask=[],
        behaviour_logprobs=[], policy_version=0, task_id="t", group_id="g", reward=0.0,
        meta={"evaluation_only": reason},
    )
    with pytest.raises(ValueError, match="evaluation-only and cannot train: the server returned no token ids"):
        trainer.scale.prepare(RolloutBatch(rows=[row], episodes=[]))
    assert Generation("", [], [], [1], 0, "stop").evaluation_only is None


def _refusal(tiny_model_dir: Path, tmp_path: Path, app_kw: dict, argv: list[str]) -> tuple[int, str, dict]:
    """``srpo train --backend openai`` against a stand-in created with ``app_kw``: exit code, output, state."""
    from typer.testing import CliRunner

    from srpo_cli.app import app as cli
    from srpo_envs.env_server import serve_in_thread
    from tests._hf_openai_server import create_app

    server = create_app(tiny_model_dir, **app_kw)
    srv = serve_in_thread(server)
    try:
        result = CliRunner().invoke(
            cli,
            ["train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), "--backend", "openai",
             "--base-url", f"{srv.url}/v1", "--sharing", "lora", "--iterations", "1", "--tasks-per-iter", "2",
             "--group-size", "2", "--max-new-tokens", "8", "--eval-every", "0", "--save-every", "0", *argv],
        )  # fmt: skip
    finally:
        srv.stop()
    return result.exit_code, result.output, server.state.standin


@pytest.mark.parametrize(
    ("app_kw", "argv", "sent"),
    [
        ({"force_top_k": 5}, [], "top_k=-1"),  # a server that samples with top_k whatever the request says
        ({}, ["--served-sampling", "top_k=5"], "top_k=5"),  # the user's explicit choice, honoured and checked
    ],
)
def test_probe_refuses_a_server_that_samples_with_top_k(
    tiny_model_dir: Path, tmp_path: Path, app_kw: dict, argv: list[str], sent: str
) -> None:
    code, output, state = _refusal(tiny_model_dir, tmp_path, app_kw, argv)
    print(output)
    assert code == 2, output
    assert "error: the server's log-probs disagree with the learner's before training (probe: one episode)" in output
    m = re.search(r"mean \|server - learner\| = ([0-9.]+) nats per token > --logprob-tolerance 0.05 \(max ([0-9.]+), "
                  r"mean server - learner ([+-][0-9.]+), over (\d+) response tokens of (\d+) rows\)", output)
    assert m is not None, output
    mean_abs, _max_abs, signed, tokens, rows = (float(g) for g in m.groups())
    assert mean_abs > 0.05 and tokens >= 1 and rows >= 1
    assert signed > 0 and "a truncated distribution (top_k" in output  # top-k renormalises: server above
    assert sent in output.split("the requests sent ")[1]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
    # refused before any update: only version-0 adapters were ever served
    assert all(n.endswith("-v0") for kind, n in state["calls"] if kind == "load")
    assert all(b["top_k"] == (5 if argv else -1) for b in state["bodies"])


def test_check_logprobs_numbers_and_tolerance() -> None:
    from learners.served import LogprobMismatchError, check_logprobs

    out = check_logprobs([[-1.0, -2.0, -9.0]], [[-1.5, -2.0, -1.0]], [[1, 1, 0]], 0.3, when="now")
    assert out == {"mean_abs": 0.25, "max_abs": 0.5, "mean_signed": 0.25, "tokens": 2.0, "rows": 1.0}
    with pytest.raises(LogprobMismatchError, match=r"= 0.2500 nats per token > --logprob-tolerance 0.2 \(max 0.5000"):
        check_logprobs([[-1.0, -2.0, -9.0]], [[-1.5, -2.0, -1.0]], [[1, 1, 0]], 0.2, when="now")
    # a NaN log-prob on a trained token is refused, not compared as "not above the tolerance"
    with pytest.raises(LogprobMismatchError, match="= nan nats per token"):
        check_logprobs([[-1.0, float("nan")]], [[-1.0, -2.0]], [[1, 1]], 0.3, when="now")
    with pytest.raises(ValueError, match="logprob_tolerance >= 0"):
        TrainConfig(model="m", logprob_tolerance=-1.0)


def test_every_iteration_is_gated_not_only_the_probe(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """A server that passes the probe and then samples with top_k (restarted with other settings): the
    iteration's rollout/logprob_abs_diff is held to the same tolerance, before its update."""
    from learners.scale import ScaleOut
    from learners.served import LogprobMismatchError
    from srpo_envs.env_server import serve_in_thread
    from tests._hf_openai_server import create_app

    app = create_app(tiny_model_dir)
    probe = ScaleOut.probe_served

    def probe_then_switch(self, *a, **kw):
        out = probe(self, *a, **kw)
        app.state.standin["force_top_k"] = 5
        return out

    monkeypatch.setattr(ScaleOut, "probe_served", probe_then_switch)
    srv = serve_in_thread(app)
    try:
        with pytest.raises(LogprobMismatchError, match=r"disagree with the learner's in this iteration's rollouts: mean"):
            train(_cfg(tiny_model_dir, tmp_path, base_url=f"{srv.url}/v1", iterations=1), log=None)
    finally:
        srv.stop()
    assert all(n.endswith("-v0") for kind, n in app.state.standin["calls"] if kind == "load")  # no update
