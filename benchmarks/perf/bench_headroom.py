"""Where a proposers -> aggregator math team loses accuracy, and so what RL could still win on held-out.

    python -m benchmarks.perf.bench_headroom                       # the bundled warm start, ~1 min
    python -m benchmarks.perf.bench_headroom --model A --model B   # e.g. before/after a training run
    python -m benchmarks.perf.bench_headroom --dataset procedural-columns   # the column-addition warm start

For each model, split (train/test) and difficulty it rolls the team out on ProcArith with several
evaluation seeds and prints, as mean ± std over seeds:

* ``team``      the team's accuracy (what benchmarks report as Avg@k at this temperature);
* ``proposer``  the accuracy of a single proposer's answer;
* ``majority``  the accuracy a plurality vote over the proposers' answers would have had;
* ``copies``    how often the aggregator's answer is one of the candidates' answers;
* the same ``team`` number under greedy decoding (one sample per problem: it has no seed noise).

Reading it: ``greedy - team`` is what sharpening the sampling distribution could give,
``majority - team`` what an aggregator that counts votes could give; ``train - test`` is memorisation,
which an RL step on training problems does not carry to held-out ones. Several seeds matter: one
evaluation seed's draw of a 51-problem set is off by about ±0.02, as large as the RL effects one
looks for, and a before/after pair that shares one seed regresses towards the mean after training.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

import srpo_envs
from agents.hf import HFPolicy
from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutBatch, RolloutCollector
from benchmarks.report import to_markdown
from srpo_envs.grading import extract_answer, grade

BUNDLED = "agents/checkpoints/mini-sft"
BUNDLED_COLUMNS = "agents/checkpoints/mini-columns-sft"


def team_breakdown(batch: RolloutBatch, gold: dict[str, str]) -> dict[str, float]:
    """Team, single-proposer, plurality-vote and aggregator-copies rates of proposers-aggregator episodes.

    ``gold`` maps task id -> reference answer. A proposer without a parsable answer counts as wrong
    and takes no part in the vote; ties in the vote go to the answer seen first.
    """
    proposer_ok: list[bool] = []
    majority_ok: list[bool] = []
    copies: list[bool] = []
    for events in batch.events.values():
        propose = next(e for e in events if e.event_type == "propose")
        aggregate = next(e for e in events if e.event_type == "aggregate")
        answers = [extract_answer(text) for text in propose.outputs.values()]
        ref = gold[propose.task_id]
        proposer_ok.extend(a is not None and grade(a, ref) for a in answers)
        votes = Counter(a for a in answers if a is not None)
        majority_ok.append(bool(votes) and grade(votes.most_common(1)[0][0], ref))
        final = extract_answer(next(iter(aggregate.outputs.values())))
        copies.append(final is not None and final in answers)
    return {
        "team": batch.accuracy,
        "proposer": float(np.mean(proposer_ok)),
        "majority": float(np.mean(majority_ok)),
        "copies": float(np.mean(copies)),
    }


def headroom(
    model: str,
    seeds: Sequence[int] = (1, 2, 3),
    k: int = 4,
    limit: int = 64,
    difficulties: Sequence[int] = (1, 2),
    splits: Sequence[str] = ("train", "test"),
    env_kwargs: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """One row per (split, difficulty): the breakdown's mean and std over ``seeds`` plus greedy team accuracy."""
    policies = PolicyMap.shared(HFPolicy(model), ["proposer", "aggregator"])
    kwargs = {"workflow": "proposers-aggregator", "max_operand": 9, **(env_kwargs or {})}
    records = []
    for split in splits:
        for d in difficulties:

            def make(split: str = split, d: int = d) -> Any:
                return srpo_envs.make("ProcArith-v0", **{**kwargs, "difficulty": d, "split": split})

            tasks = make().unwrapped.tasks[:limit]
            gold = {t.id: t.answer for t in tasks}
            sampled = RolloutCollector(make, policies, SamplingParams(temperature=1.0, max_new_tokens=48))
            per_seed = [
                team_breakdown(sampled.collect(list(range(len(tasks))), group_size=k, seed=s), gold)
                for s in seeds
            ]
            greedy = RolloutCollector(make, policies, SamplingParams(temperature=0.0, max_new_tokens=48))
            record: dict[str, Any] = {"split": split, "difficulty": d, "problems": len(tasks)}
            for key in per_seed[0]:
                values = [p[key] for p in per_seed]
                record[key] = f"{np.mean(values):.3f} ± {np.std(values):.3f}"
            record["greedy team"] = (
                f"{greedy.collect(list(range(len(tasks))), group_size=1, seed=0).accuracy:.3f}"
            )
            records.append(record)
    return pd.DataFrame.from_records(records)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", action="append", help=f"model dir or hub id (repeatable; default {BUNDLED})"
    )
    parser.add_argument("--seeds", default="1,2,3", help="evaluation seeds")
    parser.add_argument("--k", type=int, default=4, help="samples per problem and seed")
    parser.add_argument("--limit", type=int, default=64, help="problems per split and difficulty")
    parser.add_argument(
        "--dataset",
        default="procedural",
        choices=("procedural", "procedural-columns"),
        help="nested arithmetic (difficulties 1, 2) or column addition (2 and 3 digits)",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    columns = args.dataset == "procedural-columns"
    default = BUNDLED_COLUMNS if columns else BUNDLED
    for model in args.model or [default]:
        table = headroom(
            model,
            seeds=seeds,
            k=args.k,
            limit=args.limit,
            difficulties=(2, 3) if columns else (1, 2),
            env_kwargs={"dataset": args.dataset},
        )
        print(f"\n{model} (T=1: mean ± std over eval seeds {seeds}, {args.k} samples per problem)\n")
        print(to_markdown(table))


if __name__ == "__main__":
    main()
