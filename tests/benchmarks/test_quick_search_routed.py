"""quick-search-routed: a router sends 1..5 parallel searchers each round, every searcher sent costs team
reward, and the suite, like quick-search, evaluates in a world neither the warm start nor RL trained in."""

from __future__ import annotations

import pytest

from benchmarks.presets import QUICK_SETTINGS, TRAINING_ENVS
from benchmarks.suites import QUICK_SEARCH_MAX_SEARCHERS, QUICK_SEARCH_MEMBER_COST, SUITES
from learners.presets import RECIPES
from learners.sft import SFTConfig, training_worlds

pytest.importorskip("pyserini")


@pytest.mark.parametrize("suite", ["quick-search", "quick-search-routed"])
def test_search_suites_evaluate_in_worlds_no_training_saw(suite: str) -> None:
    env = TRAINING_ENVS[suite]
    sft_worlds = {w for stage in RECIPES[env.recipe] for w in training_worlds(SFTConfig(**stage))}
    rl_world = int(env.env_kwargs["kb_seed"])
    eval_worlds = {int(ds.env_kwargs["kb_seed"]) for ds in SUITES[suite].datasets}
    assert eval_worlds and not eval_worlds & (sft_worlds | {rl_world})


def test_routed_suite_trains_and_evaluates_the_same_team() -> None:
    """Same searchers, K range and member cost in RL as in evaluation; bench quick settings exist."""
    (ds,) = SUITES["quick-search-routed"].datasets
    train = TRAINING_ENVS["quick-search-routed"]
    assert SUITES["quick-search-routed"].default_workflow == train.workflow == "routed"
    for key in ("n_searchers", "member_cost"):
        assert ds.env_kwargs[key] == train.env_kwargs[key]
    assert ds.env_kwargs["n_searchers"] == QUICK_SEARCH_MAX_SEARCHERS == 5
    assert set(QUICK_SETTINGS["quick-search-routed"]) == {"train", "eval_k", "eval_limit"}


def _play(env, route: str) -> tuple[list[int], float, dict]:  # noqa: ANN001 - a MultiTurnSearchEnv
    """One episode: the router writes ``route``, every searcher queries the question's subject, the
    aggregator answers the gold answer. Returns the K of each event, the team reward and the facts."""
    obs, infos = env.reset(seed=0, options={"task_index": 0})
    subject = env.task.meta["gold_passage_ids"][0]
    ks: list[int] = []
    reward, facts = 0.0, {}
    while env.agents:
        active = [a for a in obs if infos[a].get("active", True)] if obs else []
        outputs = {}
        for agent in active:
            role = env.role_of(agent)
            if role == "router":
                outputs[agent] = route
            elif role == "searcher":
                outputs[agent] = f"<search> {env.passage_title(subject)}</search>"
            else:
                outputs[agent] = f"<answer> {env.task.answers[0]}</answer>"
        ks.append(len(outputs))
        obs, rewards, terms, truncs, infos = env.step(outputs)
        if any(terms.values()) or any(truncs.values()):
            reward = max(rewards.values())
            facts = next(iter(infos.values()))
    return ks, reward, facts


def test_the_router_chooses_how_many_searchers_act_and_each_costs_reward() -> None:
    (ds,) = SUITES["quick-search-routed"].datasets
    env = ds.env_factory("routed", tasks=ds.load_tasks(1))()
    ks, reward, _ = _play(env, "\\boxed{4}")
    assert ks == [1, 4, 1]  # route, search (4 searchers), aggregate
    assert reward == pytest.approx(1.0 - 4 * QUICK_SEARCH_MEMBER_COST)
    ks, reward, _ = _play(env, "\\boxed{5}")
    assert ks == [1, 5, 1] and reward == pytest.approx(1.0 - 5 * QUICK_SEARCH_MEMBER_COST)
    ks, _, _ = _play(env, "six")  # invalid: the env's default route, one searcher
    assert ks == [1, 1, 1]
