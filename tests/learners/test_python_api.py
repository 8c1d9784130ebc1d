"""The library surface: the packages' main names import lazily, and the "Train from Python" page's script
(examples/train_from_python.py, shown unchanged on docs/python.md) trains the shipped model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import srpo_envs
from learners import TrainConfig, Trainer
from learners.config import reference_page

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_from_python.py"


def test_main_names_import_from_the_packages_without_loading_torch() -> None:
    code = (
        "import sys, learners, agents, benchmarks, leaderboards\n"
        "assert 'torch' not in sys.modules, 'import learners loaded torch'\n"
        "from learners import Trainer, TrainConfig, register_algorithm, settings_for\n"
        "from agents import ScriptedTeam, HFPolicy\n"
        "from benchmarks import register_suite, run_comparison, register_training_env\n"
        "from leaderboards import make_record, validate_record\n"
        "import learners.trainer\n"
        "assert Trainer is learners.trainer.Trainer\n"
        "for pkg in (learners, agents, benchmarks, leaderboards):\n"
        "    for name in pkg.__all__:\n"
        "        getattr(pkg, name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_page_shows_the_script_unchanged() -> None:
    page = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    assert f"```python\n{SCRIPT.read_text(encoding='utf-8')}```" in page
    assert len(SCRIPT.read_text().splitlines()) <= 30


@pytest.mark.slow
def test_the_train_from_python_script_trains_the_shipped_model(tmp_path: Path) -> None:
    (tmp_path / "agents").symlink_to(ROOT / "agents")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert [x.split(":")[0] for x in lines[:4]] == [f"iteration {i}" for i in range(1, 5)], lines
    start, end = (float(x) for x in lines[-1].removeprefix("held-out accuracy ").split(" -> "))
    assert end >= start, lines[-1]
    assert (tmp_path / "runs" / "python" / "final" / "config.json").is_file()


def test_the_config_reference_page_is_the_class() -> None:
    """docs/config-reference.md is generated from TrainConfig (`python -m learners.config`): a field added,
    removed or re-documented without regenerating the page fails here."""
    page = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert page == reference_page(), "regenerate: python -m learners.config > docs/config-reference.md"


def test_a_trainer_takes_env_factories_instead_of_a_registered_id(tmp_path: Path) -> None:
    """``Trainer(cfg, env=..., eval_env=...)``: the rollouts and the held-out evaluation come from the
    factories passed in (an env built the user's way), not from ``srpo_envs.make(cfg.env_id)``."""
    built: list[str] = []

    def columns(split: str):
        def make():
            built.append(split)
            return srpo_envs.make("ProcArith-v0", workflow="routed", dataset="procedural-columns", split=split)

        return make

    cfg = TrainConfig(
        model=str(ROOT / "agents" / "checkpoints" / "mini-columns-sft"), out_dir=str(tmp_path / "run"),
        iterations=1, tasks_per_iter=2, group_size=2, max_new_tokens=8, eval_problems=2, save_every=0,
    )  # fmt: skip
    trainer = Trainer(cfg, log=None, env=columns("train"), eval_env=columns("test"))
    batch = trainer.rollout()
    assert batch.rows
    # the default env (ProcArith-v0, proposers-aggregator) has no route events: these came from the factory
    assert {r.event_type for r in batch.rows} >= {"route", "propose", "aggregate"}  # the routed workflow
    trainer.update(batch)
    assert trainer.iteration == 1
    trainer.evaluate(n=2, k=1)
    assert "train" in built and "test" in built


def test_a_trainer_trains_policy_objects_it_is_given(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``Trainer(cfg, policies=HFPolicy(...))``: the object built the user's way is the one rolled out and
    updated in place (no model loaded from ``cfg.model``, which stays empty)."""
    from agents import HFPolicy, PolicyMap

    policy = HFPolicy(str(tiny_model_dir))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    cfg = TrainConfig(
        out_dir=str(tmp_path / "run"), iterations=1, tasks_per_iter=2, group_size=2, max_new_tokens=8,
        eval_problems=2, save_every=0, lr=1e-2,
    )  # fmt: skip
    assert cfg.model == ""
    trainer = Trainer(cfg, log=None, policies=policy)
    assert all(trainer.policies[role] is policy for role in trainer.roles)
    batch = trainer.rollout()
    for row in batch.rows:  # a reward to learn from: the first sample of each task wins
        row.outcome_reward = 1.0 if row.episode_id.endswith("-g0") else 0.0
        row.reward = row.outcome_reward - row.penalty
    trainer.update(batch)
    moved = [k for k, v in policy.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved, "the given policy's weights did not move"

    with pytest.raises(ValueError, match=r"no policy for the env's roles \['aggregator'"):
        Trainer(cfg, log=None, policies=PolicyMap.per_role({"proposer": policy, "router": policy}))


def test_a_trainer_scores_training_episodes_with_the_reward_it_is_given(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``Trainer(cfg, reward=fn)``: every training episode's reward is ``fn(outcome, env)`` (the env's own
    reward kept as ``env_reward``); evaluation still counts the env's ``correct``; a reward that is not a
    finite number stops the rollout with a line naming the function."""
    seen: dict[str, dict] = {}

    def shorter_is_better(outcome: dict, env) -> float:
        seen[env.episode_id] = outcome
        return 2.0 - 0.01 * len(str(outcome.get("answer")))

    cfg = TrainConfig(
        model=str(tiny_model_dir), out_dir=str(tmp_path / "run"), iterations=1, tasks_per_iter=2,
        group_size=2, max_new_tokens=8, eval_problems=2, save_every=0,
    )  # fmt: skip
    trainer = Trainer(cfg, log=None, reward=shorter_is_better)
    batch = trainer.rollout()
    assert len(seen) == len(batch.episodes) == 4
    for episode in batch.episodes:
        outcome = seen[episode.episode_id]
        assert outcome["env_reward"] == float(outcome["correct"]) - outcome.get("member_cost", 0.0)
        assert episode.reward == pytest.approx(2.0 - 0.01 * len(str(outcome["answer"])), abs=1e-9)
    trainer.evaluate(n=2, k=1)
    assert len(seen) == 4, "the held-out evaluation used the training reward"

    def broken(outcome: dict, env) -> float:
        return float("nan")

    with pytest.raises(ValueError, match="reward_fn .*broken returned nan; it must return a finite number"):
        Trainer(cfg, log=None, reward=broken).rollout()
