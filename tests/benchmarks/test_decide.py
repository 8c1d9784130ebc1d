"""benchmarks.decide on simulated runs with a known effect: interval coverage, what pairing buys, power.

Every statistical test here is also run on a deliberately broken variant (a resampler that drops the
training-seed level, one that resamples (seed, problem) cells as independent units, pairs that do not match) and must fail there: it would catch that bug. Simulations are
vectorised and seeded, so each test is deterministic and takes seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

from benchmarks import decide as D
from benchmarks.metrics import macro_row, per_dataset

S, N_PER_DATASET, N_DATASETS, K = 10, 32, 2, 4


def simulate(
    rng: np.random.Generator,
    *,
    delta: float = 0.03,
    seeds: int = S,
    n: int = N_PER_DATASET,
    tau_seed: float = 0.03,
    tau_shared: float = 0.03,
    tau_int: float = 0.05,
    tau_prob: float = 0.2,
) -> tuple[D.ScoreMatrix, D.ScoreMatrix]:
    """Two methods on the same problems and seeds. A problem's difficulty (``tau_prob``) and a seed's
    shared part (``tau_shared``: the common start model and eval seed) are common to both methods, so
    the runs are correlated; each method has its own seed effect and method x problem effect; each
    score is the mean of K Bernoulli samples. The population difference is ``delta``."""
    p_total = n * N_DATASETS
    base = np.clip(0.5 + rng.normal(0.0, tau_prob, p_total), 0.2, 0.8)
    shared = rng.normal(0.0, tau_shared, seeds)[:, None]
    datasets = np.repeat(np.array([f"d{i}" for i in range(N_DATASETS)]), n)
    problems = tuple((d, str(i)) for i, d in enumerate(datasets))

    def method(effect: float) -> D.ScoreMatrix:
        p = base + rng.normal(0.0, tau_int, p_total) + rng.normal(0.0, tau_seed, seeds)[:, None] + shared
        y = rng.binomial(K, np.clip(p + effect, 0.0, 1.0)) / K
        return D.ScoreMatrix(tuple(range(seeds)), datasets, problems, y, y * (1 - y) / (K - 1), K)

    return method(delta), method(0.0)


# ------------------------------------------------------------------- broken resamplers (must fail)


def _seed_level_dropped(d, strata, n_resamples, rng):  # noqa: ANN001, ANN202
    """Broken: the training-seed level forgotten -- every seed row replaced by the seed average, so
    only problems are resampled (as if the training seeds were fixed, not drawn)."""
    return D.two_level_bootstrap(
        np.repeat(d.mean(axis=0, keepdims=True), d.shape[0], axis=0), strata, n_resamples, rng
    )


def _iid_cells(d, strata, n_resamples, rng):  # noqa: ANN001, ANN202
    """Broken: every (seed, problem) cell resampled as an independent unit within its dataset -- the
    clustering by seed and by problem ignored (the mistake clustered standard errors exist for)."""
    t = np.zeros(n_resamples)
    v = np.zeros(n_resamples)
    var_hat = 0.0
    for idx in strata:
        cells = d[:, idx].ravel()
        m = cells.size
        counts = rng.multinomial(m, np.full(m, 1.0 / m), size=n_resamples)
        mean = counts @ cells / m
        t += mean / len(strata)
        v += np.maximum(counts @ cells**2 - m * mean**2, 0) / (m - 1) / (m * len(strata) ** 2)
        var_hat += cells.var(ddof=1) / (m * len(strata) ** 2)
    return t, np.sqrt(v), float(np.sqrt(var_hat))


def coverage(resampler: D.Resampler, sims: int = 300, truth: float = 0.03) -> tuple[float, float]:
    rng = np.random.default_rng(7)
    hits, widths = 0, []
    for i in range(sims):
        a, b = simulate(rng, delta=truth)
        r = D.paired_difference(a, b, n_resamples=1000, seed=i, resampler=resampler)
        hits += r.low <= truth <= r.high
        widths.append(r.high - r.low)
    return hits / sims, float(np.mean(widths))


@pytest.mark.parametrize(
    "resampler, correct",
    [(D.two_level_bootstrap, True), (_seed_level_dropped, False), (_iid_cells, False)],
    ids=["two-level", "broken:seed-level-dropped", "broken:iid-cells"],
)
def test_interval_covers_the_known_difference_95_percent_of_the_time(resampler, correct) -> None:  # noqa: ANN001
    sims = 300 if correct else 100  # a broken one misses by far more than 100 simulations can blur
    cov, _ = coverage(resampler, sims)
    within = 0.92 <= cov <= 0.98
    assert within is correct, f"coverage {cov:.3f} over {sims} simulations"


def _mismatched(b: D.ScoreMatrix, rng: np.random.Generator) -> D.ScoreMatrix:
    """Broken pairing: B's seeds rolled and its problems shuffled within each dataset."""
    perm = np.concatenate([rng.permutation(idx) for idx in D._strata(b.datasets)])
    y = np.roll(b.scores, 1, axis=0)[:, perm]
    return D.ScoreMatrix(b.seeds, b.datasets, b.problems, y, np.roll(b.within, 1, axis=0)[:, perm], b.k)


