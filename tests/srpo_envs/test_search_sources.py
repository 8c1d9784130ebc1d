"""Searchers with their own sources (``searcher_sources="by-kind"``): a team where the set matters."""

from __future__ import annotations

import pytest

import srpo_envs
from agents.scripted import ScriptedTeam
from srpo_envs.search import KB_SOURCES, MultiTurnSearchEnv, passage_kind, split_by_kind
from srpo_envs.tasks.knowledge_base import make_knowledge_base


def _questions(env: MultiTurnSearchEnv, relation: str, n: int = 8) -> list[int]:
    return [i for i, t in enumerate(env.tasks) if t.meta["relation"] == relation][:n]


def _first(env: MultiTurnSearchEnv, relation: str) -> int:
    return _questions(env, relation)[0]


def _reading_team_correct(env: MultiTurnSearchEnv, index: int) -> bool:
    for _ in ScriptedTeam.search_teacher(env, p_correct=1.0).play(env, seed=index, task_index=index):
        pass
    return bool(env.outcome["correct"])


def test_each_searcher_searches_its_own_kind_of_passage() -> None:
    env = MultiTurnSearchEnv(n_searchers=5, searcher_sources="by-kind")
    env.reset(seed=0, options={"task_index": 0})
    env.step({a: "<search>company city country person</search>" for a in env.active_agents})
    (event,) = env.events
    assert event.info["sources"] == {f"searcher_{i}": KB_SOURCES[i % 4] for i in range(5)}
    for agent, ids in event.info["retrieved_ids"].items():
        assert ids and {passage_kind(pid) for pid in ids} == {event.info["sources"][agent]}


@pytest.mark.parametrize(
    ("relation", "needed"),
    [("born_in", 1), ("founder", 2), ("employer_hq", 2), ("city_country", 3), ("birth_country", 3), ("capital", 4)],
)
def test_a_question_needs_as_many_searchers_as_its_furthest_source(relation: str, needed: int) -> None:
    """The reading team answers every question of the relation at the K it needs, and fewer of them one
    searcher short (a country's capital is also named in its cities' passages, so not always none)."""
    rates = {}
    for size in (needed - 1, needed):
        if size == 0:
            continue
        env = MultiTurnSearchEnv(n_searchers=size, searcher_sources="by-kind", top_k=1)
        questions = _questions(env, relation)
        rates[size] = sum(_reading_team_correct(env, i) for i in questions) / len(questions)
        assert env.outcome["needed_searchers"] == env.needed_searchers == needed
    assert rates[needed] == 1.0
    assert rates.get(needed - 1, 0.0) <= 0.5


def test_shared_sources_let_one_searcher_reach_everything() -> None:
    env = MultiTurnSearchEnv(n_searchers=1)
    assert env.needed_searchers is None and env.searcher_source("searcher_0") == "corpus"
    assert _reading_team_correct(env, _first(env, "capital"))


def test_evidence_is_read_best_match_first_across_sources() -> None:
    env = MultiTurnSearchEnv(n_searchers=2, searcher_sources="by-kind", top_k=3)
    index = _first(env, "founder")
    obs, _ = env.reset(seed=0, options={"task_index": index})
    name = env.gold_titles[0]
    obs, *_ = env.step({a: f"<search>{name}</search>" for a in env.active_agents})
    first = obs["aggregator"].split("<information>\n")[1].splitlines()[0]
    # searcher_0 (people) finds the company's employees; searcher_1's company passage scores higher
    assert first.startswith(f"({name})"), first


def test_split_by_kind_keeps_every_passage_once() -> None:
    passages, _ = make_knowledge_base(seed=0, split="all")
    shards = split_by_kind(passages)
    assert [passage_kind(s[0].id) for s in shards] == list(KB_SOURCES)
    assert sorted(p.id for s in shards for p in s) == sorted(p.id for p in passages)
    assert passage_kind("kb-3-person12") == "person" and passage_kind("hotpot-17") is None


@pytest.mark.parametrize(
    "kwargs",
    [{"dataset": "hotpotqa"}, {"index": "/nowhere"}, {"retriever_url": "http://localhost:1"}, {"searcher_sources": "x"}],
)
def test_by_kind_sources_refuse_what_they_cannot_split_in_one_line(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="searcher_sources") as err:
        MultiTurnSearchEnv(**{"searcher_sources": "by-kind", **kwargs})
    assert "\n" not in str(err.value)


def test_the_team_preset_is_registered() -> None:
    env = srpo_envs.make("MultiTurnSearch-Team-v0")
    assert env.unwrapped.n_searchers == 5 and env.unwrapped.top_k == 1
    assert len(env.unwrapped.source_retrievers) == len(KB_SOURCES)
