"""srpo's envs as a verifiers environment, through verifiers' own commands (``vf-eval``, ``vf-validate``).

``.ci/verifiers.sh`` runs this file in ``.venvs/verifiers`` (verifiers 0.4.0); the main suite skips it.
The model is an OpenAI-compatible stand-in serving a shipped tiny model (tests/_hf_openai_server.py,
streaming as verifiers' chat harness asks). For every trace ``vf-eval`` writes, the completions it holds
are replayed through srpo's env directly, and the reward verifiers reports must be the env's own.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import srpo_envs
from srpo_envs.env_server import serve_in_thread

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None, reason="verifiers runs in .venvs/verifiers (.ci/verifiers.sh)"
)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLUMNS = {"dataset": "procedural-columns", "difficulty": 2, "split": "test"}
#: (srpo env, its kwargs, the shipped model that plays it): the three math workflows and the search team.
CASES = {
    "solver-verifier": ("MathVerify-SolverVerifier-v0", COLUMNS, "mini-columns-sft"),
    "proposers-aggregator": ("MathVerify-v0", COLUMNS, "mini-columns-sft"),
    "routed": ("MathVerify-Routed-v0", COLUMNS, "mini-columns-sft"),
    "search": ("MultiTurnSearch-v0", {"split": "test"}, "mini-search-sft"),
}
NUM_TASKS = 6


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    from tests._hf_openai_server import create_app

    started = {m: serve_in_thread(create_app(ROOT / "agents" / "checkpoints" / m, served_name=m)) for m in
               {c[2] for c in CASES.values()}}
    yield {m: s.url for m, s in started.items()}
    for s in started.values():
        s.stop()


def _toml(path: Path, section: str, env_id: str, env_kwargs: dict[str, Any]) -> Path:
    kwargs = "\n".join(f"{k} = {json.dumps(v)}" for k, v in env_kwargs.items())
    path.write_text(
        f'[{section}]\nenv = "{env_id}"\nnum_tasks = {NUM_TASKS}\n\n[{section}.env_kwargs]\n{kwargs}\n'
    )
    return path


def _replayed(task: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, float]:
    """Every agent's reward when the traces' completions are played through srpo's env directly."""
    outputs: dict[int, dict[str, str]] = defaultdict(dict)
    for t in traces:
        reply = [n["message"]["content"] for n in t["nodes"] if n["message"]["role"] == "assistant"][-1]
        # verifiers hands an env a reply stripped of surrounding whitespace (Segment.last_reply)
        outputs[t["info"]["srpo_event"]][t["info"]["srpo_agent"]] = (reply or "").strip()
    env = srpo_envs.make(task["env"], **task["env_kwargs"])
    env.reset(seed=task["seed"], options={"task_index": task["task_index"]})
    totals = dict.fromkeys(env.possible_agents, 0.0)
    for i in sorted(outputs):
        assert set(outputs[i]) == set(env.active_agents), (i, outputs[i], env.active_agents)
        _, rewards, *_ = env.step(outputs[i])
        for agent, value in rewards.items():
            totals[agent] += value
    assert not env.agents, "the recorded episode ended before the env's did"
    return totals


@pytest.mark.parametrize("case", sorted(CASES))
def test_vf_eval_rewards_are_the_envs_own(case: str, servers: dict[str, str], tmp_path: Path) -> None:
    env_id, env_kwargs, model = CASES[case]
    config = _toml(tmp_path / "eval.toml", "env.taskset", env_id, env_kwargs)
    out = tmp_path / "out"
    run = subprocess.run(
        [str(BIN / "vf-eval"), "srpo-verifiers", "@", str(config), "--model", model,
         "--client.base-url", f"{servers[model]}/v1", "--sampling.max-tokens", "64",
         "--sampling.temperature", "1.0", "-r", "2", "--no-push", "-o", str(out)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    episodes = [json.loads(line) for f in out.glob("*/traces.jsonl") for line in f.read_text().splitlines()]
    assert len(episodes) == 2 * NUM_TASKS
    seen: set[float] = set()
    for episode in episodes:
        assert episode["ok"], episode["errors"]
        task = episode["task"]["data"]
        expected = _replayed(task, episode["traces"])
        for t in episode["traces"]:
            reported = t["rewards"]["srpo_reward"]["score"]
            assert reported == pytest.approx(expected[t["info"]["srpo_agent"]], abs=1e-9)
            assert t["agent"]["name"] == t["info"]["srpo_agent"].rsplit("_", 1)[0]  # the role's seat
            seen.add(reported)
    if case != "search":  # the tiny math model is right about half the time here: both rewards occur
        assert len(seen) > 1, seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_vf_validate_passes(case: str, tmp_path: Path) -> None:
    env_id, env_kwargs, _ = CASES[case]
    config = _toml(tmp_path / "validate.toml", "taskset", env_id, env_kwargs)
    out = tmp_path / "out"
    run = subprocess.run(
        [str(BIN / "vf-validate"), "srpo-verifiers", "@", str(config), "--runtime.type", "subprocess", "-o", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (summary,) = [json.loads(f.read_text()) for f in out.glob("*/summary.json")]
    assert summary["total"] == NUM_TASKS and summary["valid_rate"] == 1.0, summary
    assert summary["checks"]["gold"]["valid"] == summary["checks"]["noop"]["valid"] == NUM_TASKS
