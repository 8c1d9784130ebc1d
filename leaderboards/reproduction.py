"""Which samples ``srpo leaderboard reproduce`` re-generates, and what a passing check is worth.

A sample can only be re-generated exactly together with the rest of its *chunk* (the problems that
were generated in one batch: padding and batch composition decide the tokens), so the unit of a
check is a chunk: ``(seed, dataset, first problem of the chunk)``. Every sample of a re-generated
chunk is compared.

The choice must be one the record's author cannot predict. The first version took a fixed default
seed, so its chunks were the same for every verifier: a forger rewrote only samples in the chunks it
never checked, and ``reproduce`` reported "96 of 96 match". Now:

* by default every seed x dataset x chunk stratum is re-generated (at least one sample of each, and
  since chunks are re-generated whole, every sample): a forged sample has nowhere to hide, and the
  stated detection probability is 1;
* ``--max-chunks K`` bounds the cost for a large record: K chunks drawn at random, with a seed drawn
  at verification time from the OS (:func:`draw_seed`; printed, so the same check can be re-run
  with ``--seed``). The author cannot know which chunks will be drawn, and the command states the
  probability that a forgery of a given share of the samples is caught (:func:`detection_probability`):
  hypergeometric over chunks, counting the forgery packed into as few chunks as possible, its best
  case against the check.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import hypergeom

__all__ = ["Chunk", "ReproductionPlan", "detection_probability", "draw_seed", "plan_reproduction"]

#: ``(seed, dataset, first task index of the chunk)``
Chunk = tuple[int, str, int]
#: Forged shares of the samples for which the detection probability is stated.
STATED_FRACTIONS = (0.01, 0.05)


def draw_seed() -> int:
    """A seed the record's author cannot predict: 63 bits from the OS's CSPRNG (:mod:`secrets`)."""
    return secrets.randbits(63)


@dataclass(frozen=True)
class ReproductionPlan:
    """The chunks to re-generate, chosen with ``seed`` (drawn at verification time unless given)."""

    seed: int
    chunks: list[Chunk]
    n_chunks: int
    """chunks (seed x dataset x chunk strata) the record's samples fall into"""
    chunk_samples: dict[Chunk, int]
    """samples in each chunk of the record"""

    @property
    def total_samples(self) -> int:
        return sum(self.chunk_samples.values())

    @property
    def compared_samples(self) -> int:
        return sum(self.chunk_samples[c] for c in self.chunks)

    @property
    def every_stratum(self) -> bool:
        return len(self.chunks) == self.n_chunks

    @property
    def label(self) -> str:
        """How the chunks were chosen, for messages and the page: ``all chunks`` or ``seed S``."""
        return "all chunks" if self.every_stratum else f"seed {self.seed}"

    def detection(self, fraction: float) -> tuple[int, float]:
        """``(forged samples, probability the check catches at least one)`` for a forgery of
        ``fraction`` of the samples (at least one sample)."""
        forged = max(1, math.ceil(fraction * self.total_samples))
        sizes = sorted(self.chunk_samples.values(), reverse=True)
        return forged, detection_probability(sizes, len(self.chunks), forged)

    def summary(self) -> list[str]:
        """The lines ``reproduce`` prints before it starts: seed, coverage, detection probability."""
        lines = [
            "every chunk is re-generated: no sample is left to chance (no seed needed)"
            if self.every_stratum
            else f"seed {self.seed} (re-run this exact check with --seed {self.seed})",
            f"re-generating {len(self.chunks)} of {self.n_chunks} chunks (seed x dataset x chunk strata): "
            f"{self.compared_samples} of {self.total_samples} samples compared",
        ]
        for fraction in STATED_FRACTIONS:
            forged, p = self.detection(fraction)
            lines.append(
                f"a forgery of {fraction:.0%} of the samples ({forged}) is caught with probability >= {p:.4f}"
            )
        return lines


def detection_probability(chunk_sizes: Sequence[int], drawn: int, forged: int) -> float:
    """Probability that ``drawn`` chunks picked uniformly without replacement include a forged sample,
    when ``forged`` samples were forged in the fewest chunks they fit in (the forger's best case).

    ``chunk_sizes`` lists the samples per chunk. The forgery touches at least ``c`` chunks, the
    fewest of the largest chunks holding ``forged`` samples; the number of touched chunks among the
    drawn ones is hypergeometric (population = chunks, successes = c, draws = ``drawn``), and the
    check catches the forgery when it is at least 1.
    """
    total = len(chunk_sizes)
    if forged <= 0 or total == 0 or drawn <= 0:
        return 0.0
    sizes = sorted(chunk_sizes, reverse=True)
    touched, held = 0, 0
    while held < forged and touched < total:
        held += sizes[touched]
        touched += 1
    return float(hypergeom(M=total, n=touched, N=min(drawn, total)).sf(0))


def plan_reproduction(
    samples: Sequence[Mapping[str, Any]],
    chunk_size: int,
    *,
    max_chunks: int | None = None,
    seed: int | None = None,
) -> ReproductionPlan:
    """Every chunk of ``samples`` (default), or ``max_chunks`` of them drawn at random with ``seed``
    (:func:`draw_seed` when ``None``). A budget at or above the number of chunks takes them all."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if max_chunks is not None and max_chunks < 1:
        raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
    seed = draw_seed() if seed is None else seed
    sizes: dict[Chunk, int] = {}
    for s in samples:
        key = (int(s["seed"]), str(s["dataset"]), (int(s["task_index"]) // chunk_size) * chunk_size)
        sizes[key] = sizes.get(key, 0) + 1
    strata = sorted(sizes)
    if max_chunks is None or max_chunks >= len(strata):
        chosen = strata
    else:
        chosen = sorted(random.Random(seed).sample(strata, max_chunks))
    return ReproductionPlan(seed=seed, chunks=chosen, n_chunks=len(strata), chunk_samples=sizes)
