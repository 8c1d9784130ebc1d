"""``srpo train --backend openai`` against a stand-in vLLM server (HF model + runtime LoRA routes)."""

from __future__ import annotations

import json
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

    app = create_app(tiny_model_dir)
    srv = serve_in_thread(app)
    try:
        history = train(_cfg(tiny_model_dir, tmp_path, base_url=f"{srv.url}/v1", temperature=0.8), log=None)
    finally:
        srv.stop()
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
