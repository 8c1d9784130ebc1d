"""What a rollout's envs cost when they pool many invented worlds (``kb_seed=[...]``).

    python -m benchmarks.perf.bench_kb_worlds [--worlds 64] [--envs 128]

A rollout makes one env per sample (16 tasks x G=8 = 128 for quick-search), and every env of a pooled
world list loads every world. Prints the seconds and resident memory the first env and the next
``--envs - 1`` take: the worlds are built once per process and shared
(``srpo_envs.tasks.knowledge_base.KB_CACHE_WORLDS``), so the later envs should cost little of either.
The first env also opens (or builds and caches) the pooled corpus's BM25 index.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import srpo_envs


def _rss_gb() -> float:
    """This process's resident memory now (not its peak: the per-env cost is a difference)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worlds", type=int, default=64, help="pooled worlds (kb_seed 3 .. 3+N-1)")
    parser.add_argument("--envs", type=int, default=128, help="envs to make (one per rollout sample)")
    args = parser.parse_args()
    seeds = list(range(3, 3 + args.worlds))

    def make() -> Any:
        return srpo_envs.make("MultiTurnSearch-v0", dataset="kb", kb_seed=seeds, workflow="parallel")

    base = _rss_gb()
    t0 = time.perf_counter()
    envs = [make()]
    t1, first = time.perf_counter(), _rss_gb()
    envs += [make() for _ in range(args.envs - 1)]
    t2, last = time.perf_counter(), _rss_gb()
    rest = max(1, args.envs - 1)
    print(f"{args.worlds} worlds, {len(envs[0].unwrapped.tasks)} training questions per env")
    print(f"first env: {t1 - t0:.2f} s, +{first - base:.3f} GB RSS (index opened or built)")
    print(
        f"next {args.envs - 1} envs: {(t2 - t1) / rest * 1000:.1f} ms and "
        f"{(last - first) / rest * 1024:.2f} MB each; {last:.2f} GB RSS in all"
    )


if __name__ == "__main__":
    main()
