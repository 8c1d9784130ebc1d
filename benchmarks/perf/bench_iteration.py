"""One RL iteration at the issue-16 scale: time per 1k generated tokens (rollout, update, total), peak RSS.

    python -m benchmarks.perf.bench_iteration                      # srpo, mini-sft, 16 tasks x G=8 = 512 rows
    python -m benchmarks.perf.bench_iteration --no-share-prefix    # the same without shared-prefix prefill
    python -m benchmarks.perf.bench_iteration --set prefix_tree=false --set max_tokens_per_microbatch=null
                                                              # the per-row path, one micro-batch (any field)

Settings: :data:`RECOMMENDED` (the project's recommended update: a prefix-tree forward,
``prefix_tree=true``, with memory bounded by ``max_tokens_per_microbatch=4096`` prefix-tree nodes per
micro-batch) unless ``--set`` overrides them; every line printed names the settings it ran with.

What runs: ``learners.trainer.Trainer`` on ``quick-math``'s env (ProcArith, proposers-aggregator: 3
proposers + 1 aggregator per episode, so 16 tasks x G=8 = 512 completions, 384 of them on 16 distinct
proposer prompts), ``--new`` new tokens, one minibatch holding the whole batch, no evaluation or
checkpoints. Each measurement runs in a fresh subprocess so its peak RSS (``ru_maxrss``, model load
included) is its own; ``--iterations`` iterations are timed and the median reported, as wall time and as
process CPU time (all threads; steadier than wall time when other jobs share the CPU). Generated tokens
are the policy's own response tokens of the rollout batch (``Row.response_mask``). Timings on a shared
CPU are noisy: compare runs made back to back (``--compare`` interleaves prefix sharing off/on).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-sft"
QUICK_MATH_ENV = {
    "difficulty": [1, 2],
    "max_operand": 9,
    "dataset_size": 111,
    "workflow": "proposers-aggregator",
}


#: TrainConfig fields this benchmark sets unless ``--set`` overrides them: the recommended update
#: (each micro-batch forwarded as its prefix tree, memory bounded per micro-batch).
RECOMMENDED: dict[str, Any] = {"prefix_tree": True, "max_tokens_per_microbatch": 4096}


def _value(text: str) -> Any:
    """A ``--set`` value: JSON when it parses (numbers, bools, lists, null), ``None``, else the string."""
    if text in ("None", "none"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def settings(pairs: list[str]) -> dict[str, Any]:
    """:data:`RECOMMENDED` updated with ``FIELD=VALUE`` overrides."""
    return {**RECOMMENDED, **{k: _value(v) for k, v in (kv.split("=", 1) for kv in pairs)}}


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.iterations`` iterations in this process; return timings, tokens and peak RSS."""
    import torch

    from learners.trainer import TrainConfig, Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = settings(args.set)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            algo=args.algo,
            model=str(args.model),
            out_dir=tmp,
            env_id="ProcArith-v0",
            env_kwargs=dict(QUICK_MATH_ENV),
            iterations=args.iterations,
            tasks_per_iter=args.tasks,
            group_size=args.group,
            epochs=1,
            rows_per_batch=100_000,  # one minibatch: the whole rollout batch
            max_new_tokens=args.new,
            lr=3e-5,
            eval_every=0,
            save_every=0,
            seed=0,
            **overrides,
        )
        trainer = Trainer(cfg, log=None)
        for pol in trainer.policies.policies:
            if hasattr(pol, "share_prefix"):
                pol.share_prefix = args.share_prefix
            elif not args.share_prefix:
                raise SystemExit("this tree's HFPolicy has no share_prefix switch")
        tokens: list[int] = []
        rows: list[int] = []
        cpu: dict[str, list[float]] = {"rollout": [], "update": []}
        collect, update = trainer.collector.collect, trainer.update

        def counting_collect(*a: Any, **kw: Any) -> Any:
            t0 = time.process_time()
            batch = collect(*a, **kw)
            cpu["rollout"].append(time.process_time() - t0)
            tokens.append(sum(sum(r.response_mask) for r in batch.rows))
            rows.append(len(batch.rows))
            return batch

        def timed_update(*a: Any, **kw: Any) -> Any:
            t0 = time.process_time()
            out = update(*a, **kw)
            cpu["update"].append(time.process_time() - t0)
            return out

        trainer.collector.collect = counting_collect  # type: ignore[method-assign]
        trainer.update = timed_update  # type: ignore[method-assign]
        history = [h for h in trainer.train() if "rollout_s" in h]
    per_k = [
        {
            "rollout": 1000 * h["rollout_s"] / n,
            "update": 1000 * h["update_s"] / n,
            "total": 1000 * (h["rollout_s"] + h["update_s"]) / n,
        }
        for h, n in zip(history, tokens, strict=True)
    ]
    return {
        "settings": overrides,
        "share_prefix": args.share_prefix,
        "rows": rows,
        "tokens": tokens,
        "rollout_s": [h["rollout_s"] for h in history],
        "update_s": [h["update_s"] for h in history],
        "s_per_1k": {k: statistics.median(p[k] for p in per_k) for k in ("rollout", "update", "total")},
        "cpu_s_per_1k": {
            "rollout": statistics.median(1000 * c / n for c, n in zip(cpu["rollout"], tokens, strict=True)),
            "update": statistics.median(1000 * c / n for c, n in zip(cpu["update"], tokens, strict=True)),
            "total": statistics.median(
                1000 * (a + b) / n for a, b, n in zip(cpu["rollout"], cpu["update"], tokens, strict=True)
            ),
        },
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def _child(args: argparse.Namespace, share: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.perf.bench_iteration", "--child", *_forward(args)]
    cmd.append("--share-prefix" if share else "--no-share-prefix")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=Path.cwd())
    return json.loads(out.stdout.strip().splitlines()[-1])


def _forward(args: argparse.Namespace) -> list[str]:
    flags = [
        f"--model={args.model}",
        f"--algo={args.algo}",
        f"--tasks={args.tasks}",
        f"--group={args.group}",
        f"--new={args.new}",
        f"--iterations={args.iterations}",
        f"--threads={args.threads}",
    ]
    return flags + [f"--set={kv}" for kv in args.set]


def _line(r: dict[str, Any]) -> str:
    s, c = r["s_per_1k"], r["cpu_s_per_1k"]
    return (
        f"share_prefix={str(r['share_prefix']):5s} rows={r['rows'][0]} tokens={r['tokens']} "
        f"wall s/1k tok: rollout {s['rollout']:.3f} update {s['update']:.3f} total {s['total']:.3f}; "
        f"CPU s/1k tok: rollout {c['rollout']:.3f} update {c['update']:.3f} total {c['total']:.3f}; "
        f"peak RSS {r['peak_rss_gb']:.2f} GB; settings {json.dumps(r['settings'])}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--algo", default="srpo")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new", type=int, default=48, help="max new tokens per completion")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="TrainConfig override")
    ap.add_argument("--share-prefix", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--compare", action="store_true", help="prefix sharing off, on, off, on (subprocesses)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    bad = [kv for kv in args.set if "=" not in kv]
    if bad:
        ap.error(f"--set needs FIELD=VALUE, got {bad}")
    if args.child:
        print(json.dumps(run_once(args)))
        return
    results = (
        [_child(args, share) for share in (False, True, False, True)]
        if args.compare
        else [_child(args, args.share_prefix)]
    )
    for r in results:
        print(_line(r))
    if args.compare:
        for share in (False, True):
            best = [r for r in results if r["share_prefix"] is share]
            for key in ("s_per_1k", "cpu_s_per_1k"):
                med = {k: statistics.median(r[key][k] for r in best) for k in ("rollout", "update", "total")}
                print(
                    f"median {key} share_prefix={share}: " + " ".join(f"{k} {v:.3f}" for k, v in med.items())
                )


if __name__ == "__main__":
    main()
