"""Paired comparisons that decide: method A vs method B on the same problems, eval seeds and training seeds.

Every comparison a suite runner makes is *paired*: both methods start from the same model, are trained
with the same training seeds and are evaluated on the same problems with the same eval seeds. The
most informative statistic is then the paired difference, not two separate intervals. This module
turns the per-sample tables the runners already keep (one ``EvalResult.samples`` frame per (method,
seed)) into a decision:

* ``delta``: difference of the macro scores (each dataset weighs the same), averaged over seeds;
* its 95% interval from a **two-level bootstrap** -- training seeds, then problems stratified by
  dataset -- studentised (bootstrap-t), see :func:`two_level_bootstrap`;
* ``p_improvement``: P(A > B) over seed pairs (rliable's probability of improvement: the
  Mann-Whitney U statistic over the runs' macro scores, ties count one half);
* the IQM of each method's runs (rliable; :func:`scipy.stats.trim_mean` with a 25% cut) and its
  bootstrap interval (:func:`scipy.stats.bootstrap`);
* the variance split of the difference: between training seeds, between problems, seed x problem,
  and the part that is sampling noise of the k samples per problem (:func:`variance_components`);
* from that split, the power of the comparison for any design (seeds x problems x k): the minimum
  detectable difference at 80% power and the seeds needed for a given difference
  (:func:`power`, :func:`mde`, :func:`seeds_needed`; noncentral t from :mod:`scipy.stats` with
  Satterthwaite degrees of freedom).

Why a small hand-written resampler for the interval: the design is *crossed* (every seed sees every
problem), and the naive crossed bootstrap (resample seeds and problems independently) counts the
seed x problem residual three times (McCullagh 2000; Owen 2007), while :func:`scipy.stats.bootstrap`
resamples one level only. The statistic is linear, so it splits exactly into a seed part (the
per-seed macro differences, which carry their own residual noise) and a problem part (the
seed-averaged per-problem effects); the problem part is resampled after rescaling the effects to
the estimated between-problem variance (the "reflated" random-effect bootstrap of Carpenter,
Goldstein & Rasbash 2003), so each variance component is counted once. With 10 seeds a percentile
interval undercovers (the bootstrap variance of a mean of 10 is 10% short and z is not t), so the
interval is studentised. Everything is vectorised: one call draws all resamples as count matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from scipy import optimize, stats

from benchmarks.metrics import per_problem
from benchmarks.report import to_markdown, write_csv
from srpo_common import atomic_write_text

__all__ = [
    "ALPHA",
    "POWER",
    "Components",
    "Decision",
    "ScoreMatrix",
    "decide",
    "decision_frame",
    "decision_table",
    "decisions_markdown",
    "iqm",
    "mde",
    "paired_difference",
    "power",
    "power_table",
    "probability_of_improvement",
    "reference_of",
    "score_matrices",
    "seeds_needed",
    "two_level_bootstrap",
    "unpaired_difference",
    "variance_components",
    "write_decisions",
]

#: Two-sided level of every interval and test here (95% intervals), and the target power of an MDE.
ALPHA = 0.05
POWER = 0.80
#: Default equivalence margin (macro score units: 0.02 = 2 points): a difference whose whole interval
#: lies inside +-margin is called equivalent.
MARGIN = 0.02
N_RESAMPLES = 4000
#: Below this many training seeds the bootstrap cannot represent the seed distribution (3 seeds have 10
#: distinct resamples): the interval is then the t interval with the components' Satterthwaite df.
MIN_BOOTSTRAP_SEEDS = 5


# ------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class ScoreMatrix:
    """One method's per-problem scores: ``scores[s, p]`` = Avg@k of problem ``p`` in the run with
    training (and eval) seed ``seeds[s]``; ``within[s, p]`` = the sampling variance of that mean
    (per-sample variance / n, from the k samples), the part of the noise more samples would remove."""

    seeds: tuple[int, ...]
    datasets: np.ndarray  # (P,) dataset name of each problem column
    problems: tuple[tuple[str, str], ...]  # (dataset, problem_id) of each column
    scores: np.ndarray  # (S, P)
    within: np.ndarray  # (S, P)
    k: int = 1  # samples per problem the scores were measured with (median)

    @property
    def macro(self) -> np.ndarray:
        """(S,) macro score of every run: mean over datasets of the mean over the dataset's problems."""
        return self.scores @ _macro_weights(self.datasets)


