"""SFT warm start: teacher examples per role, response-only loss, saved model and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agents.hf import HFPolicy
from learners.presets import GYM_MIXTURE
from learners.sft import SFTConfig, _batch, build_examples, run_sft

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)


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


def test_prompt_loss_adds_the_prompt_tokens_cross_entropy(tiny_model_dir: Path) -> None:
    """``prompt_loss_weight``: the response part is the HF labels loss; the prompt part is the mean
    next-token cross-entropy over real prompt tokens (no padding, not the response)."""
    from learners.sft import _response_and_prompt_loss

    policy = HFPolicy(tiny_model_dir)
    examples = [([5, 6, 7, 8], [9, 10], "searcher"), ([5, 11], [12, 13, 14], "aggregator")]
    batch = _batch(examples, pad_id=policy.pad_id)
    model = policy.model
    hf = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    response, total = _response_and_prompt_loss(model, batch, 0.5)
    assert torch.allclose(response, hf.loss, atol=1e-5)
    logp = torch.log_softmax(hf.logits.float(), -1)
    terms = [-logp[0, i, t] for i, t in enumerate([6, 7, 8])] + [-logp[1, 0, 11]]
    assert torch.allclose(total - response, 0.5 * torch.stack(terms).mean(), atol=1e-5)
    with pytest.raises(ValueError, match="prompt_loss_weight"):
        SFTConfig(prompt_loss_weight=-1.0)


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


def test_search_teacher_is_accurate_and_its_filter_keeps_only_imitable_outputs() -> None:
    """The reading teacher answers most KB questions; the filter drops every wrong query/answer."""
    import srpo_envs
    from agents.scripted import ScriptedTeam, search_teacher_correct

    env = srpo_envs.make("MultiTurnSearch-v0", split="train", dataset_size=60)
    team = ScriptedTeam.search_teacher(env, p_correct=0.7, seed=0)
    kept = dropped = correct = 0
    for i in range(60):
        obs, infos = env.reset(seed=i, options={"task_index": i})
        while env.agents:
            actions = team.act(obs, infos)
            for agent, text in actions.items():
                ok = search_teacher_correct(env, infos[agent]["role"], text)
                kept, dropped = kept + ok, dropped + (not ok)
                if ok and "<search>" in text:
                    assert text[len("<search>") : -len("</search>")] in env.unwrapped.gold_titles
            obs, _, _, _, infos = env.step(actions)
        correct += env.unwrapped.events[-1].reward > 0
    assert correct >= 50  # wrong queries only cost a turn; the teacher still answers ~95%
    assert kept > 0 and dropped > 0  # p_correct < 1: some queries are wrong, and they are filtered


def test_search_domain_examples_and_sft(tmp_path: Path) -> None:
    """Search-domain SFT: searcher and aggregator examples from KB play, then a saved model + report."""
    from agents.corpus import search_corpus
    from agents.tiny import init_tiny

    base = tmp_path / "base"
    init_tiny(base, size="tiny", seed=0, corpus=search_corpus(300), vocab_size=1024)
    cfg = _small_cfg(domain="search", search_episodes=20, refine_steps=0)
    policy = HFPolicy(base)
    examples = build_examples(policy.tokenizer, cfg)
    assert {role for _, _, role in examples} == {"searcher", "aggregator"}
    for _, target, role in examples:
        text = policy.tokenizer.decode(target[:-1])
        assert ("<search>" in text) if role == "searcher" else ("<answer>" in text or "<search>" in text)
    report = run_sft(base, tmp_path / "out", cfg, log=None)
    assert set(report["accuracy"]) == {"parallel/kb"} and 0.0 <= report["accuracy"]["parallel/kb"] <= 1.0


def test_sft_rejects_unknown_domain_and_dataset() -> None:
    with pytest.raises(ValueError, match="domain"):
        SFTConfig(domain="chess")
    with pytest.raises(ValueError, match="dataset"):
        SFTConfig(dataset="procedural-chess")


def test_a_reasoning_gym_mixture_teaches_every_family_in_it(tiny_model_dir: Path) -> None:
    """One pass over ``reasoning-gym:composite`` imitates each family's worked solutions in its own
    phrasing (the gym recipe mixes its families: one-family passes in turn forget the other); a mixture
    with a family srpo writes no solutions for is refused in one line."""
    policy = HFPolicy(tiny_model_dir)
    cfg = _small_cfg(dataset="reasoning-gym:composite", dataset_config=GYM_MIXTURE, difficulties=(1,),
                     tasks_per_difficulty=60, workflows=("proposers-aggregator",))
    proposals = [(p, t) for p, t, role in build_examples(policy.tokenizer, cfg) if role == "proposer"]
    prompts = [policy.tokenizer.decode(p) for p, _ in proposals]
    solutions = [policy.tokenizer.decode(t[:-1]) for _, t in proposals]
    assert any("State the final answer to the following arithmetic problem" in p for p in prompts)
    assert any("Calculate " in p for p in prompts)
    assert all(s.endswith(".") and "\\boxed{" in s for s in solutions)
    mixed = {"datasets": [{"name": "chain_sum", "weight": 1.0, "config": {}},
                          {"name": "leg_counting", "weight": 1.0, "config": {}}]}
    with pytest.raises(ValueError, match="mixes families with worked solutions .*; got leg_counting$"):
        SFTConfig(dataset="reasoning-gym:composite", dataset_config=mixed)


def test_recipe_chains_passes_and_keeps_the_whole_recipe(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """run_recipe: each pass starts from the previous one's saved (bf16) weights; reports nest."""
    from learners import sft as sft_mod

    small = dict(
        steps=2, batch_size=2, refine_steps=0, tasks_per_difficulty=6, eval_problems=1, max_new_tokens=4
    )
    monkeypatch.setitem(sft_mod.RECIPES, "math", (small, {**small, "seed": 2, "lr": 1e-3}))
    report = sft_mod.run_recipe(tiny_model_dir, tmp_path / "final", "math", log=None)
    assert report["config"]["seed"] == 2 and report["config"]["save_dtype"] == "bfloat16"
    assert report["base_model"] == str(tmp_path / "final-pass1")
    assert report["base_report"]["config"]["seed"] == 0
    saved = json.loads((tmp_path / "final" / "sft_report.json").read_text())
    assert saved["base_report"] == report["base_report"]
    with pytest.raises(ValueError, match="recipe"):
        sft_mod.run_recipe(tiny_model_dir, tmp_path / "x", "chess", log=None)


def test_shipped_checkpoints_record_their_recipe() -> None:
    """The shipped warm starts carry the recipe that rebuilds them (and the accuracy it reached)."""
    from learners.presets import RECIPES

    root = Path(__file__).resolve().parents[2] / "agents" / "checkpoints"
    for name, recipe in (
        ("mini-sft", "math"),
        ("mini-columns-sft", "columns"),
        ("mini-columns5-sft", "columns5"),
        ("mini-search-sft", "search"),
        ("mini-search-worlds-sft", "search-worlds"),
        ("mini-search-worlds-routed-sft", "search-worlds-routed"),
        ("mini-gym-sft", "gym"),
    ):
        report = json.loads((root / name / "sft_report.json").read_text())
        assert report["config"]["domain"] == ("search" if recipe.startswith("search") else "math")
        assert report["config"]["save_dtype"] == "bfloat16"
        assert any(f"--recipe {recipe}" in line for line in report["how_to_regenerate"])
        last = json.loads(json.dumps(RECIPES[recipe][-1]))  # tuples as JSON lists
        assert all(report["config"][k] == v for k, v in last.items())
        assert all(0.0 < v < 1.0 for v in report["accuracy"].values())
