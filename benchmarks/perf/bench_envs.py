"""Env throughput: steps/second with scripted agents for each math workflow.

    python -m benchmarks.perf.bench_envs [--episodes 300]

Grading of non-trivial LaTeX answers happens in worker processes; procedural answers are integers
and graded in-process, so the procedural rows measure the env machinery itself.
"""

from __future__ import annotations

import argparse
import time

import srpo_envs
from agents.scripted import ScriptedTeam
from srpo_envs.math_verify import WORKFLOWS


def measure(env_id: str, workflow: str, episodes: int, team_name: str) -> tuple[float, float]:
    env = srpo_envs.make(env_id, workflow=workflow)
    team = (
        ScriptedTeam.noisy_oracle(env, p_correct=0.5, route=None)
        if team_name == "noisy"
        else ScriptedTeam.random(env)
    )
    steps = 0
    obs, infos = env.reset(seed=0)
    start = time.perf_counter()
    for ep in range(episodes):
        obs, infos = env.reset(seed=ep)
        while env.agents:
            obs, _, _, _, infos = env.step(team.act(obs, infos))
            steps += 1
    elapsed = time.perf_counter() - start
    return steps / elapsed, episodes / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=300)
    args = parser.parse_args()
    print(f"{'env':16s} {'workflow':22s} {'team':7s} {'steps/s':>10s} {'episodes/s':>11s}")
    for env_id in ("ProcArith-v0", "MathVerify-v0"):
        for workflow in WORKFLOWS:
            for team in ("noisy", "random"):
                sps, eps = measure(env_id, workflow, args.episodes, team)
                print(f"{env_id:16s} {workflow:22s} {team:7s} {sps:10.0f} {eps:11.0f}")


if __name__ == "__main__":
    main()
