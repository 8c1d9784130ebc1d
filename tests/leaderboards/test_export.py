"""``srpo leaderboard export``: a validated record in the formats others read, each read back by the other
side's own package (Every Eval Ever's validator, ``huggingface_hub``'s ``.eval_results`` parser, lm-eval's
``make_table``); the exported numbers are the record's; a record whose evidence does not check out is
refused in one line unless ``--unverified`` is given.

The EEE validator and lm-eval live in venvs that ``install.sh`` builds (``.venvs/``; docs/publishing.md
says why EEE's runs on Python 3.11)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml
from huggingface_hub import parse_eval_result_entries
from typer.testing import CliRunner

from agents.policy import PolicyMap
from benchmarks.evaluate import evaluate
from benchmarks.evidence import record_evidence
from leaderboards.evidence import samples_path
from leaderboards.export import bootstrap_interval, eee_paths
from leaderboards.schema import dump_record_json, is_fraction_metric, make_record
from srpo_cli.app import app
from tests.benchmarks.test_benchmarks_evaluate import SAMPLING, ArithPolicy

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".venvs"


def _venv_python(name: str) -> Path:
    python = VENVS / name / "bin" / "python"
    assert python.is_file(), f"{python} is missing: run `bash install.sh` (it builds the tools' venvs)"
    return python


@pytest.fixture(scope="module")
def record_file(tmp_path_factory) -> Path:
    """A genuine record (quick-math, 3 problems per dataset, k=2, seeds 0 and 1) with its evidence."""
    out = tmp_path_factory.mktemp("record")
    results = [
        evaluate(
            PolicyMap.shared(ArithPolicy(p=0.5)), "quick-math", "proposers-aggregator", k=2, sampling=SAMPLING,
            progress=False, limit=3, chunk_size=4, seed=seed,
        )  # fmt: skip
        for seed in (0, 1)
    ]
    rec = make_record(
        suite="quick-math", k=2, algorithm="scripted", workflow="proposers-aggregator", model_id="arith-policy",
        config=results[0].run_info["config"], dataset_sha256=results[0].run_info["dataset_sha256"],
        **record_evidence(results, out),
    )  # fmt: skip
    path = out / "record.json"
    path.write_text(dump_record_json(rec))
    return path


def _export(record: Path, fmt: str, out: Path, *extra: str):
    return CliRunner().invoke(app, ["leaderboard", "export", str(record), "--format", fmt, "--out", str(out), *extra])


def test_eee_export_passes_every_eval_evers_own_validator(record_file: Path, tmp_path: Path) -> None:
    res = _export(record_file, "eee", tmp_path)
    assert res.exit_code == 0, res.output
    from leaderboards.schema import load_record

    rec = load_record(record_file)
    aggregate, instances = eee_paths(rec)
    assert (tmp_path / aggregate).is_file() and (tmp_path / instances).is_file()
    done = subprocess.run(
        [str(_venv_python("eee")), "-m", "every_eval_ever.validate", "--format", "json", aggregate, instances],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]  # 0 clean, 1 errors, 2 warnings only
    report = {Path(f["file"]).name: f for f in json.loads(done.stdout)}
    assert set(report) == {Path(aggregate).name, Path(instances).name}
    assert all(f["valid"] and not f["errors"] and not f["warnings"] for f in report.values()), report
    assert report[Path(instances).name]["line_count"] == rec.evidence.n_samples


def test_eee_numbers_are_the_records_with_their_intervals(record_file: Path, tmp_path: Path) -> None:
    """Every fraction metric of every dataset (and the macro mean) is one result whose score is the record's
    value exactly, with its std over seeds and a bootstrap interval around it; the instance lines are the
    evidence's samples; exporting twice writes the same bytes (the uuid comes from the record hash)."""
    from leaderboards.evidence import load_samples
    from leaderboards.schema import load_record

    rec = load_record(record_file)
    assert _export(record_file, "eee", tmp_path / "a").exit_code == 0
    assert _export(record_file, "eee", tmp_path / "b").exit_code == 0
    aggregate, instances = eee_paths(rec)
    for rel in (aggregate, instances):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    data = json.loads((tmp_path / "a" / aggregate).read_text())
    scores = {r["evaluation_result_id"]: r["score_details"] for r in data["evaluation_results"]}
    expected = {f"quick-math/{ds}/{m}": v for ds, ms in rec.metrics.items() for m, v in ms.items() if is_fraction_metric(m)}
    expected |= {f"quick-math/macro/{m}": v for m, v in rec.macro.items() if is_fraction_metric(m)}
    assert {k: v["score"] for k, v in scores.items()} == expected
    samples = load_samples(samples_path(record_file.parent, rec.evidence.samples_sha256), rec.evidence).samples
    for ds in rec.metrics:
        got = scores[f"quick-math/{ds}/avg@2"]
        ci = got["uncertainty"]["confidence_interval"]
        assert (ci["lower"], ci["upper"]) == bootstrap_interval(samples, ds, "avg@2", 2)
        assert ci["lower"] <= got["score"] <= ci["upper"]
        assert got["uncertainty"]["standard_deviation"] == rec.metrics_std[ds]["avg@2"]
        assert got["details"]["record_hash"] == rec.record_hash and got["details"]["algorithm"] == "scripted"
        assert json.loads(got["details"]["team"]) == {"*": "local/arith-policy"}
    lines = [json.loads(x) for x in (tmp_path / "a" / instances).read_text().splitlines()]
    assert len(lines) == rec.evidence.n_samples == data["detailed_evaluation_results"]["total_rows"]
    assert [x["evaluation"]["is_correct"] for x in lines] == [bool(s["correct"]) for s in samples]
    assert lines[0]["input"]["raw"] and lines[0]["input"]["reference"]  # the registered problem and its gold


