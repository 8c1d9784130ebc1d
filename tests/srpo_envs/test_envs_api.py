"""PettingZoo conformance, the event contract and adversarial input for every registered env
(srpo_envs.conformance: the one check every env runs)."""

from __future__ import annotations

import pytest

import srpo_envs
from agents.scripted import ScriptedTeam
from srpo_envs.conformance import check_api, check_events

MATH_IDS = [i for i, s in srpo_envs.registry.items() if "math_verify" in str(s.entry_point)]
#: Every env whose optional packages are installed here (Verifiers-v0 runs in .ci/verifiers.sh's venv, with
#: fewer steps: each of its calls starts verifiers' harness program).
BUILDABLE = sorted(i for i, s in srpo_envs.registry.items() if s.available())


@pytest.mark.parametrize("env_id", BUILDABLE)
def test_make_without_arguments_and_pettingzoo_api(env_id: str) -> None:
    check_api(lambda: srpo_envs.make(env_id))


@pytest.mark.parametrize("env_id", BUILDABLE)
def test_random_and_adversarial_steps(env_id: str) -> None:
    """2,000 steps of random Text samples and adversarial strings: no exception, no slow step, and each
    event consumes exactly the active set as it stood before the step (srpo_envs.conformance)."""
    check_events(lambda: srpo_envs.make(env_id), steps=2000)


@pytest.mark.parametrize(
    ("workflow", "pattern"),
    [
        ("proposers-aggregator", [("propose", 3), ("aggregate", 1)]),
        (
            "solver-verifier",
            [("propose", 1), ("verify", 1), ("revise", 1), ("verify", 1), ("revise", 1), ("verify", 1)],
        ),
    ],
)
def test_k_patterns(workflow: str, pattern: list[tuple[str, int]]) -> None:
    env = srpo_envs.make("ProcArith-v0", workflow=workflow)
    team = ScriptedTeam.fixed(
        {
            "proposer": "\\boxed{1}",
            "solver": "\\boxed{1}",
            "verifier": "\\boxed{reject}",
            "aggregator": "\\boxed{1}",
        }
    )
    obs, infos = env.reset(seed=0)
    while env.agents:
        obs, *_, infos = env.step(team.act(obs, infos))
    assert [(e.event_type, e.k) for e in env.events] == pattern


def test_routed_k_varies_with_the_router() -> None:
    env = srpo_envs.make("ProcArith-v0", workflow="routed", n_proposers=3)
    seen = set()
    for k in (1, 2, 3):
        team = ScriptedTeam.oracle(env, route=k)
        obs, infos = env.reset(seed=k)
        while env.agents:
            obs, *_, infos = env.step(team.act(obs, infos))
        ks = [e.k for e in env.events]
        assert ks == [1, k, 1]
        assert [e.event_type for e in env.events] == ["route", "propose", "aggregate"]
        seen.add(ks[1])
    assert seen == {1, 2, 3}


def test_bad_route_is_flagged_and_defaults() -> None:
    env = srpo_envs.make("ProcArith-v0", workflow="routed", default_route=2)
    env.reset(seed=0)
    env.step({"router": "\\boxed{17}"})
    ev = env.events[0]
    assert ev.valid["router"] is False and ev.info["team_size"] == 2
    assert env.active_agents == ("proposer_0", "proposer_1")


