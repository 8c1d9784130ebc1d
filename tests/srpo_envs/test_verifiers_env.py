"""Verifiers-v0: verifiers environments (the real package, 0.4) played as srpo envs.

Without verifiers (the main suite's environment) the id is listed but not built, in one line. With it
(``.ci/verifiers.sh`` runs this file in ``.venvs/verifiers``) a single-turn taskset and a multi-turn
env of verifiers' own kind (examples/verifiers_envs: they import nothing of srpo) pass the conformance
checks every env passes, with fewer steps, since each model call starts verifiers' harness program, and
their rubric's rewards are the episode rewards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import srpo_envs
from srpo_envs.conformance import check_api, check_events

ROOT = Path(__file__).resolve().parents[2]
HAVE_VERIFIERS = importlib.util.find_spec("verifiers") is not None
needs_verifiers = pytest.mark.skipif(not HAVE_VERIFIERS, reason="verifiers runs in .venvs/verifiers (.ci/verifiers.sh)")


@pytest.fixture(scope="module", autouse=True)
def _example_envs() -> None:
    """The example verifiers envs importable by id, as a user's installed env would be."""
    sys.path.insert(0, str(ROOT / "examples" / "verifiers_envs"))
    yield
    sys.path.remove(str(ROOT / "examples" / "verifiers_envs"))


def test_listed_everywhere_built_only_where_verifiers_is() -> None:
    spec = srpo_envs.registry["Verifiers-v0"]
    assert spec.requires == ("verifiers",)
    assert spec.available() is HAVE_VERIFIERS
    if not HAVE_VERIFIERS:
        with pytest.raises(ImportError, match=r"\.venvs/verifiers/bin/srpo") as info:
            srpo_envs.make("Verifiers-v0")
        assert "\n" not in str(info.value)


def test_render_messages() -> None:
    from srpo_envs.verifiers_env import render_messages

    assert render_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]) == "S\n\nQ"
    turns = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
    ]
    assert render_messages(turns) == "User: Q\n\nAssistant: A\n\nUser: more"


@needs_verifiers
@pytest.mark.parametrize("taskset", ["vf-arith", "vf-guess"])
def test_conformance(taskset: str) -> None:
    def make() -> object:
        return srpo_envs.make("Verifiers-v0", taskset=taskset, num_tasks=8)

    check_api(make, num_cycles=12)
    check_events(make, steps=24, max_step_s=20.0)


@needs_verifiers
def test_single_turn_reward_is_the_rubric() -> None:
    env = srpo_envs.make("Verifiers-v0", taskset="vf-arith", num_tasks=4)
    try:
        assert env.possible_agents == ["agent"]
        assert env.role_prompts["agent"].startswith("You solve math problems")
        for i, task in enumerate(env.tasks):
            obs, _ = env.reset(seed=i, options={"task_index": i})
            assert env.active_agents == ("agent",)
            assert obs["agent"] == task.data.prompt  # the system prompt is the role's, sent by the policy
            answer = task.data.answer + (i % 2)  # odd tasks answered wrong
            _, rewards, terminations, _, _ = env.step({"agent": f"So \\boxed{{{answer}}}."})
            assert terminations["agent"] and rewards["agent"] == float(i % 2 == 0)
            assert env.outcome["vf_rewards"] == {"exact": float(i % 2 == 0)}
            assert [e.k for e in env.events] == [1]
    finally:
        env.close()


@needs_verifiers
def test_multi_turn_events_are_its_turns() -> None:
    env = srpo_envs.make("Verifiers-v0", taskset="vf-guess", num_tasks=4)
    try:
        for i, task in enumerate(env.tasks):
            obs, _ = env.reset(seed=i, options={"task_index": i})
            lo, hi = 1, 16
            while env.agents:  # binary search: 4 guesses always suffice for 1..16
                guess = (lo + hi) // 2
                obs, rewards, *_ = env.step({"player": f"\\boxed{{{guess}}}"})
                text = obs["player"]
                if re.search(r"Higher\.$", text):
                    lo = guess + 1
                elif re.search(r"Lower\.$", text):
                    hi = guess - 1
            assert rewards["player"] == 1.0 and env.outcome["vf_rewards"] == {"hit": 1.0}
            assert all(e.k == 1 for e in env.events) and 1 <= len(env.events) <= 4
            assert env.events[-1].outputs["player"] == f"\\boxed{{{task.data.secret}}}"
    finally:
        env.close()


@needs_verifiers
def test_trains_under_srpo_train(tmp_path: Path) -> None:
    """``srpo train`` on a verifiers env, as docs/verifiers.md runs it: the weights move, every event is K=1."""
    from safetensors.torch import load_file

    model = ROOT / "agents" / "checkpoints" / "mini-columns-sft"
    examples = str(ROOT / "examples" / "verifiers_envs")
    env = {k: v for k, v in os.environ.items() if k != "SRPO_MODEL_DEFAULTS"}  # as a user runs it: tiny-model settings
    env["PYTHONPATH"] = os.pathsep.join([examples, os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "srpo_cli", "train", "--env", "Verifiers-v0", "--env-kwarg", "taskset=vf-arith",
         "--model", str(model), "--iterations", "2", "--eval-every", "0", "--set", "rollout.tasks_per_iter=4",
         "--set", "rollout.group_size=4", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    iters = [x for x in lines if "iteration" in x and "rollout/mean_k" in x]
    assert [x["iteration"] for x in iters] == [1, 2]
    assert all(x["rollout/mean_k"] == 1.0 and x["rows"] == 16 for x in iters)
    before = load_file(str(model / "model.safetensors"))
    after = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert any(not before[k].float().equal(after[k].float()) for k in before)