@pytest.mark.parametrize("broken", [False, True], ids=["paired", "broken:mismatched-pairs"])
def test_paired_interval_is_narrower_than_unpaired_when_runs_are_correlated(broken: bool) -> None:
    rng = np.random.default_rng(5)
    ratios = []
    for i in range(40):
        a, b = simulate(rng, tau_prob=0.2, tau_shared=0.05)
        pb = _mismatched(b, rng) if broken else b
        paired = D.paired_difference(a, pb, n_resamples=500, seed=i)
        unpaired = D.unpaired_difference(a, b, n_resamples=500, seed=i)
        ratios.append((paired.high - paired.low) / (unpaired.high - unpaired.low))
    assert (float(np.median(ratios)) < 0.8) is not broken, f"median width ratio {np.median(ratios):.2f}"


def test_uncorrelated_runs_gain_nothing_from_pairing() -> None:
    rng = np.random.default_rng(6)
    ratios = []
    for i in range(30):
        a, b = simulate(rng, tau_prob=0.0, tau_shared=0.0)
        paired = D.paired_difference(a, b, n_resamples=500, seed=i)
        unpaired = D.unpaired_difference(a, b, n_resamples=500, seed=i)
        ratios.append((paired.high - paired.low) / (unpaired.high - unpaired.low))
    assert 0.85 < float(np.median(ratios)) < 1.15


def _pilot_components() -> D.Components:
    """Components from a large pilot (200 seeds x 800 problems) of the same process."""
    a, b = simulate(np.random.default_rng(3), delta=0.0, seeds=200, n=400)
    return D.variance_components(a.scores - b.scores, a.datasets, a.within + b.within, k=K)


def test_variance_components_recover_the_simulated_ones() -> None:
    c = _pilot_components()
    assert c.seed == pytest.approx(2 * 0.03**2, rel=0.25)  # own seed effects; the shared one cancels
    for d in c.problem:
        assert c.problem[d] == pytest.approx(2 * 0.05**2, rel=0.25)
        assert c.residual[d] == pytest.approx(c.sampling[d], rel=0.05)  # no seed x problem term here
    assert sum(c.shares().values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "resampler, correct",
    [(D.two_level_bootstrap, True), (_seed_level_dropped, False)],
    ids=["two-level", "broken:seed-level-dropped"],
)
def test_power_prediction_matches_the_simulated_detection_rate(resampler, correct) -> None:  # noqa: ANN001
    comps = _pilot_components()
    design = {"seeds": S, "problems": N_PER_DATASET * N_DATASETS}
    mde = D.mde(comps, **design)
    assert D.power(mde, comps, **design) == pytest.approx(D.POWER, abs=1e-6)
    ok = []
    for delta in (0.5 * mde, mde):
        predicted = D.power(delta, comps, **design)
        rng = np.random.default_rng(11)
        sims = 300
        hits = 0
        for i in range(sims):
            a, b = simulate(rng, delta=delta)
            r = D.paired_difference(a, b, n_resamples=1000, seed=i, resampler=resampler)
            hits += (r.low > 0) or (r.high < 0)
        rate = hits / sims
        ok.append(abs(rate - predicted) <= 0.2 * predicted)
    assert all(ok) is correct, f"predicted vs simulated within 20%: {ok}"


def test_mde_and_seeds_needed_follow_the_design() -> None:
    comps = _pilot_components()
    m10, m40 = D.mde(comps, seeds=10), D.mde(comps, seeds=40)
    assert m40 < m10
    need = D.seeds_needed(m10, comps)
    assert need is not None and 8 <= need <= 11
    assert D.seeds_needed(1e-6, comps, max_seeds=50) is None
    table = D.power_table(comps, problems=[64, 256])
    assert list(table["problems"]) == [64, 256]
    assert table.loc[1, "MDE @ 10 seeds (pt)"] < table.loc[0, "MDE @ 10 seeds (pt)"]


