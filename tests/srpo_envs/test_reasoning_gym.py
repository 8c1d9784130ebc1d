"""reasoning-gym as a ``dataset=`` source of the math-verification env: tasks from the family's own
generator, graded by the family's own ``score_answer`` (math-verify's verdict reported beside it), held-out
split disjoint from training, and the env passes the conformance check every env runs."""

from __future__ import annotations

import pytest
import reasoning_gym

import srpo_envs
from agents.scripted import ScriptedTeam
from srpo_envs.conformance import check_env
from srpo_envs.tasks.reasoning_gym_data import load_reasoning_gym


def _play(env, answer_of=None):
    team = ScriptedTeam.oracle(env)
    obs, infos = env.reset(seed=0)
    while env.agents:
        actions = team.act(obs, infos)
        if answer_of is not None:
            actions = {a: answer_of(text) for a, text in actions.items()}
        obs, _, _, _, infos = env.step(actions)
    return env.outcome


@pytest.mark.parametrize("family", ["chain_sum", "leg_counting"])
def test_tasks_are_the_familys_and_graded_by_its_own_scorer(family: str) -> None:
    env = srpo_envs.make("MathVerify-v0", dataset=f"reasoning-gym:{family}", dataset_size=8, workflow="solver-verifier")
    expected = reasoning_gym.create_dataset(family, size=8, seed=1000)
    assert [t.problem for t in env.tasks] == [e["question"] for e in expected]
    assert [t.answer for t in env.tasks] == [str(e["answer"]) for e in expected]
    right = _play(env)
    assert right["correct"] is True and right["reasoning_gym_score"] == 1.0 and right["reward"] == 1.0
    assert right["math_verify_correct"] is True  # a number: math-verify agrees
    wrong = _play(env, answer_of=lambda text: text.replace(str(env.task.answer), "123456789"))
    scorer = reasoning_gym.get_score_answer_fn(family)
    entry = env.task.meta["reasoning_gym"]["entry"]
    assert wrong["reasoning_gym_score"] == scorer(wrong["answer"], entry) < 1.0
    assert wrong["correct"] is False and wrong["reward"] <= 0.0


def test_the_held_out_split_never_holds_a_training_question() -> None:
    train = load_reasoning_gym("reasoning-gym:basic_arithmetic", "train", 64)
    test = load_reasoning_gym("reasoning-gym:basic_arithmetic", "test", 64)
    assert train and test and not {t.problem for t in train} & {t.problem for t in test}


def test_an_unknown_family_or_split_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"unknown reasoning-gym family 'no_such'; known: .*chain_sum"):
        srpo_envs.make("MathVerify-v0", dataset="reasoning-gym:no_such")
    with pytest.raises(ValueError, match=r"splits \['test', 'train'\], got 'dev'"):
        load_reasoning_gym("reasoning-gym:chain_sum", "dev", 4)


def test_the_env_passes_the_conformance_check() -> None:
    check_env(lambda: srpo_envs.make("MathVerify-v0", dataset="reasoning-gym:chain_sum", dataset_size=6, workflow="routed"))
