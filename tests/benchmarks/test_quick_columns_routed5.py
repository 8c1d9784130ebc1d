"""quick-columns-routed5, the suite of the set-normalisation ablation: K reaches 5 in training and eval."""

from __future__ import annotations

import json

from benchmarks.presets import DECISION_EVAL, DECISION_SEEDS, QUICK_SETTINGS, TRAINING_ENVS
from benchmarks.suites import QUICK_COLUMNS_MAX_PROPOSERS, get_suite
from learners.presets import RECIPES

SUITE = "quick-columns-routed5"


def test_training_and_eval_envs_let_the_router_send_five() -> None:
    train = TRAINING_ENVS[SUITE]
    assert train.workflow == "routed" and train.env_kwargs["n_proposers"] == QUICK_COLUMNS_MAX_PROPOSERS == 5
    suite = get_suite(SUITE)
    assert suite.default_workflow == "routed"
    assert all(d.env_kwargs["n_proposers"] == 5 for d in suite.datasets)
    assert SUITE in QUICK_SETTINGS and SUITE in DECISION_SEEDS and SUITE in DECISION_EVAL


def test_the_warm_start_was_taught_routes_up_to_five() -> None:
    """mini-columns-sft never saw a route above 3 (and never sends one): the suite's warm start is the
    recipe whose last pass plays the routed workflow with five teacher proposers."""
    train = TRAINING_ENVS[SUITE]
    last = RECIPES[train.recipe][-1]
    assert last["n_proposers"] == 5 and "routed" in last["workflows"]
    report = json.loads((train.bundled_model / "sft_report.json").read_text())
    assert report["config"]["n_proposers"] == 5


def test_the_shipped_router_sends_more_than_three() -> None:
    import torch

    from agents.hf import HFPolicy
    from agents.policy import PolicyMap, SamplingParams
    from benchmarks.evaluate import evaluate

    torch.manual_seed(0)
    policy = PolicyMap.shared(HFPolicy(str(TRAINING_ENVS[SUITE].bundled_model)))
    res = evaluate(
        policy,
        SUITE,
        "routed",
        2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=48),
        limit=8,
        seed=0,
        progress=False,
    )
    hist = res.k_histogram().sum()
    assert int(hist[[k for k in hist.index if int(k) > 3]].sum()) > 0, hist


def test_bench_quick_finds_the_warm_start_option_of_every_suite() -> None:
    """`srpo bench quick --suites quick-columns-routed5` looked its recipe up in a table of four recipe
    names and died with KeyError: 'columns5'; every suite's recipe now maps to its family's option."""
    from pathlib import Path

    from benchmarks import presets
    from benchmarks.quick_cli import given_warm_start

    math, search, columns = Path("m"), Path("s"), Path("c")
    expected = {"quick-columns-routed5": columns, "quick-search-routed": search, "quick-math": math}
    for suite in presets.QUICK_SETTINGS:
        family = presets.TRAINING_ENVS[suite].recipe
        got = given_warm_start(family, math, search, columns)
        assert got == {"math": math, "search": search, "columns": columns, "gym": None}[family.split("-")[0].rstrip("5")]
        assert got == expected.get(suite, got)
