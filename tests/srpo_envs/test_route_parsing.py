"""One router format for every routed env: srpo_envs.base.parse_route, used by the math and search envs."""

from __future__ import annotations

import pytest

from srpo_envs.base import parse_route
from srpo_envs.math_verify import MathVerifyEnv
from srpo_envs.search import MultiTurnSearchEnv

CASES = [
    ("\\boxed{2}", 2),
    ("\\boxed{ 3 }", 3),
    ("<answer>2</answer>", 2),
    ("I pick \\boxed{2 proposers}", 2),
    ("first \\boxed{1}, final \\boxed{3}", 3),  # the final answer counts
    ("\\boxed{0}", None),
    ("\\boxed{4}", None),  # more than n = 3
    ("\\boxed{-1}", None),
    ("\\boxed{two}", None),
    ("2", None),  # no answer markup
    ("\\boxed{1234567}", None),
]


@pytest.mark.parametrize(("text", "k"), CASES)
def test_parse_route(text: str, k: int | None) -> None:
    parsed = parse_route(text, 3)
    assert parsed.valid is (k is not None)
    assert parsed.value == k
    if k is None:
        assert "1..3" in parsed.reason


def test_math_and_search_routers_accept_the_same_outputs() -> None:
    math_env = MathVerifyEnv(workflow="routed", n_proposers=3, dataset="procedural", dataset_size=4)
    search_env = MultiTurnSearchEnv(workflow="routed", n_searchers=3, dataset="kb")
    for env in (math_env, search_env):
        env.reset(seed=0)
        assert "router" in env.possible_agents
    for text, k in CASES:
        got = [env._parse("router", text) for env in (math_env, search_env)]
        assert [(p.valid, p.value) for p in got] == [(k is not None, k)] * 2, text