def test_hf_eval_results_read_back_with_huggingface_hub(record_file: Path, tmp_path: Path) -> None:
    from leaderboards.schema import load_record

    rec = load_record(record_file)
    res = _export(record_file, "hf", tmp_path, "--source-url", "https://example.org/records/r.json")
    assert res.exit_code == 0, res.output
    entries = parse_eval_result_entries(yaml.safe_load((tmp_path / ".eval_results" / "quick-math.yaml").read_text()))
    assert {e.task_id: e.value for e in entries} == {ds: m["avg@2"] for ds, m in rec.metrics.items()}
    assert {e.dataset_id for e in entries} == {"srpo/quick-math"}
    assert {e.source_url for e in entries} == {"https://example.org/records/r.json"}
    assert all("partial: 6 of 115 problems" in e.notes and rec.record_hash[:12] in e.notes for e in entries)


def test_lm_eval_results_render_with_lm_evals_own_table(record_file: Path, tmp_path: Path) -> None:
    from leaderboards.schema import load_record

    rec = load_record(record_file)
    assert _export(record_file, "lm-eval", tmp_path).exit_code == 0
    (path,) = tmp_path.glob("results_*.json")
    data = json.loads(path.read_text())
    for ds, ms in rec.metrics.items():
        assert data["results"][f"quick-math_{ds}"]["avg@2,none"] == ms["avg@2"]
        assert math.isclose(data["results"][f"quick-math_{ds}"]["avg@2_stderr,none"], rec.metrics_std[ds]["avg@2"] / math.sqrt(2))
    assert data["groups"]["quick-math"]["avg@2,none"] == rec.macro["avg@2"]
    code = "import json,sys\nfrom lm_eval.utils import make_table\nd=json.load(open(sys.argv[1]))\nprint(make_table(d))\nprint(make_table(d, 'groups'))"
    done = subprocess.run([str(_venv_python("lm-eval")), "-c", code, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for ds, ms in rec.metrics.items():
        assert f"- {ds}" in done.stdout and f"{ms['avg@2']:.4f}" in done.stdout
    assert "|quick-math|" in done.stdout.replace(" ", "") or "quick-math" in done.stdout


def test_a_record_whose_evidence_does_not_check_out_is_refused_unless_asked(record_file: Path, tmp_path: Path) -> None:
    from leaderboards.schema import load_record

    rec = load_record(record_file)
    forged = tmp_path / "rec"
    (forged / "samples").mkdir(parents=True)
    (forged / "record.json").write_text(record_file.read_text())
    original = samples_path(record_file.parent, rec.evidence.samples_sha256).read_bytes()
    samples_path(forged, rec.evidence.samples_sha256).write_bytes(original.replace(b'"correct":false', b'"correct":true ', 1))
    res = _export(forged / "record.json", "eee", tmp_path / "out")
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and "is not verified" in res.output and "--unverified" in res.output
    assert not (tmp_path / "out").exists(), "a refused export wrote files"
    res = _export(forged / "record.json", "hf", tmp_path / "out", "--unverified")
    assert res.exit_code == 0, res.output
    assert "UNVERIFIED" in (tmp_path / "out" / ".eval_results" / "quick-math.yaml").read_text()
    bad = CliRunner().invoke(app, ["leaderboard", "export", str(record_file), "--format", "csv", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "eee, hf, lm-eval" in bad.output
