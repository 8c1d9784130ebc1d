"""Eval runner and suites: record counts, metrics against the raw samples, cache resume, provenance."""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.policy import Generation, GenerationRequest, PolicyMap, SamplingParams
from benchmarks.evaluate import EvalResult, evaluate, print_table
from benchmarks.suites import SUITES, Suite, SuiteDataset, get_suite, tasks_sha256
from leaderboards.schema import validate_record

_PROBLEM = re.compile(r"Problem: Compute (.+?)\.\n")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _safe_eval(expr: str) -> int:
    """Integer + - * expressions only (what the procedural generator writes); anything else raises."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(f"unsupported expression {expr!r}")

    return ev(ast.parse(expr, mode="eval").body)


class ArithPolicy:
    """Proposers compute the answer and are right with probability ``p`` (a function of the request
    seed, so reruns agree); the aggregator takes the majority of the candidates' boxed answers."""

    def __init__(self, p: float = 0.6, fail_after: int | None = None, version: int = 1) -> None:
        self.p = p
        self.fail_after = fail_after
        self.policy_version = version
        self.calls = 0
        self.requests = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("simulated crash")
        self.calls += 1
        self.requests += len(requests)
        out = []
        for r in requests:
            obs = r.prompt if isinstance(r.prompt, str) else r.prompt[-1]["content"]
            if r.role == "router":
                text = "\\boxed{2}"
            elif r.role == "aggregator":
                votes = Counter(_BOXED.findall(obs.split("Candidate 1:", 1)[1]))
                text = f"Majority: \\boxed{{{votes.most_common(1)[0][0]}}}"
            else:
                truth = _safe_eval(_PROBLEM.search(obs).group(1))
                u = int(hashlib.sha256(str(r.sampling.seed).encode()).hexdigest()[:8], 16) / 2**32
                text = f"The answer is \\boxed{{{truth if u < self.p else truth + 1}}}."
            ids = [ord(c) for c in text]
            out.append(Generation(text, ids, [-0.1] * len(ids), [1, 2, 3], self.policy_version, "stop"))
        return out


SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=32)


def _run(policy: ArithPolicy, **kwargs) -> EvalResult:
    args = {"k": 4, "sampling": SAMPLING, "progress": False, "limit": 10, "chunk_size": 4}
    args.update(kwargs)
    return evaluate(PolicyMap.shared(policy), "quick-math", "proposers-aggregator", **args)


@pytest.fixture(scope="module")
def full_result() -> EvalResult:
    """The quick-math suite at its full size (all 51 one-digit difficulty-1 problems, 64 of difficulty 2), k=4."""
    return evaluate(
        PolicyMap.shared(ArithPolicy(p=0.5)),
        "quick-math",
        "proposers-aggregator",
        4,
        sampling=SAMPLING,
        progress=False,
    )


def test_sample_counts_and_metrics_match_raw_samples(full_result: EvalResult) -> None:
    res = full_result
    s = res.samples
    assert list(res.table.index) == ["arith-d1", "arith-d2"]
    for ds, n in (("arith-d1", 51), ("arith-d2", 64)):
        sub = s[s["dataset"] == ds]
        assert sub["problem_id"].nunique() == n == res.table.at[ds, "n_problems"]
        assert len(sub) == n * 4
        assert sorted(sub.groupby("problem_id")["sample_idx"].apply(sorted).iloc[0]) == [0, 1, 2, 3]
        per_problem = sub.groupby("problem_id")["correct"]
        assert res.table.at[ds, "avg@k"] == pytest.approx(per_problem.mean().mean())
        # with n == k samples, pass@k is "any sample correct"
        assert res.table.at[ds, "pass@4"] == pytest.approx(per_problem.any().mean())
        assert res.table.at[ds, "team_tokens_per_problem"] == pytest.approx(
            sub.groupby("problem_id")["team_tokens"].mean().mean()
        )
        assert (sub["ks"].map(list) == pd.Series([[3, 1]] * len(sub), index=sub.index)).all()
        assert (sub["reward"] == sub["correct"].astype(float)).all()
    # the scripted policy is right half the time: accuracy is informative, not 0 or 1
    assert res.table["avg@k"].min() > 0.1 and res.table["avg@k"].max() < 0.95
    assert (res.table["pass@4"] >= res.table["avg@k"]).all()
    for col in ("avg@k", "pass@4", "team_tokens_per_problem", "utility"):
        assert res.macro[col] == pytest.approx(res.table[col].mean())
    assert res.macro["n_samples"] == len(s)


