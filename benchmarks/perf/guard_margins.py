"""How far healthy runs stay from the divergence guard's defaults (:mod:`learners.guard`).

    python -m benchmarks.perf.guard_margins                                  # every bench preset, 3 iterations
    python -m benchmarks.perf.guard_margins --suites quick-columns-routed --algos srpo,grpo --iterations 2
    python -m benchmarks.perf.guard_margins --suites defaults --iterations 8 --eval-every 2 --seeds 0,1

What runs: short trainings of the shipped presets exactly as ``srpo bench quick`` / ``compare`` trains them
(:data:`benchmarks.presets.TRAINING_ENVS` and each suite's :data:`~benchmarks.presets.QUICK_SETTINGS`
train settings, their warm start), for ``--iterations`` iterations (at most the preset's), with the guard
off so that nothing stops a run. Each run's ``metrics.jsonl`` is read back and the largest value of every
guarded metric is printed beside the guard's default threshold; with ``--eval`` the held-out accuracy is
measured at iteration 0 and at the end, and the smallest ratio end / start is printed beside the collapse
threshold. A default is safe when every healthy run's value stays well inside it.

The pseudo-suite ``defaults`` is what a user meets first: the README's ``srpo train`` command (a shipped
model, ProcArith-v0 routed on procedural columns) with only the model and env named, i.e. the settings
``learners.profiles`` gives that model's class. ``--eval-every N`` evaluates every N iterations (the guard's
eval-drop check runs at each evaluation), and the smallest later / start ratio over all of them is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any


def main() -> None:
    # imported here, not at the top: `--help` answers without loading torch and the trainer
    from benchmarks import presets
    from learners.guard import GUARD_METRICS
    from learners.profiles import settings_for
    from learners.trainer import TrainConfig, Trainer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default=",".join(presets.QUICK_SETTINGS))
    ap.add_argument("--algos", default=",".join(presets.ALGORITHMS))
    ap.add_argument("--variants", default="", help="extra BASELINES/ABLATIONS names, on the first suite")
    ap.add_argument("--jobs", default="", help="SUITE:VARIANT,... in this order instead of suites x algos")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--eval", action="store_true", help="held-out accuracy at iteration 0 and at the end")
    ap.add_argument("--eval-every", type=int, default=0, help="held-out accuracy every N iterations (implies --eval)")
    ap.add_argument("--seeds", default="0", help="training seeds of every job")
    ap.add_argument("--out", default=None, help="run directories (default: a temporary directory)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="guard-margins-"))
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    off = {f.name: (math.inf if f.name != "guard_eval_drop" else 1.0) for f in fields(TrainConfig) if f.name.startswith("guard_")}
    suites = [s for s in args.suites.split(",") if s]
    jobs = [(s, a, presets.ALGORITHMS.get(a) or presets.BASELINES[a]) for s in suites for a in args.algos.split(",") if a]
    variants = {**presets.BASELINES, **presets.ABLATIONS}
    jobs += [(suites[0], v, variants[v]) for v in args.variants.split(",") if v]
    if args.jobs:
        jobs = [(s, v, variants[v]) for s, v in (j.split(":") for j in args.jobs.split(",") if j)]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    jobs = [(suite, name, {**overrides, "seed": seed}) for suite, name, overrides in jobs for seed in seeds]
    rows: list[dict[str, Any]] = []
    for suite, name, overrides in jobs:
        if suite == "defaults":  # the README's train command: a shipped model, its class's settings
            model = str(presets.BUNDLED_COLUMNS_MODEL)
            env_id, env_kwargs = "ProcArith-v0", {"workflow": "routed", "dataset": "procedural-columns"}
            train = {**settings_for(model)[1], "iterations": args.iterations}
        else:
            env = presets.TRAINING_ENVS[suite]
            model, env_id, env_kwargs = str(env.bundled_model), env.env_id, {"workflow": env.workflow, **env.env_kwargs}
            train = dict(presets.QUICK_SETTINGS[suite]["train"])
            train["iterations"] = min(args.iterations, int(train.get("iterations", args.iterations)))
        run_dir = out / f"{suite}-{name}-seed{overrides['seed']}"
        every = args.eval_every or (train["iterations"] if args.eval else 0)
        cfg = TrainConfig(
            model=model,
            out_dir=str(run_dir),
            env_id=env_id,
            env_kwargs=env_kwargs,
            **{**train, **overrides, "save_every": 0, "eval_every": every, **off},
        )
        Trainer(cfg, log=None).train()
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        row: dict[str, Any] = {"suite": suite, "variant": name, "seed": overrides["seed"]}
        for key, (field_name, _) in GUARD_METRICS.items():
            vals = [abs(m[key]) for m in metrics if isinstance(m.get(key), int | float)]
            row[field_name] = max(vals) if vals else float("nan")
        accs = [m["eval_accuracy"] for m in metrics if "eval_accuracy" in m]
        if len(accs) >= 2 and accs[0] > 0:
            row["eval_ratio"] = min(a / accs[0] for a in accs[1:])  # the worst evaluation after the start
            row["eval_start"], row["eval_end"] = accs[0], accs[-1]
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'metric':34s} {'default':>10s}  max seen (suite/variant)")
    for key, (field_name, _) in GUARD_METRICS.items():
        seen = [(r[field_name], f"{r['suite']}/{r['variant']}") for r in rows if not math.isnan(r[field_name])]
        worst = max(seen) if seen else (float("nan"), "-")
        print(f"{key:34s} {defaults[field_name]:>10.3g}  {worst[0]:.3g} ({worst[1]})")
    ratios = [(r["eval_ratio"], f"{r['suite']}/{r['variant']}") for r in rows if "eval_ratio" in r]
    if ratios:
        low = min(ratios)
        print(f"{'eval_accuracy later/start (min)':34s} {1 - defaults['guard_eval_drop']:>10.3g}  {low[0]:.3g} ({low[1]})")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