def test_probability_of_improvement_and_iqm() -> None:
    assert D.probability_of_improvement([3, 4], [1, 2]) == 1.0
    assert D.probability_of_improvement([1, 2], [1, 2]) == 0.5  # ties count one half
    assert D.probability_of_improvement([1, 5], [2, 3]) == 0.5
    point, low, high = D.iqm([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 100.0])  # one diverged run
    assert point == pytest.approx(0.35) and low <= point <= high


def test_verdicts() -> None:
    assert D.verdict(0.01, 0.05, 0.02) == "better"
    assert D.verdict(-0.05, -0.01, 0.02) == "worse"
    assert D.verdict(-0.01, 0.015, 0.02) == "equivalent"
    assert D.verdict(-0.01, 0.05, 0.02) == "undecided"


def test_few_seeds_get_a_t_interval_not_a_degenerate_bootstrap() -> None:
    rng = np.random.default_rng(9)
    hits = 0
    for i in range(200):
        a, b = simulate(rng, seeds=3)
        r = D.paired_difference(a, b, n_resamples=200, seed=i)
        assert np.isfinite(r.low) and np.isfinite(r.high)
        hits += r.low <= 0.03 <= r.high
    assert hits / 200 >= 0.92


def test_legend_states_each_rows_seed_count_when_rows_differ() -> None:
    """Rows merged from runs with different seed lists (SRPO's five, GRPO's three) must not be read
    as all five: the legend states one count only when every row has it."""
    rng = np.random.default_rng(3)
    rows = [
        D.decide(*simulate(rng, seeds=s), variant=name, reference=D.START, n_resamples=200).row()
        for name, s in (("srpo", 5), ("grpo", 3))
    ]
    md = D.decisions_markdown(pd.DataFrame(rows), "t")
    assert "mean over 3-5 training seeds" in md and "5 training seed(s)" not in md
    one = D.decisions_markdown(pd.DataFrame(rows[:1]), "t")
    assert "mean over 5 training seed(s)" in one


def _samples(scores: Sequence[Sequence[int]], dataset_sizes: Sequence[int]) -> pd.DataFrame:
    rows = []
    p = 0
    for di, size in enumerate(dataset_sizes):
        for j in range(size):
            for s, c in enumerate(scores[p]):
                rows.append(
                    {
                        "dataset": f"ds{di}",
                        "problem_id": f"q{j}",
                        "sample_idx": s,
                        "correct": bool(c),
                        "team_tokens": 1.0,
                        "tool_calls": 0.0,
                    }
                )
            p += 1
    return pd.DataFrame(rows)


def test_score_matrices_from_sample_tables() -> None:
    a0 = _samples([[1, 1], [0, 1], [0, 0]], [2, 1])
    a1 = _samples([[1, 0], [0, 0], [1, 1]], [2, 1])
    b0 = _samples([[0, 0], [0, 1], [0, 0]], [2, 1])
    b1 = _samples([[1, 0], [0, 0], [0, 1]], [2, 1])
    m = D.score_matrices({"A": {0: a0, 1: a1}, "B": {1: b1, 0: b0}})
    assert m["A"].seeds == (0, 1) and m["A"].k == 2
    expected = macro_row(per_dataset(a0))["avg@k"]
    assert m["A"].macro[0] == pytest.approx(expected)
    diff = D.paired_difference(m["A"], m["B"], n_resamples=200)
    assert diff.delta == pytest.approx(float((m["A"].macro - m["B"].macro).mean()))
    other = _samples([[1, 1], [0, 1], [0, 0]], [3])  # other problems: refused, not intersected
    with pytest.raises(ValueError, match="other problems"):
        D.score_matrices({"A": {0: a0}, "B": {0: other}})


