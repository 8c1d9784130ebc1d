"""Issue 12 (trust): eval-cache corruption is detected, records carry re-checkable per-sample evidence,
``srpo leaderboard validate`` regrades it, ``reproduce`` re-generates samples.

Every test here fails on commit 646320c (before this work): there the cache had no checksum or
consistency check, records had no evidence, and ``validate`` only checked the record's own JSON.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.policy import PolicyMap, SamplingParams
from benchmarks.evaluate import EvalResult, evaluate
from leaderboards.evidence import load_samples, recompute_metrics, samples_path, write_samples
from leaderboards.schema import dump_record_json, load_record, make_record, validate_record
from srpo_cli.app import app
from tests.benchmarks.test_benchmarks_evaluate import SAMPLING, ArithPolicy

CHECKPOINTS = Path(__file__).resolve().parents[2] / "agents" / "checkpoints"


def _run(policy: ArithPolicy, **kwargs) -> EvalResult:
    args = {"k": 2, "sampling": SAMPLING, "progress": False, "limit": 4, "chunk_size": 4, "seed": 0}
    args.update(kwargs)
    return evaluate(PolicyMap.shared(policy), "quick-math", "proposers-aggregator", **args)


def _chunks(cache: Path) -> list[Path]:
    return sorted(cache.rglob("chunk-*.jsonl"))


def _edit_first_wrong(cache: Path, edit) -> Path:
    """Apply ``edit`` to the first record with correct == false; returns the edited chunk."""
    for chunk in _chunks(cache):
        rows = [json.loads(line) for line in chunk.read_text().splitlines()]
        for row in rows:
            if row["correct"] is False:
                edit(row)
                chunk.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
                return chunk
    raise AssertionError("no incorrect sample to edit")


# ------------------------------------------------------------------------------------------ eval cache


def test_edited_cache_is_detected_and_recomputed(tmp_path, caplog) -> None:
    """Finding: editing ``correct`` false -> true in a cache raised the reported Avg@k silently."""
    honest = _run(ArithPolicy(p=0.5), cache_dir=tmp_path)
    chunk = _edit_first_wrong(tmp_path, lambda r: r.update(correct=True))
    policy = ArithPolicy(p=0.5)
    with caplog.at_level(logging.WARNING, logger="benchmarks.evaluate"):
        again = _run(policy, cache_dir=tmp_path)
    assert again.macro["avg@k"] == honest.macro["avg@k"]  # the honest value, not the edited one
    assert policy.calls > 0 and again.run_info["runtime"]["chunks_rejected"] == 1
    assert any("checksum mismatch" in r.getMessage() and chunk.name in r.getMessage() for r in caplog.records)
    assert (
        _run(ArithPolicy(p=0.5), cache_dir=tmp_path).run_info["runtime"]["chunks_rejected"] == 0
    )  # repaired


def test_inconsistent_cached_record_is_rejected_even_with_a_valid_checksum(tmp_path, caplog) -> None:
    """Finding: a cached record with ``correct: true, reward: 0.0`` was accepted. The checksum is
    recomputed here (a buggy writer, not a flipped byte), so only the consistency check can catch it."""
    honest = _run(ArithPolicy(p=0.5), cache_dir=tmp_path)
    chunk = _edit_first_wrong(tmp_path, lambda r: r.update(correct=True, reward=0.0))
    import hashlib

    chunk.with_name(chunk.name + ".sha256").write_text(hashlib.sha256(chunk.read_bytes()).hexdigest() + "\n")
    with caplog.at_level(logging.WARNING, logger="benchmarks.evaluate"):
        again = _run(ArithPolicy(p=0.5), cache_dir=tmp_path)
    assert again.macro["avg@k"] == honest.macro["avg@k"]
    assert again.run_info["runtime"]["chunks_rejected"] == 1
    assert any("contradicts reward" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------ evidence


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> tuple[Path, object]:
    """A genuine record of a tiny (partial) quick-math eval over two seeds, with its evidence."""
    out = tmp_path_factory.mktemp("genuine")
    results = [_run(ArithPolicy(p=0.5), limit=3, seed=s) for s in (0, 1)]
    from benchmarks.evidence import record_evidence

    kwargs = record_evidence(results, out)
    rec = make_record(
        suite="quick-math",
        k=2,
        algorithm="scripted",
        workflow="proposers-aggregator",
        model_id="arith-policy",
        config=results[0].run_info["config"],
        dataset_sha256=results[0].run_info["dataset_sha256"],
        **kwargs,
    )
    path = out / "record.json"
    path.write_text(dump_record_json(rec))
    return path, rec


def _validate(*args: str):
    return CliRunner().invoke(app, ["leaderboard", "validate", *args])


def test_genuine_record_validates_and_is_marked_partial(genuine) -> None:
    path, rec = genuine
    assert rec.evidence.problems == {"arith-d1": 3, "arith-d2": 3} and rec.partial
    assert set(rec.metrics_std["arith-d1"]) == set(rec.metrics["arith-d1"])
    res = _validate(str(path))
    assert res.exit_code == 0, res.output
    assert "PARTIAL: 6 of 115 problems" in res.stdout
    assert "not regraded" not in res.stdout  # srpo_cli wired the real grader in
    assert oct(samples_path(path.parent, rec.evidence.samples_sha256).stat().st_mode & 0o777) == "0o644"


def _rewrite(path: Path, data: dict) -> Path:
    """Write ``data`` as a record with a *recomputed* hash: a forgery the hash alone cannot catch."""
    from leaderboards.schema import compute_record_hash

    data["record_hash"] = compute_record_hash(data)
    rec = validate_record(data)  # schema-valid
    out = path.with_name("forged.json")
    out.write_text(dump_record_json(rec))
    return out


def test_forged_metrics_are_rejected(genuine) -> None:
    """Finding: a record with edited metrics and a recomputed hash validated and ranked first."""
    path, rec = genuine
    data = rec.model_dump(mode="json")
    for ds in data["metrics"]:
        data["metrics"][ds]["avg@2"] = 1.0
    data["macro"]["avg@2"] = 1.0
    res = _validate(str(_rewrite(path, data)))
    assert res.exit_code == 1
    assert "metrics['arith-d1']['avg@2'] = 1.0, but the samples give" in res.stderr


def test_forged_samples_are_caught_by_regrading(genuine) -> None:
    """A consistent forgery -- samples flipped to correct, metrics recomputed from them, new sample
    sha256 and record hash -- passes every internal check; regrading the answers catches it."""
    path, rec = genuine
    ss = load_samples(samples_path(path.parent, rec.evidence.samples_sha256), rec.evidence)
    samples = [dict(s, correct=True, reward=1.0) for s in ss.samples]
    header = {k: v for k, v in ss.header.items() if k != "format"}
    _, fields = write_samples(path.parent, header, samples)
    metrics, spread, _, macro_std = recompute_metrics(samples, rec.k, rec.seeds, sorted(rec.metrics))
    data = rec.model_dump(mode="json")
    data["metrics"] = {d: {m: metrics[d][m] for m in vals} for d, vals in data["metrics"].items()}
    data["metrics_std"] = {d: {m: spread[d][m] for m in vals} for d, vals in data["metrics"].items()}
    data["macro"] = {m: sum(v[m] for v in data["metrics"].values()) / 2 for m in data["macro"]}
    data["macro_std"] = {m: macro_std[m] for m in data["macro"]}
    data["evidence"].update(fields)
    forged = _rewrite(path, data)
    assert CliRunner().invoke(app, ["leaderboard", "validate", "--no-regrade", str(forged)]).exit_code == 0
    res = _validate(str(forged))
    assert res.exit_code == 1
    assert "regrading gives correct=False" in res.stderr


def test_false_full_coverage_claim_is_rejected(genuine) -> None:
    """Finding: a ``--limit`` run looked like a full suite. Claiming the suite has only the evaluated
    problems is caught against the registered suite."""
    path, rec = genuine
    data = rec.model_dump(mode="json")
    data["evidence"]["suite_problems"] = dict(data["evidence"]["problems"])
    forged = _rewrite(path, data)
    assert not load_record(forged).partial
    res = _validate(str(forged))
    assert res.exit_code == 1 and "is not the registered suite 'quick-math'" in res.stderr


def test_wrong_dataset_hash_is_rejected(genuine) -> None:
    path, rec = genuine
    data = rec.model_dump(mode="json")
    data["provenance"]["dataset_sha256"]["arith-d1"] = "1" * 64
    res = _validate(str(_rewrite(path, data)))
    assert res.exit_code == 1 and "dataset_sha256 differs from the record's" in res.stderr


def test_missing_or_edited_sample_file_is_rejected(genuine, tmp_path) -> None:
    path, rec = genuine
    copy = tmp_path / "record.json"
    copy.write_text(path.read_text())
    res = _validate(str(copy))
    assert res.exit_code == 1 and "not found" in res.stderr
    src = samples_path(path.parent, rec.evidence.samples_sha256)
    dst = samples_path(tmp_path, rec.evidence.samples_sha256)
    dst.parent.mkdir()
    dst.write_bytes(src.read_bytes().replace(b'"correct":false', b'"correct":true ', 1))
    res = _validate(str(copy))
    assert res.exit_code == 1 and "does not match the record's" in res.stderr


# ------------------------------------------------------------------------------------------ reproduce


@pytest.mark.slow
def test_reproduce_a_tiny_genuine_eval(tmp_path) -> None:
    """``srpo leaderboard reproduce`` re-generates samples with the shipped tiny model: exact on CPU;
    a model with other weights is refused."""
    from agents.hf import HFPolicy
    from benchmarks.evidence import record_evidence
    from srpo_common import weights_sha256

    model = CHECKPOINTS / "mini-sft"
    result = evaluate(
        PolicyMap.shared(HFPolicy(str(model))),
        "quick-math",
        "proposers-aggregator",
        2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
        limit=1,
        seed=3,
        progress=False,
        chunk_size=1,
        datasets=["arith-d1"],
    )
    rec = result.to_record(
        "sft", model_id="mini-sft", weights_sha256=weights_sha256(model), **record_evidence([result], tmp_path)
    )
    path = tmp_path / "record.json"
    path.write_text(dump_record_json(rec))
    runner = CliRunner()
    res = runner.invoke(app, ["leaderboard", "reproduce", str(path), "--model", str(model), "--n", "1"])
    assert res.exit_code == 0, res.output
    assert "reproduced: 2 of 2 samples match exactly" in res.stdout
    other = CHECKPOINTS / "mini-columns-sft"
    res = runner.invoke(app, ["leaderboard", "reproduce", str(path), "--model", str(other)])
    assert res.exit_code == 1 and "is not the record's" in res.stderr


def test_bundled_dataset_hashes_are_registered() -> None:
    """``validate`` checks a record's dataset hash against a known sha256 per bundled dataset."""
    from benchmarks.evidence import BUNDLED_DATASET_SHA256, SuiteGrader
    from benchmarks.suites import SUITES

    bundled = {ds.dataset: ds for suite in SUITES.values() for ds in suite.datasets if not ds.generated}
    assert set(bundled) <= set(BUNDLED_DATASET_SHA256)
    for name, ds in bundled.items():
        assert ds.dataset_sha256() == BUNDLED_DATASET_SHA256[name], name
    grader = SuiteGrader()
    ids = [str(t.id) for t in SUITES["math"].datasets[1].load_tasks(2)]  # AIME24
    assert grader.check_dataset("math", "AIME24", BUNDLED_DATASET_SHA256["aime24"], ids) == []
    assert "is not the registered dataset's" in grader.check_dataset("math", "AIME24", "1" * 64, ids)[0]
    assert (
        "problem 0 is"
        in grader.check_dataset("math", "AIME24", BUNDLED_DATASET_SHA256["aime24"], ids[::-1])[0]
    )


