"""Per-iteration seeds: every random draw of an iteration (its tasks, its rollouts' sampling, its
minibatch shuffles) is seeded from ``(run seed, iteration, salt)``, so a resumed run replays exactly
what the uninterrupted run would have done, whatever ran before it in the process."""

from __future__ import annotations

import numpy as np

__all__ = ["iteration_seed"]


def iteration_seed(seed: int, iteration: int, salt: int = 0) -> int:
    """A 32-bit seed from ``(seed, iteration, salt)`` (``numpy.random.SeedSequence``: independent streams)."""
    return int(np.random.SeedSequence([seed, iteration, salt]).generate_state(1)[0])