@pytest.mark.parametrize(("p", "expected"), [(1.0, 1.0), (0.0, 0.0)])
def test_accuracy_follows_the_policy(p: float, expected: float) -> None:
    res = _run(ArithPolicy(p=p), limit=4)
    assert (res.table["avg@k"] == expected).all()
    assert (res.table["pass@4"] == expected).all()
    assert res.samples["correct"].mean() == expected


def test_cache_resume_after_interruption(tmp_path) -> None:
    # 2 datasets x 10 problems in chunks of 4 -> 3 chunks each; proposers-aggregator = 2 calls/chunk
    reference = ArithPolicy()
    ref = _run(reference)
    assert reference.calls == 12 and ref.run_info["runtime"]["chunks_cached"] == 0

    crashing = ArithPolicy(fail_after=5)  # chunks 1-2 of arith-d1 finish, chunk 3 dies mid-way
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(crashing, cache_dir=tmp_path)
    files = sorted(tmp_path.rglob("chunk-*.jsonl"))
    assert len(files) == 2

    resumed_policy = ArithPolicy()
    resumed = _run(resumed_policy, cache_dir=tmp_path)
    assert resumed_policy.calls == 8  # only the 4 missing chunks
    assert resumed.run_info["runtime"] == {**resumed.run_info["runtime"], "chunks": 6, "chunks_cached": 2}
    assert len(list(tmp_path.rglob("chunk-*.jsonl"))) == 6
    pd.testing.assert_frame_equal(resumed.samples, ref.samples)

    again = ArithPolicy()
    cached = _run(again, cache_dir=tmp_path)
    assert again.calls == 0 and again.requests == 0
    pd.testing.assert_frame_equal(cached.samples, ref.samples)
    pd.testing.assert_frame_equal(cached.table, ref.table)

    # a smaller limit reuses the first chunks; a different k or policy version is a different run
    smaller = ArithPolicy()
    _run(smaller, cache_dir=tmp_path, limit=8)
    assert smaller.calls == 0
    other_k = ArithPolicy()
    _run(other_k, cache_dir=tmp_path, k=2)
    assert other_k.calls == 12
    bumped = ArithPolicy(version=2)
    _run(bumped, cache_dir=tmp_path, limit=4)
    assert bumped.calls == 4


def test_corrupt_chunk_is_recomputed(tmp_path) -> None:
    _run(ArithPolicy(), cache_dir=tmp_path, limit=4)
    chunk = sorted(tmp_path.rglob("chunk-*.jsonl"))[0]
    chunk.write_text(chunk.read_text().splitlines()[0] + "\n")  # a truncated chunk
    policy = ArithPolicy()
    res = _run(policy, cache_dir=tmp_path, limit=4)
    assert policy.calls == 2 and len(res.samples) == 2 * 4 * 4
    assert len(chunk.read_text().splitlines()) == 16