def _macro_weights(datasets: np.ndarray) -> np.ndarray:
    names, inverse, counts = np.unique(datasets, return_inverse=True, return_counts=True)
    return 1.0 / (len(names) * counts[inverse])


def _strata(datasets: np.ndarray) -> list[np.ndarray]:
    return [np.flatnonzero(datasets == d) for d in dict.fromkeys(datasets.tolist())]


def score_matrices(
    runs: Mapping[str, Mapping[int, pd.DataFrame]], score: str = "avg@k"
) -> dict[str, ScoreMatrix]:
    """``method -> seed -> per-sample frame`` (the runners' ``EvalResult.samples``) as score matrices.

    Every run must cover the same problems (the comparison is paired by problem); a run with another
    problem set is refused with the first difference named, rather than silently intersected.
    """
    out: dict[str, ScoreMatrix] = {}
    keys: tuple[tuple[str, str], ...] | None = None
    for method, by_seed in runs.items():
        if not by_seed:
            raise ValueError(f"method {method!r} has no runs")
        rows, within, ks = [], [], []
        for seed in sorted(by_seed):
            samples = by_seed[seed]
            pp = per_problem(samples).sort_values(["dataset", "problem_id"], kind="stable")
            here = tuple(zip(pp["dataset"].astype(str), pp["problem_id"].astype(str), strict=True))
            if keys is None:
                keys = here
            elif here != keys:
                diff = sorted(set(here) ^ set(keys))[:1]
                raise ValueError(
                    f"{method} seed {seed} was evaluated on other problems than the first run "
                    f"(e.g. {diff}); a paired comparison needs the same problems"
                )
            n = pp["n"].to_numpy(dtype=np.float64)
            p = pp[score].to_numpy(dtype=np.float64)
            rows.append(p)
            # unbiased variance of a mean of n Bernoulli samples: p(1-p)/(n-1); 0 when n == 1
            within.append(np.where(n > 1, p * (1.0 - p) / np.maximum(n - 1.0, 1.0), 0.0))
            ks.append(int(np.median(n)))
        assert keys is not None
        out[method] = ScoreMatrix(
            seeds=tuple(sorted(by_seed)),
            datasets=np.array([d for d, _ in keys]),
            problems=keys,
            scores=np.vstack(rows),
            within=np.vstack(within),
            k=int(np.median(ks)),
        )
    return out


