"""The library surface: the packages' main names import lazily, and the "Train from Python" page's script
(examples/train_from_python.py, shown unchanged on docs/python.md) trains the shipped model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import srpo_envs
from learners import TrainConfig, Trainer
from learners.config import reference_page

ROOT = Path(__file__).resolve().parent.parent
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
