"""``srpo bench power``: how many seeds and problems a comparison needs, measured from a short pilot.

A pilot trains two variants (default srpo and grpo) for a few seeds with the suite's ``bench quick``
settings and evaluates them on the held-out problems; :func:`benchmarks.decide.variance_components`
splits the variance of their paired difference into training seeds, problems, seed x problem and the
sampling noise of the k samples; :func:`benchmarks.decide.power_table` turns that into the seeds needed
to detect 1, 2 and 5 points for each number of problems and k, and the minimum detectable difference.

The table is a model-based extrapolation: more problems are assumed to behave like the pilot's (drawn
from the same split), more samples per problem shrink only the sampling part. A pilot of 3 seeds
estimates the seed variance loosely (a 95% interval of a variance from 2 degrees of freedom spans a
factor of ~40), so the table says which order of magnitude of seeds a decision needs, and a finished
comparison's own decisions.md (its MDE from all its seeds) is the number to quote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from benchmarks import decide
from benchmarks.report import to_markdown

__all__ = ["PowerReport", "power_report"]

#: Differences the table sizes a comparison for (macro score units: 0.01 = 1 point).
DELTAS = (0.01, 0.02, 0.05)


@dataclass
class PowerReport:
    """The pilot's variance split and the design table built from it."""

    suite: str
    variants: tuple[str, str]
    components: decide.Components  # of the paired difference variants[0] - variants[1]
    single: decide.Components  # of one method's score (variants[0]), for reference
    table: pd.DataFrame
    pilot_delta: float

    def markdown(self) -> str:
        c = self.components
        shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in c.shares().items())
        a, b = self.variants
        lines = [
            f"# {self.suite}: power of a paired comparison ({a} - {b})",
            "",
            f"Pilot: {c.n_seeds} training seeds x {sum(c.n_problems.values())} problems x k={c.k}; "
            f"pilot Δ = {100 * self.pilot_delta:+.1f} pt.",
            "",
            "Variance of the paired difference (per unit): between seeds "
            f"{c.seed:.2e}; between problems "
            + ", ".join(f"{d} {v:.2e}" for d, v in c.problem.items())
            + "; seed x problem (incl. sampling) "
            + ", ".join(f"{d} {v:.2e}" for d, v in c.residual.items())
            + f". Share of the pilot mean's variance: {shares}.",
            "",
            f"Seed component of one method's score ({a}), beyond what problem and sample noise explain "
            f"(method of moments, 0 when they explain it all): sd {100 * self.single.seed**0.5:.1f} pt; "
            f"of the paired difference: sd {100 * c.seed**0.5:.1f} pt.",
            "",
            *(
                [
                    "**The pilot's between-seed variance came out 0** (its moment estimate was <= 0 with "
                    f"{c.n_seeds} seeds): the table below then ignores training-seed noise and is optimistic; "
                    "rerun the pilot with more seeds before trusting it.",
                    "",
                ]
                if c.seed == 0.0
                else []
            ),
            "Seeds needed to detect Δ (two-sided 5%, 80% power), and the MDE with the pilot's and with 10 "
            "seeds:",
            "",
            to_markdown(self.table, floatfmt=".1f"),
            "",
            f"A {c.n_seeds}-seed pilot estimates the seed variance loosely; quote a finished comparison's own "
            "MDE (decisions.md). With a fixed set of problems, more seeds cannot remove the between-problem "
            "part: that is why some cells need more problems, not more seeds.",
        ]
        return "\n".join(lines) + "\n"


def power_report(
    suite: str,
    samples: Mapping[str, Mapping[int, pd.DataFrame]],
    variants: Sequence[str],
    *,
    problems: Sequence[int] | None = None,
    ks: Sequence[int] | None = None,
    deltas: Sequence[float] = DELTAS,
) -> PowerReport:
    """The power table of ``variants[0]`` vs ``variants[1]`` from their pilot runs' per-sample frames.

    ``problems``: total held-out problems to tabulate (default: the pilot's and the whole split if
    known by the caller); ``ks``: samples per problem (default: the pilot's and 4).
    """
    if len(variants) != 2:
        raise ValueError(f"a power pilot compares two variants, got {list(variants)}")
    a, b = variants
    m = decide.score_matrices({a: samples[a], b: samples[b]})
    ma, mb = m[a], m[b]
    if ma.seeds != mb.seeds or len(ma.seeds) < 2:
        raise ValueError(
            f"a power pilot needs the same >= 2 training seeds for {a} ({list(ma.seeds)}) and {b} "
            f"({list(mb.seeds)}): one seed says nothing about the seed variance"
        )
    d = ma.scores - mb.scores
    comps = decide.variance_components(d, ma.datasets, ma.within + mb.within, k=ma.k)
    single = decide.variance_components(ma.scores, ma.datasets, ma.within, k=ma.k)
    measured = sum(comps.n_problems.values())
    sizes = sorted(set(problems or [measured]))
    k_values = sorted(set(ks or [ma.k, max(ma.k, 4)]))
    frames = []
    for k in k_values:
        frames.append(decide.power_table(comps, deltas=deltas, problems=sizes, k=k))
    table = pd.concat(frames, ignore_index=True)
    return PowerReport(suite, (a, b), comps, single, table, float((d @ _weights(ma)).mean()))


def _weights(m: decide.ScoreMatrix) -> Any:
    return decide._macro_weights(m.datasets)
