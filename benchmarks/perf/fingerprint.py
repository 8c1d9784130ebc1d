"""Behaviour fingerprint: hashes of rollout rows, per-iteration losses and final weights of short runs.

Refactors must not change behaviour. This script trains each algorithm for two short iterations from
a shipped warm start with fixed seeds and prints one sha256 per algorithm for (a) every rollout row
(the fields learners consume), (a') the same rows without their behaviour log-probs (what was sampled:
a change that only rounds log-probs differently keeps this one), (b) the metrics each iteration logs
(timings excluded) and (c) the final weights. Run it before and after a change; identical lines mean
bit-identical behaviour on this CPU.

    python -m benchmarks.perf.fingerprint [--algos srpo,grpo,mappo] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from srpo_common import sha256_json

ROW_FIELDS = (
    "event_id", "episode_id", "pre_state_id", "event_type", "step", "agent", "role", "member_index",
    "prompt_ids", "response_ids", "response_mask", "behaviour_logprobs", "policy_version", "task_id",
    "group_id", "reward", "outcome_reward", "correct", "state_text", "response_text",
)  # fmt: skip
TIMING_KEYS = ("rollout_s", "update_s")
MODEL = Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-columns-sft"


def fingerprint(algo: str, model: str | Path = MODEL) -> dict[str, str]:
    from learners.trainer import TrainConfig, Trainer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            algo=algo,
            model=str(model),
            out_dir=tmp,
            env_id="MathVerify-v0",
            env_kwargs={"dataset": "procedural-columns", "difficulty": [2, 3], "workflow": "proposers-aggregator"},
            iterations=2,
            tasks_per_iter=4,
            group_size=2,
            epochs=2,
            rows_per_batch=8,
            forward_rows=8,
            lr=1e-4,
            eval_every=0,
            save_every=0,
            seed=3,
        )
        trainer = Trainer(cfg, log=None)
        rows: list[dict[str, Any]] = []
        collect = trainer.collector.collect

        def recording_collect(*args: Any, **kwargs: Any) -> Any:
            batch = collect(*args, **kwargs)
            rows.extend({f: getattr(r, f) for f in ROW_FIELDS} for r in batch.rows)
            return batch

        trainer.collector.collect = recording_collect  # type: ignore[method-assign]
        history = trainer.train()
        metrics = [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]
        weights = {
            name: t.detach().double().flatten().tolist()[:4096]
            for pol in {id(p.model): p for p in trainer.policies.policies}.values()
            for name, t in sorted(pol.model.state_dict().items())
        }
    return {
        "rows": sha256_json(rows),
        "tokens": sha256_json([{k: v for k, v in r.items() if k != "behaviour_logprobs"} for r in rows]),
        "metrics": sha256_json(metrics),
        "weights": sha256_json(weights),
        "n_rows": str(len(rows)),
        "loss": ",".join(f"{m.get('actor/loss', m.get('loss', float('nan'))):.9g}" for m in metrics),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", default="srpo,grpo,mappo")
    ap.add_argument("--json", default=None, help="also write the fingerprints to this file")
    args = ap.parse_args()
    out = {algo: fingerprint(algo) for algo in args.algos.split(",")}
    for algo, fp in out.items():
        print(f"{algo:8s} " + " ".join(f"{k}={v[:16] if len(v) == 64 else v}" for k, v in fp.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
