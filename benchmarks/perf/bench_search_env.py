"""Search env with scripted teams: oracle searchers (query gold titles) vs random queries, per dataset.

    python -m benchmarks.perf.bench_search_env [--limit 500]

Prints exact match / F1 of the oracle-searcher team and of the random team on every bundled QA set
whose evidence is in the corpus, plus the procedural knowledge base, and env steps/second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agents.scripted import ScriptedTeam
from srpo_envs.search import MultiTurnSearchEnv
from srpo_envs.tasks.search_data import load_qa


def run(env: MultiTurnSearchEnv, team_name: str, n: int) -> tuple[float, float, float]:
    team = ScriptedTeam.search_oracle(env) if team_name == "oracle" else ScriptedTeam.search_random(env)
    em, f1, steps = [], [], 0
    start = time.perf_counter()
    for i in range(n):
        obs, infos = env.reset(seed=i, options={"task_index": i})
        while env.agents:
            obs, *_, infos = env.step(team.act(obs, infos))
            steps += 1
        em.append(env.outcome["em"])
        f1.append(env.outcome["f1"])
    return float(np.mean(em)), float(np.mean(f1)), steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=int, default=500)
    args = parser.parse_args()
    print(f"{'dataset':18s} {'n':>4s} {'oracle EM':>9s} {'oracle F1':>9s} {'random EM':>9s} {'steps/s':>8s}")
    for name in ("hotpotqa", "nq", "musique", "kb"):
        if name == "kb":
            env = MultiTurnSearchEnv("kb", split="test")
        else:
            tasks = load_qa(name, evidence_only=True)[: args.limit]
            env = MultiTurnSearchEnv(name, tasks=tasks)
        n = min(args.limit, len(env.tasks))
        o_em, o_f1, sps = run(env, "oracle", n)
        r_em, _, _ = run(env, "random", n)
        print(f"{name:18s} {n:4d} {o_em:9.3f} {o_f1:9.3f} {r_em:9.3f} {sps:8.0f}")


if __name__ == "__main__":
    main()