def test_run_info_and_record(tmp_path) -> None:
    res = _run(ArithPolicy(), limit=6, seed=3)
    info = res.run_info
    suite = SUITES["quick-math"]
    for ds in suite.datasets:
        assert info["dataset_sha256"][ds.name] == tasks_sha256(ds.load_tasks(6))
    assert info["dataset_sha256"]["arith-d1"] != info["dataset_sha256"]["arith-d2"]
    cfg = info["config"]
    assert (cfg["suite"], cfg["workflow"], cfg["k"], cfg["limit"], cfg["seed"]) == (
        "quick-math",
        "proposers-aggregator",
        4,
        6,
        3,
    )
    assert cfg["sampling"]["temperature"] == 1.0 and cfg["n_problems"] == {"arith-d1": 6, "arith-d2": 6}
    assert cfg["datasets"][0]["env_kwargs"] == {"difficulty": 1, "max_operand": 9}
    assert set(info["seeds"]["collect_seeds"]) == {"arith-d1", "arith-d2"}
    assert info["policies"]["policy_versions"] == {"*": 1}
    assert info["package_version"] and info["git_commit"]
    assert info["corpus"] is None
    json.dumps(info)  # plain JSON

    record = res.to_record("scripted", model_id="arith-policy", date="2025-01-01T00:00:00Z")
    again = validate_record(record.model_dump(mode="json"))
    assert again.record_hash == record.record_hash
    assert set(record.metrics) == {"arith-d1", "arith-d2"}
    assert set(record.metrics["arith-d1"]) == {
        "avg@4",
        "pass@4",
        "team_tokens_per_problem",
        "tool_calls_per_problem",
        "utility",
    }
    assert record.metrics["arith-d2"]["avg@4"] == pytest.approx(res.table.at["arith-d2", "avg@k"])
    assert record.macro["avg@4"] == pytest.approx(res.macro["avg@k"])
    assert record.provenance.dataset_sha256 == info["dataset_sha256"]
    assert record.provenance.workflow == "proposers-aggregator" and record.seeds == [3]
    with pytest.raises(ValueError, match="model_id"):
        res.to_record("scripted")

    paths = res.save(tmp_path)
    summary = json.loads(paths["json"].read_text())
    assert summary["datasets"]["arith-d1"]["avg@k"] == pytest.approx(res.table.at["arith-d1", "avg@k"])
    back = pd.read_parquet(paths["parquet"])
    assert len(back) == len(res.samples) == len(pd.read_csv(paths["csv"]))
    assert list(back["ks"].iloc[0]) == list(res.samples["ks"].iloc[0])


def test_print_table_renders_every_dataset_and_macro() -> None:
    from rich.console import Console

    res = _run(ArithPolicy(), limit=3, k=2)
    console = Console(record=True, width=160)
    print_table(res, console=console)
    text = console.export_text()
    for name in ("arith-d1", "arith-d2", "macro", "pass@2", f"{res.table.at['arith-d1', 'avg@k']:.3f}"):
        assert name in text


def test_suites_are_well_formed() -> None:
    assert {"math", "search", "quick-math", "quick-search"} <= set(SUITES)
    math_suite = get_suite("math")
    assert math_suite.dataset_names == ("MATH500", "AIME24", "AIME25", "AMC23", "Minerva", "OlympiadBench")
    from srpo_envs.tasks.math_data import dataset_sha256

    aime = math_suite.datasets[1]
    assert aime.dataset_sha256() == dataset_sha256("aime24")
    tasks = aime.load_tasks(limit=5)
    env = aime.env_factory("solver-verifier", tasks)()
    assert [t.id for t in env.tasks] == [t.id for t in tasks] and env.workflow == "solver-verifier"
    # a smaller limit is a prefix of a larger one (what lets caches be shared across limits)
    d2 = get_suite("quick-math").datasets[1]
    assert [t.id for t in d2.load_tasks(5)] == [t.id for t in d2.load_tasks(20)][:5]
    assert all(t.meta["split"] == "test" and t.meta["difficulty"] == 2 for t in d2.load_tasks(5))
    # search datasets hash their bundled files without building the env or touching the corpus
    search = get_suite("search")
    assert search.dataset_names[0] == "nq" and len(search.datasets) == 7
    from srpo_envs.tasks.search_data import dataset_sha256 as qa_sha

    assert search.datasets[0].dataset_sha256() == qa_sha("nq")
    with pytest.raises(ValueError, match="does not apply"):
        evaluate(PolicyMap.shared(ArithPolicy()), "search", "proposers-aggregator", 2, sampling=SAMPLING)
    with pytest.raises(KeyError, match="unknown suite"):
        get_suite("nope")


def test_custom_suite_and_dataset_subset() -> None:
    suite = Suite(
        "tiny",
        (
            SuiteDataset("a", "math", "procedural", split="test", limit=3, env_id="MathVerify-v0"),
            SuiteDataset(
                "b",
                "math",
                "procedural",
                split="test",
                limit=2,
                env_id="MathVerify-v0",
                env_kwargs={"difficulty": 3},
            ),
        ),
    )
    policy = ArithPolicy(p=1.0)
    res = evaluate(
        PolicyMap.shared(policy), suite, "routed", 2, sampling=SAMPLING, progress=False, datasets=["b"]
    )
    assert list(res.table.index) == ["b"] and len(res.samples) == 2 * 2
    assert (res.samples["ks"].map(list).map(tuple) == (1, 2, 1)).all()  # route -> 2 proposers -> aggregate
    assert np.isclose(res.table.at["b", "avg@k"], res.samples["correct"].mean())