def _saved_run(root, method: str, seed: int, p_correct: float) -> None:  # noqa: ANN001
    """An eval directory as ``EvalResult.save`` writes it (eval.json + per-sample parquet)."""
    import json

    rng = np.random.default_rng(seed * 100 + int(p_correct * 10))
    rows = [
        {
            "dataset": ds,
            "problem_id": f"{ds}-{p}",
            "sample_idx": g,
            "correct": bool(rng.random() < p_correct),
            "team_tokens": 10.0,
            "tool_calls": 0.0,
            "ks": [2, 1],
            "inputs": 2,
            "inputs_truncated": 0,
        }
        for ds in ("d1", "d2")
        for p in range(20)
        for g in range(4)
    ]
    out = root / method / f"seed{seed}"
    out.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(out / "eval_samples.parquet")
    info = {"method": method, "config": {"seed": seed, "datasets": [{"name": "d1"}, {"name": "d2"}]}}
    summary = {
        "suite": "quick-math",
        "workflow": "proposers-aggregator",
        "k": 4,
        "datasets": {},
        "run_info": info,
    }
    (out / "eval.json").write_text(json.dumps(summary))


def test_bench_report_writes_decisions(tmp_path) -> None:  # noqa: ANN001
    """`srpo bench report` decides every method against the reference from saved per-sample records."""
    from typer.testing import CliRunner

    from benchmarks.cli import app

    for seed in range(5):
        _saved_run(tmp_path, "srpo", seed, 0.3)
        _saved_run(tmp_path, "grpo", seed, 0.8)  # far better: the interval must exclude 0
        _saved_run(tmp_path, "start (SFT)", seed, 0.1)  # no variant: what each variant gained from
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(tmp_path / "rep" / "decisions.csv")
    assert list(table["variant"][:1]) == ["grpo"] and list(table["reference"][:1]) == ["srpo"]
    assert table.loc[0, "verdict"] == "better" and table.loc[0, "low"] > 0.3
    # then what each gained over the start model, paired by eval seed and problem: srpo +0.2, grpo +0.7
    gains = table[table["reference"] == "start (SFT)"].set_index("variant")
    assert sorted(gains.index) == ["grpo", "srpo"] and len(table) == 3
    assert set(gains["verdict"]) == {"better"}
    for name, truth in (("srpo", 0.2), ("grpo", 0.7)):
        assert gains.loc[name, "low"] < truth < gains.loc[name, "high"]
    md = (tmp_path / "rep" / "decisions.md").read_text()
    assert "each variant vs srpo" in md and "what training gained over the start (SFT)" in md
    assert "decisions (each variant vs the method in 'vs')" in res.output and "better" in res.output
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--reference", "nope"])
    assert res.exit_code != 0 and "not a compared variant" in res.output