def test_action_key_validation() -> None:
    env = srpo_envs.make("ProcArith-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="missing actions for active agents"):
        env.step({"proposer_0": "\\boxed{1}"})
    with pytest.raises(ValueError, match="not live"):
        env.step({"proposer_0": "a", "proposer_1": "b", "proposer_2": "c", "intruder": "x"})
    # inactive live agents may send actions; they are ignored and not recorded
    env.step(
        {
            "proposer_0": "\\boxed{1}",
            "proposer_1": "\\boxed{2}",
            "proposer_2": "\\boxed{3}",
            "aggregator": "hi",
        }
    )
    assert env.events[0].members == ("proposer_0", "proposer_1", "proposer_2")
    assert "aggregator" not in env.events[0].outputs
    assert env.active_agents == ("aggregator",)
    env.step({"aggregator": "\\boxed{1}"})
    assert env.agents == []
    with pytest.raises(ValueError, match="finished episode"):
        env.step({"aggregator": "\\boxed{1}"})


def test_infos_mark_active_set_and_inactive_agents_wait() -> None:
    env = srpo_envs.make("MathVerify-SolverVerifier-v0")
    obs, infos = env.reset(seed=3)
    assert env.active_agents == ("solver",)
    assert infos["solver"]["active"] and not infos["verifier"]["active"]
    assert "waiting" in obs["verifier"] and "Problem:" in obs["solver"]
    obs, _, _, _, infos = env.step({"solver": "\\boxed{1}", "verifier": "ignored"})
    assert infos["verifier"]["active"] and not infos["solver"]["active"]
    assert "event_id" in infos["solver"] and "event_id" not in infos["verifier"]
    assert env.agents == ["solver", "verifier"]  # turn-taking roles stay live


def test_pre_state_id_is_stable_and_history_sensitive() -> None:
    def run(seed: int, answers: list[str]) -> list[str]:
        env = srpo_envs.make("ProcArith-v0", workflow="solver-verifier")
        env.reset(seed=seed)
        for a in answers:
            if not env.agents:
                break
            env.step({agent: a for agent in env.active_agents})
        return [e.pre_state_id for e in env.events]

    a = run(5, ["\\boxed{1}", "\\boxed{reject}", "\\boxed{2}"])
    assert a == run(5, ["\\boxed{1}", "\\boxed{reject}", "\\boxed{2}"])
    b = run(5, ["\\boxed{7}", "\\boxed{reject}", "\\boxed{2}"])
    assert a[0] == b[0] and a[1] != b[1]
    assert len(set(a)) == len(a)


def test_rewards_written_back_and_format_penalty() -> None:
    env = srpo_envs.make("ProcArith-v0", format_penalty=0.25)
    env.reset(seed=0)
    gold = env.unwrapped.task.answer
    assert all(e.reward is None for e in env.events)
    env.step(
        {"proposer_0": "garbage", "proposer_1": f"\\boxed{{{gold}}}", "proposer_2": f"\\boxed{{{gold}}}"}
    )
    _, rewards, terms, _, infos = env.step({"aggregator": f"so \\boxed{{{gold}}}"})
    assert all(terms.values())
    assert [e.reward for e in env.events] == [0.75, 1.0]
    assert rewards["proposer_0"] == 0.75 and rewards["aggregator"] == 1.0
    assert infos["aggregator"]["outcome"]["correct"] is True
    ids = [e.event_id for e in env.events]
    assert len(set(ids)) == len(ids)
    assert env.events[0].to_dict()["k"] == 3


@pytest.mark.parametrize("env_id", MATH_IDS)
def test_oracle_scores_all_and_random_scores_nothing_on_math500(env_id: str) -> None:
    env = srpo_envs.make(env_id, dataset="math500", dataset_size=40)
    for name, team_fn, expected in [
        ("oracle", ScriptedTeam.oracle, 1.0),
        ("random", ScriptedTeam.random, 0.0),
    ]:
        team = team_fn(env)
        correct = 0
        for i in range(40):
            obs, infos = env.reset(seed=i, options={"task_index": i})
            while env.agents:
                obs, *_, infos = env.step(team.act(obs, infos))
            correct += env.outcome["correct"]
        assert correct / 40 == pytest.approx(expected), name


def test_render_and_state() -> None:
    env = srpo_envs.make("ProcArith-v0", workflow="routed")
    team = ScriptedTeam.oracle(env, route=2)
    obs, infos = env.reset(seed=0)
    while env.agents:
        obs, *_, infos = env.step(team.act(obs, infos))
    text = env.render()
    assert "[route] K=1" in text and "[propose] K=2" in text and "correct=True" in text
    assert env.unwrapped.task.problem in env.state()


def test_unknown_id_and_bad_workflow() -> None:
    with pytest.raises(KeyError, match="registered ids"):
        srpo_envs.make("Nope-v0")
    with pytest.raises(ValueError, match="workflow"):
        srpo_envs.make("MathVerify-v0", workflow="chaos")
