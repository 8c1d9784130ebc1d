"""reasoning-gym as a ``dataset=`` source of the math-verification env: tasks from the family's own
generator, graded by the family's own ``score_answer`` (math-verify's verdict reported beside it), held-out
split disjoint from training, and the env passes the conformance check every env runs."""

from __future__ import annotations

import pytest
import reasoning_gym

import srpo_envs
from agents.scripted import ScriptedTeam
from srpo_envs.conformance import check_env
from srpo_envs.tasks.reasoning_gym_data import load_reasoning_gym, slipped_solution


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


def test_dataset_config_sets_the_familys_generator() -> None:
    config = {"min_terms": 2, "max_terms": 2, "max_digits": 1}
    env = srpo_envs.make("MathVerify-v0", dataset="reasoning-gym:chain_sum", dataset_size=16, dataset_config=config)
    expected = reasoning_gym.create_dataset("chain_sum", size=16, seed=1000, **config)
    assert [t.problem for t in env.tasks] == [e["question"] for e in expected]
    assert all(len(t.meta["reasoning_gym"]["entry"]["metadata"]["expression"].split()) == 3 for t in env.tasks)
    with pytest.raises(ValueError, match="chain_sum has no setting max_numbers; it has: min_terms, max_terms"):
        load_reasoning_gym("reasoning-gym:chain_sum", "train", 4, {"max_numbers": 2})
    with pytest.raises(ValueError, match="dataset_config sets a reasoning-gym family's generator"):
        srpo_envs.make("MathVerify-v0", dataset="procedural", dataset_config={"max_terms": 2})


@pytest.mark.parametrize("family", ["chain_sum", "basic_arithmetic"])
def test_worked_solutions_step_to_the_familys_answer(family: str) -> None:
    config = {"min_terms": 3, "max_terms": 3, "max_digits": 2}
    if family == "basic_arithmetic":
        config |= {"operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False}
    for task in load_reasoning_gym(f"reasoning-gym:{family}", "train", 64, config):
        *steps, last = task.meta["solution"].splitlines()
        total = None
        for line in steps:  # "a op b = c", each line starting from the previous result
            a, op, b, _, c = line.split()
            assert total is None or int(a) == total
            assert int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b))
            total = int(c)
        assert last == f"The answer is \\boxed{{{task.answer}}}." and total == int(task.answer)
    # products, quotients and parentheses get no worked solution: the teacher answers only
    tasks = load_reasoning_gym("reasoning-gym:basic_arithmetic", "train", 64)
    assert any("solution" not in t.meta for t in tasks)
    assert all("solution" not in t.meta for t in load_reasoning_gym("reasoning-gym:leg_counting", "train", 4))


def test_a_slipped_sum_forgets_its_first_carry() -> None:
    config = {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+"], "allow_parentheses": False}
    tasks = {t.problem: t for t in load_reasoning_gym("reasoning-gym:basic_arithmetic", "test", 8, config)}
    assert slipped_solution(tasks["Calculate 6 + 39."]) == "6 + 9 = 15\n0 + 3 = 3\nThe answer is \\boxed{35}."
    assert slipped_solution(tasks["Calculate 74 + 1."]) is None  # no carry to forget
    chains = load_reasoning_gym("reasoning-gym:chain_sum", "train", 16, {"min_terms": 3, "max_terms": 3})
    assert all(slipped_solution(t) is None for t in chains)


def test_a_sum_of_two_numbers_is_worked_in_columns() -> None:
    # the lines of srpo's procedural-columns solutions: ones first, the carry added to the next column
    config = {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+"], "allow_parentheses": False}
    tasks = {t.problem: t for t in load_reasoning_gym("reasoning-gym:basic_arithmetic", "test", 8, config)}
    assert tasks["Calculate 32 + 59."].meta["solution"] == "2 + 9 = 11\n3 + 5 + 1 = 9\nThe answer is \\boxed{91}."
    assert tasks["Calculate 6 + 39."].meta["solution"] == "6 + 9 = 15\n0 + 3 + 1 = 4\nThe answer is \\boxed{45}."
    chains = load_reasoning_gym("reasoning-gym:chain_sum", "train", 64, {"max_terms": 2, "max_digits": 2})
    for task in chains:  # a difference stays one line; a sum's column lines spell its answer
        a, op, b = task.problem.removeprefix("State the final answer to the following arithmetic problem: ").split()[:3]
        *steps, _ = task.meta["solution"].splitlines()
        if op == "-":
            assert steps == [f"{a} - {b} = {int(a) - int(b)}"]
        else:
            digits = [int(line.rsplit("= ", 1)[1]) for line in steps]
            carry = digits[-1] // 10
            assert int(f"{carry or ''}" + "".join(str(d % 10) for d in reversed(digits))) == int(task.answer)