def test_results_list_carries_its_evidence(genuine, tmp_path) -> None:
    """``bench quick`` writes one results.json for every suite: write_records copies each record's
    sample file beside it, so ``validate``/``reproduce`` work on that file directly."""
    from benchmarks.compare import write_records

    path, rec = genuine
    out = tmp_path / "quick"
    write_records(out, [rec], sample_dirs=[path.parent])
    assert samples_path(out, rec.evidence.samples_sha256).read_bytes() == (
        samples_path(path.parent, rec.evidence.samples_sha256).read_bytes()
    )
    res = _validate(str(out / "results.json"))
    assert res.exit_code == 0, res.output
    with pytest.raises(FileNotFoundError, match="evidence file of record"):
        write_records(tmp_path / "elsewhere", [rec])


def test_routed_suite_record_validates_with_member_costs(tmp_path) -> None:
    """A routed suite's datasets charge a per-member cost, so a sample's reward is 1 - cost x K (or
    -cost x K), not the graded 1/0: ``validate`` failed every genuine routed record (found on a
    `bench quick` record of quick-columns-routed) because only a user-passed member_cost counted."""
    from benchmarks.evidence import record_evidence

    result = evaluate(
        PolicyMap.shared(ArithPolicy(p=0.5)),
        "quick-columns-routed",
        "routed",
        k=2,
        sampling=SAMPLING,
        progress=False,
        limit=2,
        seed=0,
    )
    assert (result.samples["reward"] % 1 != 0).all()  # every reward carries the member cost
    rec = make_record(
        suite="quick-columns-routed",
        k=2,
        algorithm="scripted",
        workflow="routed",
        model_id="arith-policy",
        config=result.run_info["config"],
        dataset_sha256=result.run_info["dataset_sha256"],
        **record_evidence([result], tmp_path),
    )
    path = tmp_path / "record.json"
    path.write_text(dump_record_json(rec))
    res = _validate(str(path))
    assert res.exit_code == 0, res.output
    assert "not regraded" not in res.stdout
