"""docs/adding-an-env.md's minimal env (examples/pair_sum_env.py) passes the conformance check every env
runs, and the check is not a formality: an env that breaks a rule fails it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from srpo_envs.conformance import check_api, check_env, check_events

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from pair_sum_env import PairSumEnv  # noqa: E402


def test_the_page_shows_the_env_unchanged() -> None:
    page = (ROOT / "docs" / "adding-an-env.md").read_text(encoding="utf-8")
    assert f"```python\n{(ROOT / 'examples' / 'pair_sum_env.py').read_text(encoding='utf-8')}```" in page


def test_the_minimal_env_passes_the_conformance_check() -> None:
    check_env(lambda: PairSumEnv())
    env = PairSumEnv()
    env.reset(seed=1)
    total = str(env.task.a + env.task.b)
    env.step({"solver_0": "\\boxed{0}", "solver_1": f"so \\boxed{{{total}}}"})
    env.step({"judge": "\\boxed{2}"})
    assert [(e.event_type, e.k, e.reward) for e in env.events] == [("propose", 2, 1.0), ("judge", 1, 1.0)]


class _NamelessRoles(PairSumEnv):
    def role_of(self, agent: str) -> str:
        return ""


class _SlowParser(PairSumEnv):
    def _parse(self, agent: str, text: str):
        import time

        time.sleep(0.05)
        return super()._parse(agent, text)


def test_an_env_that_breaks_the_contract_fails_it() -> None:
    with pytest.raises(AssertionError, match=r"role_of\('solver_0'\) must name a role"):
        check_api(lambda: _NamelessRoles())
    with pytest.raises(AssertionError, match="slowest step"):
        check_events(lambda: _SlowParser(), steps=20, max_step_s=0.01)
