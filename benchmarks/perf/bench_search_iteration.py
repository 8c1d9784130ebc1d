"""Where a search iteration's time goes, how close the update runs to this machine's matmul speed, what an
asynchronous generator in its own process buys, and what larger generation batches buy: ratios, each
measured in one run.

    python -m benchmarks.perf.bench_search_iteration [--suite quick-search] [--iterations 4] [--tasks-per-iter 16]
        [--set update.pack_len=256 ...] [--generation-rows 64,128,256] [--json out.json]

1. **Phases** (the synchronous loop, the suite's ``bench quick`` training settings and worlds, the bundled warm
   start; ``--suite`` picks the search suite, quick-search by default): per
   iteration after the first, the seconds spent generating (``HFPolicy.generate``), retrieving (the
   retriever's ``search``), grading (the env's outcome: EM/F1 against the gold answers), the rest of the
   rollout (env steps, prompts, row building), and the update; each as a share of the iteration.
2. **Update FLOP/s against matmul FLOP/s.** The update's work is counted as it runs: every linear layer
   (``2 x in x out`` FLOPs per position; the LM head included, embeddings not) and every
   ``scaled_dot_product_attention`` call (``4 x heads x queries x keys x head_dim``: the score and value
   products, computed densely over a prefix-tree pack whatever its mask allows), each three times the
   forward's where its backward runs. The attention mask's density says how much of that attention work
   the tree mask keeps. Divided by the update's seconds, the work is set against ``torch.mm`` at the
   model's own shapes (the update's median positions per forward x hidden size times hidden x the MLP's
   width, float32, this process's threads): the ratio is how much of the machine's matmul speed the
   update turns into arithmetic. (The prefix-tree forward calls the decoder and the head directly, so
   a hook on the model's own forward would see none of it: the hooks sit on the layers.)
3. **Asynchronous generation in a Ray worker.** Wall seconds per iteration of the synchronous loop, of
   ``--max-staleness 1`` with the generator as a thread in this process, and of ``--max-staleness 1
   --rollout-workers 1`` with the generator in a Ray worker process (its own interpreter, no GIL shared
   with the learner), each against the synchronous loop.

4. **Rows generated at once** (``--generation-rows 64,128,256``): seconds per rollout phase (the
   iteration's episodes, dynamic sampling's batches included) with ``HFPolicy.max_batch_size`` at each
   value, the same iterations replayed without an update in between, best of two interleaved rounds, and
   a hash of every sampled token, so a faster setting that samples something else shows.

Every number comes from this run, on whatever else the machine is doing: compare ratios, not seconds,
and rerun before trusting a small difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.perf.bench_async import train_stamped
from learners.config import TrainConfig, train_layout

SUITE = "quick-search"
SUITES = ("quick-search", "quick-search-routed", "quick-search-team")


def _config(
    out: str, iterations: int, tasks: int | None, seed: int, suite: str = SUITE, sets: dict[str, Any] | None = None,
    **extra: Any,
) -> Any:
    from benchmarks.presets import QUICK_SETTINGS, TRAINING_ENVS  # see phases_and_flops

    env, settings = TRAINING_ENVS[suite], QUICK_SETTINGS[suite]
    train = dict(settings["train"])
    train.update(iterations=iterations, eval_every=0, save_every=0)
    if tasks is not None:
        train["tasks_per_iter"] = tasks
    train.update(sets or {})
    env_kwargs = {"workflow": env.workflow, **env.env_kwargs, **settings.get("env_kwargs", {})}
    return TrainConfig(
        algo="srpo", model=str(env.bundled_model), out_dir=out, env_id=env.env_id,
        env_kwargs=env_kwargs, seed=seed, **train, **extra,
    )  # fmt: skip


class _Clock:
    """Seconds spent inside wrapped callables, per name, since the last :meth:`take`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t0

        return timed

    def take(self) -> dict[str, float]:
        out, self.spent = self.spent, {}
        return out


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def phases_and_flops(
    iterations: int, tasks: int | None, seed: int, suite: str = SUITE, sets: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Parts 1 and 2: one synchronous run with the phases timed and the update's forwards counted."""
    # the model stack (transformers, the envs, the JVM's retriever) loads when a run starts, not for --help
    from agents.hf import HFPolicy
    from learners.trainer import Trainer
    from srpo_envs.retrievers import bm25

    clock = _Clock()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(_config(tmp, iterations, tasks, seed, suite, sets), log=None)
        env = trainer.collector.env_fn()
        env_cls = type(env.unwrapped)
        model = trainer.policies.policies[0].model
        hidden = int(model.config.hidden_size)
        width = int(getattr(model.config, "intermediate_size", 4 * hidden))
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        flops: dict[str, Any] = {"value": 0.0, "attention": 0.0, "kept": 0.0, "positions": []}
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def counted_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            b, h, nq, hd = query.shape
            work = 4.0 * b * h * nq * key.shape[-2] * hd * (3 if torch.is_grad_enabled() and query.requires_grad else 1)
            mask = kwargs.get("attn_mask", args[0] if args else None)
            density = float(mask.float().mean()) if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool else 1.0
            flops["attention"] += work
            flops["kept"] += work * density
            return sdpa(query, key, value, *args, **kwargs)

        def count(module: torch.nn.Linear, args: Any, output: Any) -> None:
            positions = args[0].numel() // module.in_features
            grad = torch.is_grad_enabled() and module.weight.requires_grad
            flops["value"] += (3 if grad else 1) * 2 * module.in_features * module.out_features * positions
            if module is linears[0]:
                flops["positions"].append(positions)

        rows = []
        with (
            _patched(HFPolicy, "generate", clock.wrap("generate", HFPolicy.generate)),
            _patched(bm25.BM25Retriever, "search", clock.wrap("retrieve", bm25.BM25Retriever.search)),
            _patched(env_cls, "_outcome", clock.wrap("grade", env_cls._outcome)),
        ):
            for it in range(1, iterations + 1):
                clock.take()
                t0 = time.perf_counter()
                batch = trainer.rollout(it)
                t1 = time.perf_counter()
                spent = clock.take()
                flops.update(value=0.0, attention=0.0, kept=0.0, positions=[])
                handles = [m.register_forward_hook(count) for m in linears]
                try:
                    with _patched(torch.nn.functional, "scaled_dot_product_attention", counted_sdpa):
                        trainer.update(batch, it)
                finally:
                    for h in handles:
                        h.remove()
                t2 = time.perf_counter()
                rows.append({
                    "rollout_s": t1 - t0, "generate_s": spent.get("generate", 0.0),
                    "retrieve_s": spent.get("retrieve", 0.0), "grade_s": spent.get("grade", 0.0),
                    "update_s": t2 - t1, "update_flops": flops["value"], "attention_flops": flops["attention"],
                    "attention_kept": flops["kept"],
                    "update_positions": statistics.median(flops["positions"] or [0]),
                })  # fmt: skip
    rest = rows[1:] or rows
    mean = {k: statistics.fmean(r[k] for r in rest) for k in rest[0]}
    total = mean["rollout_s"] + mean["update_s"]
    other = mean["rollout_s"] - mean["generate_s"] - mean["retrieve_s"] - mean["grade_s"]
    linear = mean["update_flops"] / mean["update_s"]
    attention = mean["attention_flops"] / mean["update_s"]
    achieved = linear + attention
    peak = matmul_flops(max(1, int(mean["update_positions"])), hidden, width)
    return {
        "iterations_timed": len(rest),
        "iteration_s": total,
        "shares": {
            "generate": mean["generate_s"] / total, "retrieve": mean["retrieve_s"] / total,
            "grade": mean["grade_s"] / total, "rollout_other": other / total, "update": mean["update_s"] / total,
        },
        "seconds": {k: mean[k] for k in ("generate_s", "retrieve_s", "grade_s", "update_s")} | {"rollout_other_s": other},
        "update": {
            "flops_per_s": achieved, "linear_flops_per_s": linear, "attention_flops_per_s": attention,
            "attention_mask_density": mean["attention_kept"] / mean["attention_flops"] if mean["attention_flops"] else 1.0,
            "matmul_flops_per_s": peak, "ratio": achieved / peak, "linear_ratio": linear / peak,
            "positions_per_forward": mean["update_positions"], "shape": [hidden, width],
        },
    }  # fmt: skip


def matmul_flops(rows: int, hidden: int, width: int, repeats: int = 20) -> float:
    """``torch.mm`` FLOP/s of ``[rows, hidden] @ [hidden, width]`` in float32 (median of ``repeats``)."""
    a, b = torch.randn(rows, hidden), torch.randn(hidden, width)
    for _ in range(3):
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2.0 * rows * hidden * width / statistics.median(times)


def async_walls(
    iterations: int, tasks: int | None, seed: int, suite: str = SUITE, sets: dict[str, Any] | None = None
) -> dict[str, float]:
    """Part 3: wall seconds per iteration (after the first) of sync, thread N=1 and Ray-worker N=1."""
    from learners.trainer import Trainer  # see phases_and_flops

    modes = {
        "sync": {},
        "thread_n1": {"max_staleness": 1},
        "ray_worker_n1": {"max_staleness": 1, "rollout_workers": 1},
    }
    walls: dict[str, float] = {}
    threads = torch.get_num_threads()
    for name, extra in modes.items():
        torch.set_num_threads(threads)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(_config(tmp, iterations, tasks, seed, suite, sets, **extra), log=None)
            _, stamps = train_stamped(trainer)
            if trainer.scale.pool is not None:
                trainer.scale.pool.close()
        walls[name] = statistics.fmean(b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True))
    torch.set_num_threads(threads)
    return walls