def _paired(a: ScoreMatrix, b: ScoreMatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(D, W, datasets): A - B on the seeds both ran, the summed sampling variance, column datasets."""
    if a.problems != b.problems:
        raise ValueError("the two methods were evaluated on different problems: not a paired comparison")
    common = [s for s in a.seeds if s in b.seeds]
    if not common:
        raise ValueError(f"no training seed in common (A: {list(a.seeds)}, B: {list(b.seeds)})")
    ia = [a.seeds.index(s) for s in common]
    ib = [b.seeds.index(s) for s in common]
    return a.scores[ia] - b.scores[ib], a.within[ia] + b.within[ib], a.datasets


# ------------------------------------------------------------------------------ variance components


@dataclass(frozen=True)
class Components:
    """The variance of a macro score (or of a paired difference of macro scores), split by source.

    ``seed``: between training seeds, of the macro (what more seeds average out);
    ``problem[d]``: between problems of dataset ``d`` (what more problems average out);
    ``residual[d]``: seed x problem of one cell of dataset ``d`` (averaged out by seeds x problems),
    of which ``sampling[d]`` is the noise of the k samples per problem (averaged out by larger k too).
    The standard error of the macro mean with ``S`` seeds and ``n_d`` problems per dataset is
    ``sqrt(seed/S + sum_d problem[d]/(D^2 n_d) + sum_d residual[d]/(S D^2 n_d))``.
    """

    seed: float
    problem: dict[str, float]
    residual: dict[str, float]
    sampling: dict[str, float]
    n_seeds: int
    n_problems: dict[str, int]
    k: int

    def variance(self, seeds: int | None = None, problems: int | None = None, k: int | None = None) -> float:
        """Variance of the mean over a design of ``seeds`` x ``problems`` (total, split over the
        datasets as now) x ``k`` samples; defaults: the measured design."""
        s = self.n_seeds if seeds is None else seeds
        scale = 1.0 if problems is None else problems / sum(self.n_problems.values())
        kk = self.k if k is None else k
        d2 = len(self.n_problems) ** 2
        v = self.seed / s
        for d, n in self.n_problems.items():
            nd = max(n * scale, 1.0)
            res = self.residual[d] - self.sampling[d] + self.sampling[d] * self.k / kk
            v += self.problem[d] / (d2 * nd) + max(res, 0.0) / (s * d2 * nd)
        return v

    def df(self, seeds: int | None = None, problems: int | None = None, k: int | None = None) -> float:
        """Satterthwaite degrees of freedom of that variance: seeds - 1 when seeds dominate, up to
        problems - datasets when problems do."""
        s = self.n_seeds if seeds is None else seeds
        scale = 1.0 if problems is None else problems / sum(self.n_problems.values())
        d2 = len(self.n_problems) ** 2
        p_total = sum(max(n * scale, 1.0) for n in self.n_problems.values())
        v_prob = sum(self.problem[d] / (d2 * max(n * scale, 1.0)) for d, n in self.n_problems.items())
        v_seed = self.variance(seeds, problems, k) - v_prob
        den = v_seed**2 / max(s - 1, 1) + v_prob**2 / max(p_total - len(self.n_problems), 1)
        return float((v_seed + v_prob) ** 2 / den) if den > 0 else float("inf")

    def shares(self) -> dict[str, float]:
        """Each source's share of the variance of the measured design's mean (sums to 1)."""
        d2 = len(self.n_problems) ** 2
        s = self.n_seeds
        parts = {
            "seeds": self.seed / s,
            "problems": sum(self.problem[d] / (d2 * n) for d, n in self.n_problems.items()),
            "seed x problem": sum(
                max(self.residual[d] - self.sampling[d], 0.0) / (s * d2 * n)
                for d, n in self.n_problems.items()
            ),
            "samples": sum(self.sampling[d] / (s * d2 * n) for d, n in self.n_problems.items()),
        }
        total = sum(parts.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}


def variance_components(
    scores: np.ndarray, datasets: np.ndarray, within: np.ndarray | None = None, k: int = 1
) -> Components:
    """Method-of-moments variance components of a seeds x problems matrix (two-way ANOVA without
    replication, per dataset; negative estimates set to 0). ``within`` (same shape) is the sampling
    variance of each cell, from its k samples."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(datasets):
        raise ValueError(f"scores must be seeds x problems with one dataset per column, got {scores.shape}")
    n_seeds = scores.shape[0]
    problem, residual, sampling, n_problems = {}, {}, {}, {}
    macro_resid = 0.0
    strata = _strata(np.asarray(datasets))
    d2 = len(strata) ** 2
    for idx in strata:
        name = str(datasets[idx[0]])
        x = scores[:, idx]
        n = x.shape[1]
        col = x.mean(axis=0)
        if n_seeds > 1 and n > 1:
            res = x - x.mean(axis=1, keepdims=True) - col[None, :] + x.mean()
            ms_res = float((res**2).sum() / ((n_seeds - 1) * (n - 1)))
        else:  # one seed: seed x problem cannot be told from problem; count it as residual via sampling
            ms_res = float(within[:, idx].mean()) if within is not None else 0.0
        var_col = float(col.var(ddof=1)) if n > 1 else 0.0
        problem[name] = max(var_col - ms_res / n_seeds, 0.0)
        residual[name] = ms_res
        sampling[name] = float(within[:, idx].mean()) if within is not None else 0.0
        n_problems[name] = n
        macro_resid += ms_res / (d2 * n)
    w = _macro_weights(np.asarray(datasets))
    macro = scores @ w
    var_macro = float(macro.var(ddof=1)) if n_seeds > 1 else 0.0
    return Components(
        seed=max(var_macro - macro_resid, 0.0),
        problem=problem,
        residual=residual,
        sampling=sampling,
        n_seeds=n_seeds,
        n_problems=n_problems,
        k=int(k),
    )


# -------------------------------------------------------------------------------------- resampling


class Resampler(Protocol):
    """Draws bootstrap replicates of a seeds x problems difference matrix: returns ``(T*, SE*, SE)``:
    each replicate's macro mean and standard error (shape ``(n_resamples,)``), and the standard error
    of the observed mean under the same variance model (the studentised interval is
    ``[T - q_hi SE, T - q_lo SE]`` with q the quantiles of ``(T* - T) / SE*``)."""

    def __call__(
        self, d: np.ndarray, strata: Sequence[np.ndarray], n_resamples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, float]: ...


def _weighted_resample(
    values: np.ndarray, n_resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample variance of ``n_resamples`` bootstrap resamples of ``values``, from counts."""
    n = values.size
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float64)
    mean = counts @ values / n
    var = (counts @ values**2 - n * mean**2) / max(n - 1, 1)
    return mean, np.maximum(var, 0.0)


def two_level_bootstrap(
    d: np.ndarray, strata: Sequence[np.ndarray], n_resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, float]:
    """Replicates of the macro mean of ``d`` (seeds x problems): training seeds resampled, then problems
    resampled within each dataset; see the module docstring for why the problem effects are rescaled.

    Seed level: the per-seed macro values ``m_s`` (each carries its own seed x problem noise).
    Problem level: the seed-averaged effects ``b_p - mean_d(b)`` of each dataset, shrunk so their
    variance is the between-problem component (their raw variance also holds residual / S, already
    counted at the seed level).
    """
    n_seeds = d.shape[0]
    n_d = len(strata)
    macro = sum(d[:, idx].mean(axis=1) for idx in strata) / n_d
    seed_mean, seed_var = _weighted_resample(macro, n_resamples, rng)
    t_star = seed_mean.copy()
    v_star = seed_var / n_seeds
    for idx in strata:
        x = d[:, idx]
        n = x.shape[1]
        if n < 2:
            continue
        col = x.mean(axis=0) - x.mean()
        if n_seeds > 1:
            res = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + x.mean()
            ms_res = (res**2).sum() / ((n_seeds - 1) * (n - 1))
        else:
            ms_res = 0.0
        raw = col.var(ddof=1)
        target = max(raw - ms_res / n_seeds, 0.0)
        effects = col * math.sqrt(target / raw) if raw > 0 else col
        p_mean, p_var = _weighted_resample(effects, n_resamples, rng)
        t_star += p_mean / n_d
        v_star += p_var / (n_d**2 * n)
    return t_star, np.sqrt(v_star), _se(d, strata)


def _se(d: np.ndarray, strata: Sequence[np.ndarray]) -> float:
    """Standard error of the macro mean of ``d`` consistent with :func:`two_level_bootstrap`."""
    n_seeds = d.shape[0]
    n_d = len(strata)
    macro = sum(d[:, idx].mean(axis=1) for idx in strata) / n_d
    v = float(macro.var(ddof=1)) / n_seeds if n_seeds > 1 else 0.0
    for idx in strata:
        x = d[:, idx]
        n = x.shape[1]
        if n < 2:
            continue
        col = x.mean(axis=0)
        ms_res = 0.0
        if n_seeds > 1:
            res = x - x.mean(axis=1, keepdims=True) - col[None, :] + x.mean()
            ms_res = float((res**2).sum() / ((n_seeds - 1) * (n - 1)))
        v += max(float(col.var(ddof=1)) - ms_res / n_seeds, 0.0) / (n_d**2 * n)
    return math.sqrt(v)


def _studentised_interval(
    t_hat: float, se: float, t_star: np.ndarray, se_star: np.ndarray, confidence: float
) -> tuple[float, float]:
    """Bootstrap-t interval ``[T - q_hi SE, T - q_lo SE]``; a replicate with SE* = 0 (every resampled
    seed the same, no problem variance) counts as an infinitely extreme one, so a tiny design gives
    an honest, very wide interval instead of a narrow one."""
    if se == 0.0:
        return t_hat, t_hat
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se_star > 0, (t_star - t_hat) / se_star, np.sign(t_star - t_hat) * np.inf)
    z = np.clip(np.nan_to_num(z, nan=0.0), -1e6, 1e6)
    alpha = (1.0 - confidence) / 2.0
    lo_q, hi_q = np.quantile(z, [alpha, 1.0 - alpha], method="linear")
    return float(t_hat - hi_q * se), float(t_hat - lo_q * se)


# ------------------------------------------------------------------------------------ comparisons


@dataclass
class PairedDifference:
    """A - B: ``delta`` (macro, mean over seeds), its interval, standard error, components."""

    delta: float
    low: float
    high: float
    se: float
    n_seeds: int
    components: Components


def paired_difference(
    a: ScoreMatrix,
    b: ScoreMatrix,
    *,
    confidence: float = 1.0 - ALPHA,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    resampler: Resampler = two_level_bootstrap,
) -> PairedDifference:
    """The paired difference of macro scores A - B with its two-level bootstrap-t interval."""
    d, w, datasets = _paired(a, b)
    strata = _strata(datasets)
    t_hat = float((d @ _macro_weights(datasets)).mean())
    comps = variance_components(d, datasets, w, k=a.k)
    if d.shape[0] < MIN_BOOTSTRAP_SEEDS:
        se = _se(d, strata)
        low, high = _t_interval(t_hat, se, comps.df(), confidence)
    else:
        t_star, se_star, se = resampler(d, strata, n_resamples, np.random.default_rng(seed))
        low, high = _studentised_interval(t_hat, se, t_star, se_star, confidence)
    return PairedDifference(t_hat, low, high, se, d.shape[0], comps)


def _t_interval(t_hat: float, se: float, df: float, confidence: float) -> tuple[float, float]:
    if se == 0.0 or not df > 0:
        return (t_hat, t_hat) if se == 0.0 else (-math.inf, math.inf)
    q = float(stats.t.ppf(0.5 + confidence / 2.0, df))
    return t_hat - q * se, t_hat + q * se


def unpaired_difference(
    a: ScoreMatrix,
    b: ScoreMatrix,
    *,
    confidence: float = 1.0 - ALPHA,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    resampler: Resampler = two_level_bootstrap,
) -> PairedDifference:
    """The same difference as if A and B had been run apart (each method resampled on its own): what
    separate per-method intervals imply. Kept to show what pairing buys, not for decisions."""
    rng = np.random.default_rng(seed)
    strata = _strata(a.datasets)
    w = _macro_weights(a.datasets)
    t_hat = float((a.scores @ w).mean() - (b.scores @ w).mean())
    comps = variance_components(a.scores, a.datasets, a.within, k=a.k)
    if len(a.seeds) < MIN_BOOTSTRAP_SEEDS:
        se = math.hypot(_se(a.scores, strata), _se(b.scores, strata))
        low, high = _t_interval(t_hat, se, comps.df(), confidence)
    else:
        ta, sa, se_a = resampler(a.scores, strata, n_resamples, rng)
        tb, sb, se_b = resampler(b.scores, strata, n_resamples, rng)
        se = math.hypot(se_a, se_b)
        low, high = _studentised_interval(t_hat, se, ta - tb, np.hypot(sa, sb), confidence)
    return PairedDifference(t_hat, low, high, se, len(a.seeds), comps)


def probability_of_improvement(a_runs: Sequence[float], b_runs: Sequence[float]) -> float:
    """P(A > B) over seed pairs (rliable): the Mann-Whitney U of A's run scores against B's, divided by
    the number of pairs; ties count one half. 0.5 = no tendency either way."""
    a_arr = np.asarray(a_runs, dtype=np.float64)
    b_arr = np.asarray(b_runs, dtype=np.float64)
    u = stats.mannwhitneyu(a_arr, b_arr, alternative="two-sided").statistic
    return float(u / (a_arr.size * b_arr.size))


def iqm(
    runs: Sequence[float], *, confidence: float = 1.0 - ALPHA, n_resamples: int = N_RESAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """Interquartile mean of the runs' scores (rliable: robust to one diverged run) with a percentile
    bootstrap interval over runs (:func:`scipy.stats.bootstrap`); ``(iqm, low, high)``."""
    arr = np.asarray(runs, dtype=np.float64)
    point = float(stats.trim_mean(arr, 0.25))
    if arr.size < 2 or np.ptp(arr) == 0:
        return point, point, point
    res = stats.bootstrap(
        (arr,),
        lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


# ----------------------------------------------------------------------------------------- power


def power(
    delta: float,
    comps: Components,
    *,
    seeds: int | None = None,
    problems: int | None = None,
    k: int | None = None,
    alpha: float = ALPHA,
) -> float:
    """Probability that a two-sided level-``alpha`` test (interval excludes 0) detects a true difference
    ``delta`` with this design: noncentral t with the Satterthwaite df of the variance components."""
    se = math.sqrt(comps.variance(seeds, problems, k))
    if se == 0.0:
        return 1.0 if delta != 0 else alpha
    df = comps.df(seeds, problems, k)
    crit = stats.t.ppf(1.0 - alpha / 2.0, df)
    nc = abs(delta) / se
    p = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    if not math.isfinite(p):  # scipy's nct gives NaN far in the tail; the normal limit is exact enough there
        p = float(stats.norm.sf(crit - nc) + stats.norm.cdf(-crit - nc))
    return min(p, 1.0)


def mde(
    comps: Components,
    *,
    seeds: int | None = None,
    problems: int | None = None,
    k: int | None = None,
    alpha: float = ALPHA,
    target: float = POWER,
) -> float:
    """Minimum detectable difference: the smallest true difference found with probability ``target``."""
    se = math.sqrt(comps.variance(seeds, problems, k))
    if se == 0.0:
        return 0.0
    f = lambda x: power(x, comps, seeds=seeds, problems=problems, k=k, alpha=alpha) - target  # noqa: E731
    return float(optimize.brentq(f, 1e-12, 20.0 * se))


def seeds_needed(
    delta: float,
    comps: Components,
    *,
    problems: int | None = None,
    k: int | None = None,
    alpha: float = ALPHA,
    target: float = POWER,
    max_seeds: int = 1000,
) -> int | None:
    """The fewest training seeds that detect ``delta`` with probability ``target`` (None: more than
    ``max_seeds``, e.g. when problems alone leave too much noise)."""
    for s in range(2, max_seeds + 1):
        if power(delta, comps, seeds=s, problems=problems, k=k, alpha=alpha) >= target:
            return s
    return None


def power_table(
    comps: Components,
    *,
    deltas: Sequence[float] = (0.01, 0.02, 0.05),
    problems: Sequence[int] | None = None,
    k: int | None = None,
    max_seeds: int = 200,
) -> pd.DataFrame:
    """Seeds needed to detect each difference (columns ``Δ=1 pt``...) for each number of problems (rows),
    plus the MDE with the measured number of seeds -- the table ``srpo bench power`` prints."""
    measured = sum(comps.n_problems.values())
    sizes = list(problems) if problems is not None else sorted({measured, 2 * measured, 4 * measured})
    rows = []
    for p in sizes:
        row: dict[str, Any] = {"problems": p, "k": k or comps.k}
        for dv in deltas:
            need = seeds_needed(dv, comps, problems=p, k=k, max_seeds=max_seeds)
            row[f"seeds for Δ={dv * 100:g} pt"] = f">{max_seeds}" if need is None else str(need)
        for s in (comps.n_seeds, 10):
            row[f"MDE @ {s} seeds (pt)"] = round(100 * mde(comps, seeds=max(s, 2), problems=p, k=k), 2)
        rows.append(row)
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------- decisions


@dataclass
class Decision:
    """One row of ``decisions.csv``: ``variant`` against ``reference``."""

    variant: str
    reference: str
    n_seeds: int
    variant_mean: float
    reference_mean: float
    delta: float
    low: float
    high: float
    p_improvement: float
    iqm: float
    iqm_low: float
    iqm_high: float
    mde: float
    margin: float
    verdict: str
    shares: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        shares = out.pop("shares")
        out.update({f"var_share_{k.replace(' ', '_')}": v for k, v in shares.items()})
        return out


def verdict(low: float, high: float, margin: float) -> str:
    """better / worse when the interval excludes 0; equivalent when it lies inside ±margin; else
    undecided (the data allow both a real difference and none)."""
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    if -margin < low and high < margin:
        return "equivalent"
    return "undecided"


def decide(
    a: ScoreMatrix,
    b: ScoreMatrix,
    *,
    variant: str,
    reference: str,
    margin: float = MARGIN,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> Decision:
    """Everything a reader needs to decide between ``variant`` (A) and ``reference`` (B)."""
    diff = paired_difference(a, b, n_resamples=n_resamples, seed=seed)
    ma, mb = a.macro, b.macro
    q, lo, hi = iqm(ma, n_resamples=min(n_resamples, 2000), seed=seed)
    return Decision(
        variant=variant,
        reference=reference,
        n_seeds=diff.n_seeds,
        variant_mean=float(ma.mean()),
        reference_mean=float(mb.mean()),
        delta=diff.delta,
        low=diff.low,
        high=diff.high,
        # one seed pair gives 0, 0.5 or 1: no probability (NaN, shown as -), as for the MDE below
        p_improvement=probability_of_improvement(ma, mb) if diff.n_seeds > 1 else float("nan"),
        iqm=q,
        iqm_low=lo,
        iqm_high=hi,
        mde=mde(diff.components) if diff.n_seeds > 1 else float("nan"),
        margin=margin,
        # one seed says nothing about training-seed variance: its interval covers problems only
        verdict=verdict(diff.low, diff.high, margin) if diff.n_seeds > 1 else "undecided",
        shares=diff.components.shares(),
    )


def decision_table(
    matrices: Mapping[str, ScoreMatrix],
    reference: str,
    *,
    margin: float = MARGIN,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    skip: Callable[[str], bool] = lambda name: False,
) -> list[Decision]:
    """Every method in ``matrices`` (except the reference and those ``skip`` names) against ``reference``."""
    if reference not in matrices:
        raise ValueError(f"reference {reference!r} is not among the compared methods: {', '.join(matrices)}")
    return [
        decide(
            m,
            matrices[reference],
            variant=name,
            reference=reference,
            margin=margin,
            n_resamples=n_resamples,
            seed=seed,
        )
        for name, m in matrices.items()
        if name != reference and not skip(name)
    ]


#: How to read a decision table, printed under every one; :func:`legend` fills in the margin and the seeds.
LEGEND = (
    "Δ = variant - reference, macro score in points (each dataset weighs the same), mean over {seeds} "
    "paired by seed and problem; 95% CI: two-level bootstrap-t (training seeds, then "
    "problems by dataset); P(A>B): probability of improvement over seed pairs; verdict: better/worse "
    "when the CI excludes 0, equivalent when it lies inside ±{margin:g} pt, else undecided; MDE: the "
    "smallest true Δ this design detects with 80% power."
)

#: Columns of a decision row that go to ``decisions.json`` and the leaderboard page.
PAGE_KEYS = (
    "variant",
    "reference",
    "n_seeds",
    "delta",
    "low",
    "high",
    "p_improvement",
    "verdict",
    "mde",
    "margin",
)


def format_decisions(decisions: pd.DataFrame) -> pd.DataFrame:
    """The decision rows as the printed table: points with one decimal, the CI as ``[low, high]``."""

    def pt(x: float) -> str:
        return "-" if not np.isfinite(x) else f"{100 * x:+.1f}"

    return pd.DataFrame(
        {
            "variant": decisions["variant"],
            "vs": decisions["reference"],
            "Δ (pt)": decisions["delta"].map(pt),
            "95% CI (pt)": [
                f"[{pt(lo)}, {pt(hi)}]" for lo, hi in zip(decisions["low"], decisions["high"], strict=True)
            ],
            "P(A>B)": decisions["p_improvement"].map(lambda x: "-" if not np.isfinite(x) else f"{x:.2f}"),
            "verdict": decisions["verdict"],
            "MDE (pt)": decisions["mde"].map(lambda x: "-" if not np.isfinite(x) else f"{100 * x:.1f}"),
            "seeds": decisions["n_seeds"].astype(int),
        }
    )


def jsonable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A decision row reduced to :data:`PAGE_KEYS`, NaN/inf as None (strict JSON)."""
    out: dict[str, Any] = {}
    for key in PAGE_KEYS:
        value = row.get(key)
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out


# ------------------------------------------------------------------------------- tables and files


def reference_of(variants: Sequence[str], reference: str | None = None) -> str:
    """The variant the others are compared with: ``reference`` when given (it must be a variant; ``sqrt``
    also names the ablation's ``srpo-sqrt``), else srpo (the algorithm comparison), else srpo-sqrt (the
    ablation's default normalisation), else the first."""
    if reference is not None:
        for name in (reference, f"srpo-{reference}"):
            if name in variants:
                return name
        raise ValueError(f"reference {reference!r} is not a compared variant: {', '.join(variants)}")
    return next((v for v in ("srpo", "srpo-sqrt", "sqrt") if v in variants), variants[0])


#: The start model's name in a comparison's samples: no variant, but what every variant's gain is measured from.
START = "start (SFT)"


def decision_frame(
    samples: Mapping[str, Mapping[int, pd.DataFrame]],
    reference: str | None = None,
    margin: float = MARGIN,
    skip: Sequence[str] = (START,),
    baseline: str | None = START,
) -> pd.DataFrame:
    """``method -> seed -> per-sample frame`` -> one :class:`Decision` row per method other than the
    reference (:func:`reference_of`), then, when ``samples`` holds ``baseline`` (the start model, evaluated
    with each training seed's eval seed), one row per method against it: what training gained, paired
    by eval seed and problem. ``skip`` and ``baseline`` are no variants. Empty when nothing to compare."""
    names = [n for n in samples if n not in skip and n != baseline]
    gains = baseline is not None and baseline in samples and bool(names)
    if len(names) < 2 and not gains:
        return pd.DataFrame()
    matrices = score_matrices({n: samples[n] for n in [*names, *([baseline] if gains else [])]})
    rows = (
        decision_table({n: matrices[n] for n in names}, reference_of(names, reference), margin=margin)
        if len(names) > 1
        else []
    )
    if gains:
        assert baseline is not None
        rows += [
            decide(matrices[n], matrices[baseline], variant=n, reference=baseline, margin=margin)
            for n in names
        ]
    return pd.DataFrame([d.row() for d in rows])


def write_decisions(decisions: pd.DataFrame, out: str | Path, title: str) -> dict[str, Path]:
    """``decisions.csv`` (every number) and ``decisions.md`` (the formatted table and how to read it)."""
    if decisions.empty:
        return {}

    out = Path(out)
    return {
        "decisions_csv": write_csv(decisions, out / "decisions.csv"),
        "decisions_md": atomic_write_text(out / "decisions.md", decisions_markdown(decisions, title)),
    }


def legend(decisions: pd.DataFrame) -> str:
    """How to read ``decisions``' rows (:data:`LEGEND`): the seed count is one number when every row
    has it, else the range and a pointer to the ``seeds`` column (rows merged from runs with different
    seed lists do not share one)."""
    counts = sorted({int(n) for n in decisions["n_seeds"]})
    seeds = (
        f"{counts[0]} training seed(s)"
        if len(counts) == 1
        else f"{counts[0]}-{counts[-1]} training seeds (each row's in its seeds column)"
    )
    return LEGEND.format(margin=100 * float(decisions.iloc[0]["margin"]), seeds=seeds)


def decisions_markdown(decisions: pd.DataFrame, title: str) -> str:
    """The decision table as markdown, with the margin, level and what MDE means spelled out."""

    parts = []
    for reference, rows in decisions.groupby("reference", sort=False):
        what = (
            f"what training gained over the {reference}"
            if reference == START
            else f"each variant vs {reference}"
        )
        parts.append(
            f"## {title}: {what}\n\n"
            + to_markdown(format_decisions(rows.reset_index(drop=True)))
            + "\n\n"
            + legend(rows)
            + "\n"
        )
    return "\n".join(parts)
