"""TRL's door: ``examples/trl_grpo.py`` runs TRL 1.16's ``GRPOTrainer`` on an srpo env (``rollout_func``).

The example runs in a subprocess (TRL and accelerate keep process-wide state) for 2 steps on CPU with
the shipped ``mini-columns-sft``; its printed lines are the evidence: two TRL steps with finite losses,
the weights moved, and the share of each episode's outputs that TRL's one-row-per-prompt hook trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~40-90 s on 2 shared cores (2 GRPO steps of 8 four-agent episodes each)
def test_trl_grpo_trainer_trains_on_an_srpo_env_for_two_steps() -> None:
    cmd = [sys.executable, str(ROOT / "examples" / "trl_grpo.py"), "--steps", "2", "--prompts", "2",
           "--generations", "4", "--tasks", "4"]
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("trl step", "trl_grpo:"))]
    print("\n".join(lines))
    assert done.returncode == 0, done.stderr[-4000:]
    import trl

    assert trl.__version__.startswith("1.16.")
    steps = [line for line in lines if line.startswith("trl step")]
    assert len(steps) == 2
    summary = json.loads(lines[-1].removeprefix("trl_grpo: "))
    assert summary["steps"] == 2 and summary["torch"].startswith("2.13.0")
    assert summary["max_abs_weight_change"] > 0  # TRL's optimizer stepped on the rollout_func's tokens
    # 2 steps x 2 tasks x 4 generations = 16 episodes, each 3 proposers + 1 aggregator = 4 outputs;
    # TRL's hook trains one row per episode (proposer_0's): 16 of 64
    assert summary["trained"] == 16 and summary["outputs"] == 64
