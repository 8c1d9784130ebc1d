"""SFT warm start: teacher examples per role, response-only loss, saved model and report."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agents.hf import HFPolicy
from agents.sft import SFTConfig, _batch, build_examples, run_sft


def _small_cfg(**kw) -> SFTConfig:
    base = dict(
        steps=4, batch_size=4, refine_steps=2, tasks_per_difficulty=9, eval_problems=2, max_new_tokens=8
    )
    base.update(kw)
    return SFTConfig(**base)


def test_examples_cover_every_role_and_only_correct_proposals(tiny_model_dir: Path) -> None:
    policy = HFPolicy(tiny_model_dir)
    examples = build_examples(policy.tokenizer, _small_cfg(tasks_per_difficulty=30))
    roles = {role for _, _, role in examples}
    assert roles == {"proposer", "solver", "aggregator", "verifier", "router"}
    end = policy.tokenizer.get_vocab()["<|im_end|>"]
    for prompt, target, role in examples:
        assert target[-1] == end and prompt
        if role in ("proposer", "solver"):
            text = policy.tokenizer.decode(target[:-1])
            assert "\\boxed{" in text


def test_batch_masks_prompt_and_padding() -> None:
    batch = _batch([([5, 6, 7], [8, 9], "proposer"), ([5], [8, 9, 10], "router")], pad_id=0)
    assert batch["labels"].tolist() == [[-100, -100, -100, 8, 9], [-100, 8, 9, 10, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]


def test_run_sft_trains_saves_and_reports(tiny_model_dir: Path, tmp_path: Path) -> None:
    before = {k: v.clone() for k, v in HFPolicy(tiny_model_dir).model.state_dict().items()}
    report = run_sft(tiny_model_dir, tmp_path / "out", _small_cfg(), log=None)
    saved = json.loads((tmp_path / "out" / "sft_report.json").read_text())
    assert saved["accuracy"] == report["accuracy"] and set(report["accuracy"]) == {
        "proposers-aggregator/d1",
        "proposers-aggregator/d2",
    }
    assert all(0.0 <= v <= 1.0 for v in report["accuracy"].values())
    after = HFPolicy(tmp_path / "out").model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
