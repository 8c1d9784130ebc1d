"""Side by side with TRL's ``GRPOTrainer``: seconds per 1k generated tokens (iteration, generation, update), peak RSS.

    pip install -e '.[trl]'        # trl==1.16.* (in .[all]); CPU torch is kept
    python -m benchmarks.perf.bench_trl [--repeats 2] [--steps 3]

Both sides start from ``agents/checkpoints/mini-sft`` in float32 on the CPU, sample at temperature 1
with at most ``--new`` new tokens, and take one optimizer step per batch:

* **srpo**: one SRPO iteration of :mod:`benchmarks.perf.bench_iteration` (quick-math's env, 16 tasks x G=8 =
  512 completions, one minibatch) with its recommended settings
  (:data:`benchmarks.perf.bench_iteration.RECOMMENDED`: prefix-tree forward, 4096-node micro-batches;
  ``--set`` overrides them, e.g. ``--set prefix_tree=false`` for the per-row forward); the settings are
  printed above the table;
* **TRL**: ``GRPOTrainer`` on the same kind of prompts (quick-math proposer prompts in the model's chat
  template, 16 prompts x 8 generations = 128 completions per step, ``beta=0``, gradient checkpointing off,
  one ``num_iterations``), a correctness reward on ``\\boxed{}``. Its generation time is the time inside
  ``_generate_and_score_completions`` (generation, rewards, advantages); the update is the rest of the step.

Each side runs in its own subprocess (its peak RSS is its own, model load included), alternating
``--repeats`` times so load on a shared machine hits both alike; the table shows medians over repeats
of each side's median timed step (the first TRL step is a warm-up), as wall time and as process CPU
time (all threads; what to read when other jobs share the machine). Without ``trl`` installed the script
says so and exits 0. ``examples/trl_grpo.py`` trains through TRL's ``rollout_func`` on the env itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-sft"
#: The proposer observation of ``MathVerify``/``ProcArith`` (srpo_envs/math_verify.py), so both sides
#: prefill prompts of the same length.
PROPOSER_PROMPT = (
    "Problem: {problem}\nRole: proposer. Solve the problem and put the final answer in \\boxed{{}}."
)
SYSTEM = "You solve math problems step by step and end with the final answer in \\boxed{}."


def _boxed(text: str) -> str | None:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """``args.steps`` GRPOTrainer steps in this process; per-step timings, tokens, peak RSS."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from srpo_envs.tasks.procedural import make_arithmetic_tasks

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = make_arithmetic_tasks(111, difficulty=1, max_operand=9, seed=0, strict=False)
    tasks += make_arithmetic_tasks(111, difficulty=2, max_operand=9, seed=0, strict=False)
    data = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": PROPOSER_PROMPT.format(problem=t.problem)},
                ],
                "answer": t.answer,
            }
            for t in tasks
        ]
    )

    def correct(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(_boxed(t) == a) for t, a in zip(texts, answer, strict=True)]

    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    completions = args.trl_prompts * args.group
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=completions,
            gradient_accumulation_steps=1,
            num_generations=args.group,
            max_completion_length=args.new,
            temperature=1.0,
            beta=0.0,
            num_iterations=1,
            learning_rate=3e-5,
            gradient_checkpointing=False,
            max_steps=args.steps,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=correct, args=cfg, train_dataset=data, processing_class=tokenizer
        )
        gen_s: list[float] = []
        gen_cpu: list[float] = []
        tokens: list[int] = []
        step_s: list[float] = []
        step_cpu: list[float] = []
        inner = trainer._generate_and_score_completions

        def timed_generation(*a: Any, **kw: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            out = inner(*a, **kw)
            gen_s.append(time.perf_counter() - t0)
            gen_cpu.append(time.process_time() - c0)
            tokens.append(int(out["completion_mask"].sum()))
            return out

        trainer._generate_and_score_completions = timed_generation  # type: ignore[method-assign]

        class StepClock(TrainerCallback):
            def on_step_begin(self, *_: Any, **__: Any) -> None:
                self.t0, self.c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, *_: Any, **__: Any) -> None:
                step_s.append(time.perf_counter() - self.t0)
                step_cpu.append(time.process_time() - self.c0)

        trainer.add_callback(StepClock())
        trainer.train()
    if not (len(step_s) == len(gen_s) == len(tokens) == args.steps):
        raise RuntimeError(f"expected one generation per step: {len(step_s)} steps, {len(gen_s)} generations")
    timed = list(range(1, args.steps)) or [0]  # the first step is a warm-up

    def per_1k(step: list[float], gen: list[float]) -> dict[str, float]:
        parts = [{"total": step[i], "generation": gen[i], "update": step[i] - gen[i]} for i in timed]
        return {
            k: statistics.median(1000 * p[k] / tokens[i] for p, i in zip(parts, timed, strict=True))
            for k in ("total", "generation", "update")
        }

    return {
        "side": "trl",
        "completions": completions,
        "tokens": [tokens[i] for i in timed],
        "s_per_1k": per_1k(step_s, gen_s),
        "cpu_s_per_1k": per_1k(step_cpu, gen_cpu),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def _srpo(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.perf.bench_iteration",
        "--child",
        f"--model={args.model}",
        f"--tasks={args.srpo_tasks}",
        f"--group={args.group}",
        f"--new={args.new}",
        f"--iterations={args.steps - 1 or 1}",
        f"--threads={args.threads}",
        *[f"--set={kv}" for kv in args.set],
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "side": "srpo",
        "completions": r["rows"][0],
        "tokens": r["tokens"],
        **{
            key: {"total": r[key]["total"], "generation": r[key]["rollout"], "update": r[key]["update"]}
            for key in ("s_per_1k", "cpu_s_per_1k")
        },
        "peak_rss_gb": r["peak_rss_gb"],
        "settings": r["settings"],
    }


def _trl(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.perf.bench_trl", "--child", *sys.argv[1:]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--new", type=int, default=48, help="max new tokens per completion")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (both sides)")
    ap.add_argument(
        "--srpo-tasks", type=int, default=16, help="srpo tasks per iteration (x group x 4 agents)"
    )
    ap.add_argument("--trl-prompts", type=int, default=16, help="TRL prompts per step (x group)")
    ap.add_argument("--steps", type=int, default=3, help="steps (TRL) / iterations + 1 (srpo) per run")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs of each side")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="srpo TrainConfig override"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be >= 1")
    if importlib.util.find_spec("trl") is None:
        print("bench_trl: trl is not installed (pip install trl); skipped")
        return
    if args.child:
        print(json.dumps(run_trl(args)))
        return
    runs: dict[str, list[dict[str, Any]]] = {"srpo": [], "trl": []}
    for _ in range(args.repeats):
        runs["srpo"].append(_srpo(args))
        runs["trl"].append(_trl(args))
    print(
        f"srpo: {runs['srpo'][0]['completions']} completions/iteration; "
        f"TRL: {runs['trl'][0]['completions']} completions/step; new={args.new}; "
        f"srpo settings {json.dumps(runs['srpo'][0]['settings'])}"
    )
    print(table(runs))


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The markdown side-by-side: wall and CPU seconds per 1k generated tokens (medians), peak RSS."""
    lines = ["| per 1k generated tokens | srpo | TRL | srpo/TRL |", "|---|---|---|---|"]
    parts = (("total", "full RL iteration"), ("generation", "generation (+ env)"), ("update", "update"))
    for key, unit in (("s_per_1k", "wall"), ("cpu_s_per_1k", "CPU")):
        for part, label in parts:
            s, t = (statistics.median(r[key][part] for r in runs[side]) for side in ("srpo", "trl"))
            lines.append(f"| {label} ({unit}) | {s:.2f} s | {t:.2f} s | {s / t:.2f} |")
    s, t = (max(r["peak_rss_gb"] for r in runs[side]) for side in ("srpo", "trl"))
    lines.append(f"| peak RSS | {s:.1f} GB | {t:.1f} GB | {s / t:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