def generation_rows(
    sizes: list[int], iterations: int, tasks: int | None, seed: int, suite: str = SUITE,
    sets: dict[str, Any] | None = None, rounds: int = 2,
) -> dict[str, Any]:
    """Part 4: rollout seconds at each ``HFPolicy.max_batch_size`` in ``sizes``: ``rounds`` interleaved rounds
    (every size once per round, so drift and warm-up do not favour one), each the mean over ``iterations``
    rollouts; the best round per size, every round's seconds, and the sampled tokens' hash. One weight
    version throughout, so every size replays the same episodes."""
    import hashlib

    from learners.trainer import Trainer  # see phases_and_flops

    out: dict[str, Any] = {str(rows): {"rounds_s": []} for rows in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(_config(tmp, iterations + 1, tasks, seed, suite, sets), log=None)
        policies = trainer.policies.policies
        trainer.rollout(1)  # warm-up: first-call costs land here
        for _ in range(rounds):
            for rows in sizes:
                for policy in policies:
                    policy.max_batch_size = rows
                digest, spent = hashlib.sha256(), 0.0
                for it in range(2, iterations + 2):
                    t0 = time.perf_counter()
                    batch = trainer.rollout(it)
                    spent += time.perf_counter() - t0
                    for row in batch.rows:
                        digest.update(repr(row.response_ids).encode())
                entry = out[str(rows)]
                entry["rounds_s"].append(spent / iterations)
                entry["rollout_s"] = min(entry["rounds_s"])
                if entry.setdefault("tokens_sha256", digest.hexdigest()) != digest.hexdigest():
                    entry["tokens_sha256"] = "differs between rounds"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=SUITES, default=SUITE, help="the search suite whose iteration is measured")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per run (the first is not timed)")
    ap.add_argument("--tasks-per-iter", type=int, default=None, help="default: the suite's (16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-async", action="store_true", help="skip part 3 (the three asynchronous runs)")
    ap.add_argument(
        "--generation-rows", default="", help="comma-separated HFPolicy.max_batch_size values for part 4 (off if empty)"
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="a TrainConfig field over the suite's setting, as srpo train --set (repeatable): update.pack_len=256",
    )  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    try:  # srpo train's --set: section.field=VALUE, an unknown key named with its nearest field
        sets = train_layout().parse_sets(args.set)
        sizes = [int(v) for v in args.generation_rows.split(",") if v.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if any(n < 1 for n in sizes):
        ap.error(f"--generation-rows {args.generation_rows!r}: every value must be a positive row count")
    out: dict[str, Any] = {"suite": args.suite, "threads": torch.get_num_threads(), "set": sets}
    out["phases"] = phases_and_flops(args.iterations, args.tasks_per_iter, args.seed, args.suite, sets)
    p = out["phases"]
    print(f"{args.suite} iteration, synchronous: {p['iteration_s']:.2f} s (mean of {p['iterations_timed']})")
    for name, share in p["shares"].items():
        print(f"  {name:<14} {share:6.1%}")
    u = p["update"]
    print(
        f"update: {u['flops_per_s'] / 1e9:.2f} GFLOP/s ({u['linear_flops_per_s'] / 1e9:.2f} in linear layers, "
        f"{u['attention_flops_per_s'] / 1e9:.2f} in attention, of which the tree mask keeps "
        f"{u['attention_mask_density']:.1%}); torch.mm of [{u['positions_per_forward']:.0f} x {u['shape'][0]}] @ "
        f"{u['shape']}: {u['matmul_flops_per_s'] / 1e9:.2f} GFLOP/s; ratio {u['ratio']:.3f} "
        f"(linear layers alone {u['linear_ratio']:.3f})"
    )
    if not args.skip_async:
        walls = out["async"] = async_walls(args.iterations, args.tasks_per_iter, args.seed, args.suite, sets)
        for name, wall in walls.items():
            print(f"{name:<14} {wall:6.2f} s/iteration   {walls['sync'] / wall:5.2f}x the synchronous loop's speed")
    if sizes:
        gen = out["generation_rows"] = generation_rows(
            sizes, args.iterations, args.tasks_per_iter, args.seed, args.suite, sets
        )
        base = gen[str(sizes[0])]
        for rows, r in gen.items():
            same = "same tokens" if r["tokens_sha256"] == base["tokens_sha256"] else "OTHER TOKENS"
            rounds = " / ".join(f"{v:.2f}" for v in r["rounds_s"])
            print(
                f"generation, {rows:>4} rows at once: {r['rollout_s']:6.2f} s/rollout (rounds {rounds})   "
                f"{base['rollout_s'] / r['rollout_s']:5.2f}x the {sizes[0]}-row speed ({same})"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