class SearchPolicy:
    """Searchers query the question; the aggregator answers with the title of the first passage shown."""

    policy_version = 0

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.calls += 1
        out = []
        for r in requests:
            obs = r.prompt if isinstance(r.prompt, str) else r.prompt[-1]["content"]
            if r.role == "searcher":
                text = f"<search>{obs.split('Question: ', 1)[1].splitlines()[0]}</search>"
            else:
                titles = re.findall(r"^\(([^)]*)\)", obs, flags=re.MULTILINE)
                text = f"<answer>{titles[0] if titles else 'unknown'}</answer>"
            ids = [ord(c) for c in text]
            out.append(Generation(text, ids, [-0.1] * len(ids), [1], 0, "stop"))
        return out


def test_quick_search_suite() -> None:
    pytest.importorskip("srpo_envs.search", reason="search env not importable yet", exc_type=ImportError)
    from benchmarks.suites import QUICK_SEARCH_EVAL_KB_SEED, _knowledge_base
    from srpo_envs.retrievers.base import Passage, Retriever

    passages, _ = _knowledge_base(QUICK_SEARCH_EVAL_KB_SEED, "all")  # the world the suite evaluates in

    class TitleRetriever(Retriever):
        """Passages whose title occurs in the query (no index, no JVM: fast and deterministic)."""

        name = "title"

        def search(self, queries: list[str], k: int) -> list[list[Passage]]:
            return [[p for p in passages if p.title in q][:k] for q in queries]

    res = evaluate(
        SearchPolicy(),
        "quick-search",
        "parallel",
        2,
        sampling=SAMPLING,
        limit=14,
        progress=False,
        env_kwargs={"retriever": TitleRetriever(), "max_turns": 1},
    )
    assert len(res.samples) == 14 * 2 and list(res.table.index) == ["kb"]
    # two searchers each send one query per episode
    assert (res.samples["tool_calls"] == 2).all() and res.table.at["kb", "tool_calls_per_problem"] == 2
    assert (res.samples["ks"].map(list).map(tuple) == (2, 1)).all()
    assert res.run_info["corpus"]["retriever"] == "TitleRetriever"
    ds = SUITES["quick-search"].datasets[0]
    assert res.run_info["dataset_sha256"]["kb"] == tasks_sha256(ds.load_tasks(14))
    assert all(t.meta["split"] == "test" for t in ds.load_tasks(14))
    record = res.to_record("scripted", model_id="search-policy")
    assert record.provenance.retriever == "TitleRetriever"
    # one round of queries that copy the question: the subject's passage (named in the question) is
    # found, a two-hop question's bridge passage is not
    hops = {t.id: int(t.meta["hops"]) for t in ds.load_tasks(14)}
    assert set(hops.values()) == {1, 2}
    expected = res.samples["problem_id"].map(lambda pid: 1.0 if hops[pid] == 1 else 0.5)
    assert (res.samples["evidence_recall"] == expected).all()
    one_hop_share = sum(h == 1 for h in hops.values()) / len(hops)
    assert res.table.at["kb", "evidence_rate"] == pytest.approx(one_hop_share)


def test_evidence_recall_is_undefined_without_gold_passages(full_result: EvalResult) -> None:
    """Math tasks name no gold passages: the column holds nulls and the table NaN, not 0."""
    assert full_result.samples["evidence_recall"].isna().all()
    assert full_result.table["evidence_rate"].isna().all()


@pytest.mark.parametrize(("recall", "rerolled"), [(0.5, 0), (1.5, 2), ("all", 2), (True, 2)])
def test_cached_evidence_recall_is_checked(tmp_path, recall: object, rerolled: int) -> None:
    """A cached record whose evidence_recall is a number in [0, 1] is reused; anything else makes the
    chunk untrustworthy, as a truncated one is (its episodes are rolled out again)."""
    _run(ArithPolicy(), cache_dir=tmp_path, limit=4)
    chunk = sorted(tmp_path.rglob("chunk-*.jsonl"))[0]
    records = [json.loads(line) for line in chunk.read_text().splitlines()]
    records[0]["evidence_recall"] = recall
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    chunk.write_text(data)
    chunk.with_name(chunk.name + ".sha256").write_text(hashlib.sha256(data.encode()).hexdigest() + "\n")
    policy = ArithPolicy()
    _run(policy, cache_dir=tmp_path, limit=4)
    assert policy.calls == rerolled


