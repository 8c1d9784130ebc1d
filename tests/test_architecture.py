"""The package layering holds: ``lint-imports`` (import-linter) passes with the contracts in pyproject.toml.

The contracts say which package may import which (``srpo_cli`` > ``benchmarks`` > ``learners`` >
``agents`` > ``srpo_envs`` > ``srpo_common``, ``leaderboards`` apart) and order the modules inside
``srpo_envs``, ``srpo_envs.tasks`` and ``agents``. The second test re-introduces, in a copy of the
tree, the import cycles these contracts were written against and checks that each one is reported,
so the first test cannot pass vacuously.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("srpo_common", "srpo_envs", "agents", "learners", "benchmarks", "leaderboards", "srpo_cli")
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the packages under ``root`` with ``root``'s pyproject.toml (no cache files)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_lint_imports_passes() -> None:
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


#: (file, import line appended in a function, the violation import-linter must report)
CYCLES = [
    # srpo_envs depending on agents: tasks/knowledge_base -> agents.scripted -> search -> knowledge_base
    (
        "srpo_envs/tasks/knowledge_base.py",
        "from agents.scripted import ScriptedTeam",
        "srpo_envs is not allowed to import agents",
    ),
    # math_verify -> tasks.math_data -> tasks.procedural -> math_verify
    (
        "srpo_envs/tasks/procedural.py",
        "from srpo_envs.math_verify import MathVerifyEnv",
        "srpo_envs.tasks is not allowed to import srpo_envs.math_verify",
    ),
    # agents.hf <-> agents.policy (the old PolicyMap.lora_per_role)
    (
        "agents/policy.py",
        "from agents.hf import lora_policy_map",
        "agents.policy is not allowed to import agents.hf",
    ),
    # leaderboards borrowing a benchmarks helper while benchmarks imports leaderboards
    (
        "leaderboards/render.py",
        "import benchmarks.report",
        "leaderboards is not allowed to import benchmarks",
    ),
    # learners.scale <-> learners.trainer (ScaleOut took the whole Trainer; now the ScaleHost protocol)
    (
        "learners/scale.py",
        "from learners.trainer import Trainer",
        "learners.scale is not allowed to import learners.trainer",
    ),
    # the update step reaching back into the loop's module
    (
        "learners/update.py",
        "from learners.trainer import TrainConfig",
        "learners.update is not allowed to import learners.trainer",
    ),
    # benchmarks.evaluate <-> benchmarks.evidence (the old EvalResult.to_record(evidence_dir=...))
    (
        "benchmarks/evaluate.py",
        "from benchmarks.evidence import record_evidence",
        "benchmarks.evaluate is not allowed to import benchmarks.evidence",
    ),
]


def test_contracts_report_each_reintroduced_cycle(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg,
            tmp_path / pkg,
            ignore=shutil.ignore_patterns("*.pyc", "__pycache__", "data", "checkpoints"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _lint_imports(tmp_path).returncode == 0  # the copy alone is clean
    for i, (rel, line, _) in enumerate(CYCLES):
        with open(tmp_path / rel, "a", encoding="utf-8") as fh:
            fh.write(f"\n\ndef _reintroduced_{i}():  # noqa\n    {line}  # noqa\n")
    res = _lint_imports(tmp_path)
    assert res.returncode != 0
    out = " ".join(res.stdout.split())  # the report wraps long lines
    for rel, _, violation in CYCLES:
        assert violation in out, f"{rel}: expected {violation!r} in\n{res.stdout}"
