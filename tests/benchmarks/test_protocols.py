"""Issue 27 item 6: a suite run as defined is a full record. The main job evaluates each quick suite's
``bench-quick`` protocol (the first 32 problems of every dataset); its records are full records of
that protocol, ranked among themselves, not "Partial runs"; a record narrowed by the user stays partial,
and a protocol claim is checked against the registered suite like any coverage claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.evaluate import EvalResult
from benchmarks.suites import BENCH_QUICK_PROBLEMS, BENCH_QUICK_PROTOCOL
from leaderboards.render import render_html, render_markdown
from leaderboards.schema import compute_record_hash, dump_record_json, load_record, make_record, record_dict
from srpo_cli.app import app
from tests.benchmarks.test_benchmarks_evaluate import ArithPolicy
from tests.benchmarks.test_eval_evidence import _run as run_quick_math


def _run(limit: int, seed: int = 0) -> EvalResult:
    return run_quick_math(ArithPolicy(p=0.5), k=1, limit=limit, chunk_size=32, seed=seed)


def _record(out: Path, limit: int, name: str = "scripted") -> Path:
    from benchmarks.evidence import record_evidence

    results = [_run(limit, s) for s in (0, 1)]
    rec = make_record(
        suite="quick-math",
        k=1,
        name=name,
        algorithm="scripted",
        workflow="proposers-aggregator",
        model_id="arith-policy",
        config=results[0].run_info["config"],
        dataset_sha256=results[0].run_info["dataset_sha256"],
        **record_evidence(results, out),
    )
    path = out / f"{name}.json"
    path.write_text(dump_record_json(rec))
    return path


def _validate(*args: str):
    return CliRunner().invoke(app, ["leaderboard", "validate", *args])


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("protocol"), BENCH_QUICK_PROBLEMS)


def test_a_bench_quick_eval_is_a_full_record_of_its_protocol(quick) -> None:
    rec = load_record(quick)
    assert rec.evidence.protocol == BENCH_QUICK_PROTOCOL == "bench-quick"
    assert rec.evidence.suite_problems == {"arith-d1": 32, "arith-d2": 32} and not rec.partial
    res = _validate(str(quick))
    assert res.exit_code == 0, res.output
    assert "protocol bench-quick: 64 problems" in res.stdout and "PARTIAL" not in res.stdout


def test_a_narrowed_run_stays_partial_against_the_whole_suite(tmp_path) -> None:
    rec = load_record(_record(tmp_path, 5))
    assert rec.evidence.protocol is None and rec.partial
    assert rec.evidence.suite_problems == {"arith-d1": 51, "arith-d2": 64}


def _forge(path: Path, edit) -> Path:
    data = json.loads(path.read_text())
    edit(data["evidence"])
    data["record_hash"] = compute_record_hash(data)
    out = path.with_name("forged.json")
    out.write_text(json.dumps(data))
    return out


def test_a_false_protocol_claim_is_rejected(tmp_path) -> None:
    """A 5-problem run that calls itself the bench-quick protocol (suite_problems = what it evaluated)
    is caught against the registered protocol's size."""
    path = _record(tmp_path, 5)

    def claim(ev: dict) -> None:
        ev["protocol"] = "bench-quick"
        ev["suite_problems"] = dict(ev["problems"])

    forged = _forge(path, claim)
    assert not load_record(forged).partial
    res = _validate(str(forged))
    assert res.exit_code == 1 and "is not the registered protocol 'bench-quick'" in res.stderr


def test_an_unknown_protocol_is_rejected(quick) -> None:
    forged = _forge(quick, lambda ev: ev.update(protocol="made-up"))
    res = _validate(str(forged))
    assert res.exit_code == 1 and "has no protocol 'made-up'" in res.stderr


def test_records_without_a_protocol_keep_their_hash_and_file_form(tmp_path) -> None:
    rec = load_record(_record(tmp_path, 5))
    assert "protocol" not in record_dict(rec)["evidence"]
    data = record_dict(rec)
    data["evidence"]["protocol"] = None  # an explicit null hashes as the field left out
    assert compute_record_hash(data) == rec.record_hash


def test_the_page_ranks_protocol_records_apart_and_not_as_partial(tmp_path, quick) -> None:
    whole = load_record(_record(tmp_path, 64, name="whole-suite"))
    narrowed = load_record(_record(tmp_path, 5, name="narrowed"))
    assert whole.evidence.protocol is None and not whole.partial
    records = [load_record(quick), whole, narrowed]
    md = render_markdown(records)
    proto = md.index("### Protocol bench-quick (the first 32 problems of each dataset")
    partial = md.index("### Partial runs")
    assert (
        md.index("| whole-suite |")
        < proto
        < md.index("| scripted | scripted |")
        < partial
        < md.index("| narrowed |")
    )
    page = render_html(records)
    assert 'data-group="protocol-bench-quick"' in page and "of protocol bench-quick" in page