def test_cli_eval_writes_results_and_resumes(tmp_path, monkeypatch) -> None:
    import sys
    import types

    from typer.testing import CliRunner

    from benchmarks.cli import app
    from leaderboards.schema import load_record, sha256_file

    made: list[ArithPolicy] = []

    def fake_hf_policy(path: str, device: str | None = None) -> ArithPolicy:
        assert Path(path) == model_dir
        made.append(ArithPolicy(p=0.7))
        return made[-1]

    monkeypatch.setitem(sys.modules, "agents.hf", types.SimpleNamespace(HFPolicy=fake_hf_policy))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"not really weights")
    out = tmp_path / "out"
    args = ["eval", "--model", str(model_dir), "--k", "2", "--limit", "5", "--out", str(out)]
    args += ["--algorithm", "scripted", "--no-progress", "--chunk-size", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "arith-d1" in result.output and "macro" in result.output
    assert made[0].calls == 2 * 3 * 2  # 2 datasets x 3 chunks x 2 rounds
    summary = json.loads((out / "eval.json").read_text())
    assert summary["k"] == 2 and summary["run_info"]["config"]["limit"] == 5
    assert summary["run_info"]["model"]["weights_sha256"] == sha256_file(model_dir / "model.safetensors")
    samples = pd.read_parquet(out / "eval_samples.parquet")
    assert len(samples) == 2 * 5 * 2 and len(pd.read_csv(out / "eval_samples.csv")) == len(samples)
    record = load_record(out / "record.json")
    assert record.provenance.weights_sha256 == sha256_file(model_dir / "model.safetensors")
    assert record.provenance.model_id == "model" and record.k == 2
    assert record.metrics["arith-d1"]["avg@2"] == pytest.approx(summary["datasets"]["arith-d1"]["avg@k"])

    again = CliRunner().invoke(app, args)  # same command: everything comes from the cache
    assert again.exit_code == 0, again.output
    assert made[1].calls == 0
    (model_dir / "model.safetensors").write_bytes(b"new weights")  # new weights: new cache key
    third = CliRunner().invoke(app, args)
    assert third.exit_code == 0 and made[2].calls == 12

    bad = CliRunner().invoke(app, ["eval", "--model", str(model_dir), "--workflow", "parallel"])
    assert bad.exit_code != 0 and "does not apply" in bad.output


@pytest.mark.slow
def test_cli_eval_with_a_tiny_model(tmp_path) -> None:
    """End to end with a real (random-weights) transformers model: the shapes, not the accuracy."""
    from typer.testing import CliRunner

    from agents.tiny import fallback_corpus, init_tiny
    from benchmarks.cli import app

    init_tiny(tmp_path / "m", size="tiny", seed=0, corpus=fallback_corpus(300, seed=0), vocab_size=512)
    args = ["eval", "--model", str(tmp_path / "m"), "--k", "2", "--limit", "1", "--max-new-tokens", "4"]
    result = CliRunner().invoke(app, [*args, "--no-progress", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    samples = pd.read_parquet(tmp_path / "out" / "eval_samples.parquet")
    assert len(samples) == 2 * 1 * 2
    # 3 proposers + 1 aggregator, each at most 4 new tokens
    assert samples["team_tokens"].between(4, 16).all()
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["run_info"]["policies"][
        "policy_versions"
    ] == {"*": 0}


def test_results_do_not_depend_on_chunking(tmp_path) -> None:
    one = _run(ArithPolicy(), limit=6, chunk_size=6)
    policy = ArithPolicy()
    many = _run(policy, limit=6, chunk_size=1, cache_dir=tmp_path)
    pd.testing.assert_frame_equal(one.samples, many.samples)
    assert policy.calls == 2 * 6 * 2
    # other seeds give other samples (the seed reaches the policy)
    assert not _run(ArithPolicy(), limit=6, seed=1).samples["correct"].equals(one.samples["correct"])
