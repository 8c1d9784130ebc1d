"""Aggregator input limits (and their truncation rate in the eval table), member cost, routed suites."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from agents.policy import Generation, GenerationRequest, SamplingParams
from benchmarks.evaluate import EvalResult, evaluate, print_table
from benchmarks.suites import SUITES, Suite, SuiteDataset
from srpo_envs.math_verify import MathVerifyEnv


class PaddedPolicy:
    """Proposers write a boxed answer plus a reasoning trace whose length varies with the request
    seed (100-900 characters); the router sends 1..3 proposers, also by seed."""

    policy_version = 1

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for r in requests:
            u = int(hashlib.sha256(str(r.sampling.seed).encode()).hexdigest()[:8], 16)
            if r.role == "router":
                text = f"\\boxed{{{1 + u % 3}}}"
            elif r.role == "aggregator":
                text = "\\boxed{0}"
            else:
                text = "step " * (20 + u % 160) + "\\boxed{0}"
            ids = list(range(len(text) // 8 + 1))
            out.append(Generation(text, ids, [-0.1] * len(ids), [1, 2], 1, "stop"))
        return out


def _suite(**env_kwargs) -> Suite:
    ds = SuiteDataset(
        "arith",
        "math",
        "procedural",
        split="test",
        limit=6,
        env_id="MathVerify-v0",
        env_kwargs={"difficulty": 1, "max_operand": 9, **env_kwargs},
    )
    return Suite("t-routed", (ds,), default_workflow="routed")


def _eval(**env_kwargs) -> EvalResult:
    return evaluate(
        PaddedPolicy(),
        _suite(**env_kwargs),
        "routed",
        3,
        sampling=SamplingParams(max_new_tokens=8),
        progress=False,
    )


def test_a_changed_candidate_limit_changes_the_truncation_rate() -> None:
    rates = {c: float(_eval(candidate_chars=c).table.loc["arith", "trunc_rate"]) for c in (50, 500, 5000)}
    assert rates[50] == 1.0 and rates[5000] == 0.0
    assert 0.0 < rates[500] < 1.0
    # every proposer output is one input of the aggregator
    res = _eval(candidate_chars=500)
    assert (res.samples["inputs"] == res.samples["ks"].map(max)).all()


def test_candidate_limit_cuts_what_the_aggregator_reads() -> None:
    env = MathVerifyEnv("proposers-aggregator", "procedural", difficulty=1, n_proposers=2, candidate_chars=30)
    env.reset(seed=0)
    long = "x" * 100 + " \\boxed{1}"
    _, _, _, _, infos = env.step({"proposer_0": long, "proposer_1": "\\boxed{2}"})
    assert env.events[-1].info["inputs_truncated"] == 1 and env.events[-1].info["inputs"] == 2
    obs = env._observe("aggregator")
    assert "x" * 30 + " [...]" in obs and "x" * 31 not in obs
    with pytest.raises(ValueError, match="tokenizer"):
        MathVerifyEnv("proposers-aggregator", "procedural", candidate_tokens=10)


def test_candidate_token_limit_uses_the_tokenizer() -> None:
    tok = str(Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-sft")
    env = MathVerifyEnv(
        "proposers-aggregator", "procedural", difficulty=1, n_proposers=1, candidate_tokens=5, tokenizer=tok
    )
    env.reset(seed=0)
    env.step({"proposer_0": "12 + 34 = 46 and then 46 + 1 = 47 so \\boxed{47}"})
    assert env.events[-1].info["inputs_truncated"] == 1
    assert env._observe("aggregator").count(" [...]") == 1


def test_member_cost_is_charged_per_proposer_sent() -> None:
    costs = {}
    for k in (1, 3):
        env = MathVerifyEnv("routed", "procedural", difficulty=1, n_proposers=3, member_cost=0.1)
        env.reset(seed=0)
        env.step({"router": f"\\boxed{{{k}}}"})
        gold = env.task.answer
        env.step({f"proposer_{i}": f"\\boxed{{{gold}}}" for i in range(k)})
        env.step({"aggregator": f"\\boxed{{{gold}}}"})
        assert env.outcome["correct"] is True
        costs[k] = env.outcome["reward"]
    assert costs == {1: pytest.approx(0.9), 3: pytest.approx(0.7)}
    with pytest.raises(ValueError, match="member_cost"):
        MathVerifyEnv("routed", "procedural", member_cost=-1)


def test_routed_eval_reports_mean_k_and_histogram(tmp_path: Path) -> None:
    res = _eval(member_cost=0.05)
    hist = res.k_histogram()
    assert set(hist.columns) <= {1, 2, 3} and int(hist.to_numpy().sum()) == 18
    mean_k = sum(k * n for k, n in hist.loc["arith"].items()) / 18
    assert res.table.loc["arith", "mean_k"] == pytest.approx(mean_k)
    assert (res.samples["reward"] <= 1 - 0.05 * res.samples["ks"].map(max) + 1e-9).all()
    paths = res.save(tmp_path)
    assert paths["k_histogram"].is_file()
    from rich.console import Console

    console = Console(record=True, width=200)
    print_table(res, console=console)
    text = console.export_text()
    assert "mean K" in text and "trunc" in text


def test_routed_suites_are_registered() -> None:
    for name, base in (
        ("math-routed", "math"),
        ("search-routed", "search"),
        ("quick-columns-routed", "quick-columns"),
    ):
        assert SUITES[name].default_workflow == "routed"
        assert SUITES[name].dataset_names == SUITES[base].dataset_names
        assert all(d.env_kwargs.get("member_cost", 0) > 0 for d in SUITES[name].datasets)


def test_search_member_cost_is_charged_per_searcher_per_search() -> None:
    from srpo_envs.search import MultiTurnSearchEnv

    env = MultiTurnSearchEnv("kb", workflow="routed", n_searchers=3, max_turns=2, member_cost=0.1)
    env.reset(seed=0, options={"task_index": 0})
    env.step({"router": "\\boxed{2}"})
    env.step({"searcher_0": "<search>a</search>", "searcher_1": "<search>b</search>"})
    env.step({"aggregator": f"<answer>{env.answer}</answer>"})
    assert env.outcome["correct"] is True and env.outcome["reward"] == pytest.approx(1 - 2 * 0.1)


def test_search_passage_limit_is_counted() -> None:
    from srpo_envs.search import MultiTurnSearchEnv

    cut = {}
    for chars in (10, 10_000):
        env = MultiTurnSearchEnv("kb", n_searchers=1, passage_chars=chars)
        env.reset(seed=0, options={"task_index": 0})
        env.step({"searcher_0": f"<search>{env.task.question}</search>"})
        info = env.events[-1].info
        assert info["inputs"] == env.top_k
        cut[chars] = info["inputs_truncated"]
    assert cut == {10: 3, 10_000: 0}
