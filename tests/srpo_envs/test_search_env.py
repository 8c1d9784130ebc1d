"""Multi-turn retrieval env: event pattern, tool calls, oracle vs random teams on real data."""

from __future__ import annotations

import pytest

import srpo_envs
from agents.scripted import ScriptedTeam


def _play(env, team, index: int) -> None:
    obs, infos = env.reset(seed=index, options={"task_index": index})
    while env.agents:
        obs, *_, infos = env.step(team.act(obs, infos))


def test_turn_pattern_tool_calls_and_environment_text() -> None:
    env = srpo_envs.make("MultiTurnSearch-v0", n_searchers=3, max_turns=3)
    env.reset(seed=0, options={"task_index": 0})
    env.step(
        {"searcher_0": "<search>a</search>", "searcher_1": "<search>b</search>", "searcher_2": "nothing"}
    )
    obs, *_ = env.step({"aggregator": "<search>need more</search>"})
    assert "Aggregator asks: need more" in obs["searcher_0"]
    env.step({a: "<search>c</search>" for a in env.active_agents})
    env.step({"aggregator": "<answer>zzz</answer>"})
    events = env.events
    assert [(e.event_type, e.k) for e in events] == [("search", 3), ("aggregate", 1)] * 2
    assert events[0].info["tool_calls"] == 2 and events[0].valid["searcher_2"] is False
    assert events[2].info["tool_calls"] == 3
    assert env.outcome["tool_calls"] == 5 and env.outcome["correct"] is False
    # retrieved passages are environment text: in observations, never in any consumed output
    for e in events:
        assert all("<information>" not in text for text in e.outputs.values())


def test_last_turn_requires_an_answer() -> None:
    env = srpo_envs.make("MultiTurnSearch-v0", max_turns=1)
    env.reset(seed=0)
    obs, *_ = env.step({a: "<search>x</search>" for a in env.active_agents})
    assert "Answer now" in obs["aggregator"]
    env.step({"aggregator": "<search>again</search>"})
    assert env.agents == [] and env.events[-1].valid["aggregator"] is False
    assert env.outcome["answer"] is None


def test_routed_team_size() -> None:
    env = srpo_envs.make("MultiTurnSearch-Routed-v0", n_searchers=3)
    for k in (1, 3):
        _play(env, ScriptedTeam.search_oracle(env, route=k), 0)
        assert [e.k for e in env.events][:2] == [1, k]


@pytest.mark.parametrize(
    ("env_id", "n", "oracle_min"), [("MultiTurnSearch-v0", 60, 1.0), ("MultiTurnSearch-HotpotQA-v0", 60, 0.7)]
)
def test_oracle_searchers_beat_random(env_id: str, n: int, oracle_min: float) -> None:
    env = srpo_envs.make(env_id)
    scores = {}
    for name, fn in (("oracle", ScriptedTeam.search_oracle), ("random", ScriptedTeam.search_random)):
        team = fn(env)
        correct = 0
        for i in range(n):
            _play(env, team, i)
            correct += env.outcome["correct"]
        scores[name] = correct / n
    assert scores["oracle"] >= oracle_min
    assert scores["random"] <= 0.05


def test_several_kb_worlds_pool_their_questions_over_one_corpus() -> None:
    """kb_seed=[3, 4]: both worlds' train questions, each answerable from its own world's passages in the
    pooled corpus (an oracle team solves questions of either world); a repeated seed is refused."""
    from srpo_envs.tasks.knowledge_base import make_knowledge_base

    env = srpo_envs.make("MultiTurnSearch-v0", dataset="kb", kb_seed=[3, 4])
    worlds = [make_knowledge_base(seed=s, split="train")[1] for s in (3, 4)]
    assert [t.id for t in env.tasks] == [t.id for w in worlds for t in w]
    oracle = ScriptedTeam.search_oracle(env)
    for index in (0, 1, len(worlds[0]), len(worlds[0]) + 1):
        _play(env, oracle, index)
        assert env.outcome["correct"], env.task.id
        world = env.task.meta["kb_seed"]
        assert env.retrieved_ids and all(pid.startswith(f"kb{world}-") for pid in env.retrieved_ids)
    with pytest.raises(ValueError, match="distinct"):
        srpo_envs.make("MultiTurnSearch-v0", dataset="kb", kb_seed=[3, 3])