def test_bench_power_from_finished_runs(tmp_path) -> None:  # noqa: ANN001
    """`srpo bench power --from DIR`: the seeds x problems x k table from a finished comparison's evals."""
    from typer.testing import CliRunner

    from benchmarks.cli import app

    for seed in range(4):
        _saved_run(tmp_path / "evals", "srpo", seed, 0.5)
        _saved_run(tmp_path / "evals", "grpo", seed, 0.45)
    res = CliRunner().invoke(
        app, ["power", "--suite", "quick-math", "--from", str(tmp_path), "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    text = (tmp_path / "power.md").read_text()
    assert "Pilot: 4 training seeds x 40 problems x k=4" in text
    rows = [line for line in text.splitlines() if line.startswith("| 40 ") or line.startswith("| 115 ")]
    assert len(rows) == 2  # the pilot's 40 problems and the whole split (51 + 64), at k=4
    assert "seeds for Δ=5 pt" in text and "MDE @ 10 seeds (pt)" in text
    bad = CliRunner().invoke(app, ["power", "--from", str(tmp_path), "--variants", "srpo,mappo"])
    assert bad.exit_code != 0 and "no evals of ['mappo']" in bad.output
    one = tmp_path / "one"
    _saved_run(one / "evals", "srpo", 0, 0.5)
    _saved_run(one / "evals", "grpo", 0, 0.45)
    bad = CliRunner().invoke(app, ["power", "--suite", "quick-math", "--from", str(one), "--out", str(one)])
    assert bad.exit_code != 0 and "needsthesame>=2trainingseeds" in "".join(
        bad.output.replace("│", "").split()
    )


def test_tables_print_whole_when_stdout_is_not_a_terminal(capsys) -> None:  # noqa: ANN001
    """Issue 27: in a log file rich assumed 80 columns and cut every cell to "0.6…"; now the comparison
    table comes out whole (pytest's captured stdout is not a terminal)."""
    from types import SimpleNamespace

    from benchmarks.compare_cli import print_comparison

    table = pd.DataFrame(
        [
            {
                "variant": f"variant-with-a-long-name-{i}",
                **{f"dataset-{j} avg@4": "0.612 ± 0.044" for j in range(8)},
            }
            for i in range(3)
        ]
    )
    decisions = pd.DataFrame(
        [
            D.Decision(
                "grpo",
                "srpo",
                10,
                0.61,
                0.6,
                0.01,
                -0.005,
                0.025,
                0.6,
                0.61,
                0.6,
                0.62,
                0.027,
                0.02,
                "undecided",
            ).row()
        ]
    )
    print_comparison(SimpleNamespace(table=table, decisions=decisions), "a title")
    out = capsys.readouterr().out
    assert "…" not in out
    assert out.count("0.612 ± 0.044") == 24 and "variant-with-a-long-name-2" in out
    assert "[-0.5, +2.5]" in out and "undecided" in out and "a title: decisions" in out


def test_decision_runs_evaluate_the_whole_held_out_split_with_k_4() -> None:
    """Issue 27: a comparison meant to decide evaluates every held-out problem with k >= 4 by default
    (the design ``srpo bench power`` sizes); it fails if the decision eval falls back to bench quick's
    32-problem, k=2 sample."""
    from benchmarks import compare_cli
    from benchmarks.evidence import suite_problems
    from benchmarks.presets import DECISION_SEEDS

    for suite in DECISION_SEEDS:
        k, limit = compare_cli.eval_settings(suite, None, None)
        assert k >= 4, suite
        assert limit >= max(suite_problems(suite).values()), suite
    assert compare_cli.eval_settings("quick-columns", 2, 16) == (2, 16)  # options given beat the preset


def test_search_decision_runs_train_in_many_worlds_for_64_filtered_iterations(monkeypatch) -> None:  # noqa: ANN001
    """Issue 29: ``bench compare --suite quick-search`` trains where RL moved held-out accuracy (16 worlds
    no warm start or evaluation uses, dynamic sampling, 64 iterations); ``bench quick`` keeps its one
    world and budget. Fails if the decision settings stop reaching the comparison's config."""
    from typer.testing import CliRunner

    from benchmarks import cli, compare, presets
    from benchmarks.suites import QUICK_SEARCH_EVAL_KB_SEED
    from srpo_envs.tasks.knowledge_base import SFT_WORLD_SEED_BASE

    seen: list[compare.CompareConfig] = []

    def capture(cfg, log=None):  # noqa: ANN001, ANN202
        seen.append(cfg)
        raise RuntimeError("captured")

    monkeypatch.setattr(compare, "run_comparison", capture)
    model = str(presets.BUNDLED_SEARCH_WORLDS_MODEL)
    for command in ("compare", "ablation"):
        args = [command, "--suite", "quick-search", "--model", model, "--seeds", "0"]
        res = CliRunner().invoke(cli.app, args)
        assert isinstance(res.exception, RuntimeError) and "captured" in str(res.exception), res.output
        cfg = seen[-1]
        worlds = cfg.env_kwargs["kb_seed"]
        assert len(worlds) == 16 and QUICK_SEARCH_EVAL_KB_SEED not in worlds
        assert max(worlds) < SFT_WORLD_SEED_BASE
        assert cfg.train["filter_groups"] is True and cfg.train["iterations"] == 64
    assert presets.TRAINING_ENVS["quick-search"].env_kwargs["kb_seed"] == presets.QUICK_SEARCH_TRAIN_KB_SEED
    assert "filter_groups" not in presets.QUICK_SETTINGS["quick-search"]["train"]


def test_one_seed_pair_gives_no_probability_of_improvement_nor_mde() -> None:
    """Issue 52: with one training seed P(A>B) came out 0.00 or 1.00 from a single seed pair; it is
    undefined (NaN, printed "-") as the MDE is, and the verdict stays undecided."""
    a, b = simulate(np.random.default_rng(3), seeds=1, delta=0.2)
    d = D.decide(a, b, variant="a", reference="b", n_resamples=200)
    assert d.n_seeds == 1 and np.isnan(d.p_improvement) and np.isnan(d.mde) and d.verdict == "undecided"
    shown = D.format_decisions(pd.DataFrame([d.row()]))
    assert shown.loc[0, "P(A>B)"] == "-" and shown.loc[0, "MDE (pt)"] == "-"
    two = D.decide(*simulate(np.random.default_rng(3), seeds=2), variant="a", reference="b", n_resamples=200)
    assert 0.0 <= two.p_improvement <= 1.0
