"""Tests for the leaderboards package: schema validation, store, markdown/HTML rendering, CLI."""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from leaderboards import render, schema, store
from leaderboards.cli import app
from leaderboards.schema import RecordValidationError, make_record, validate_record
from leaderboards.store import LeaderboardStore, StoreError

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def record(
    name: str = "srpo run",
    suite: str = "math",
    accs: tuple[float, float] = (0.5, 0.25),
    algorithm: str = "srpo",
    **kw: Any,
) -> schema.LeaderboardRecord:
    """A valid record over two datasets; fixed version/commit/date so hashes are reproducible."""
    metrics = {
        "gsm8k": {"avg@4": accs[0], "pass@4": min(1.0, accs[0] + 0.2), "team_tokens_per_problem": 1000.0},
        "math500": {"avg@4": accs[1], "pass@4": min(1.0, accs[1] + 0.2), "team_tokens_per_problem": 3000.0},
    }
    args: dict[str, Any] = {
        "suite": suite,
        "name": name,
        "metrics": metrics,
        "k": 4,
        "seeds": [0, 1, 2],
        "algorithm": algorithm,
        "workflow": "solver-verifier",
        "model_id": "Qwen/Qwen2.5-0.5B-Instruct",
        "config": {"lr": 1e-6, "group_size": 8},
        "dataset_sha256": {"gsm8k": H1, "math500": H2},
        "version": "0.1.0",
        "commit": "a" * 40,
        "date": "2025-03-01T12:00:00Z",
    }
    args.update(kw)
    return make_record(**args)


def good_dict() -> dict[str, Any]:
    return record().model_dump(mode="json")


# ----------------------------------------------------------------------------- valid records


def test_make_record_fills_hashes_and_macro() -> None:
    rec = record()
    assert rec.macro["avg@4"] == pytest.approx(0.375)
    assert rec.macro["team_tokens_per_problem"] == pytest.approx(2000.0)
    assert rec.record_hash == schema.compute_record_hash(rec)
    assert len(rec.record_hash) == 64
    assert rec.provenance.config_hash == schema.hash_config({"group_size": 8, "lr": 1e-6})  # key order
    # Hash covers content: a different name gives a different hash.
    assert record(name="other").record_hash != rec.record_hash
    # And is reproducible for the same content.
    assert record().record_hash == rec.record_hash


def test_make_record_hashes_files_and_provenance(tmp_path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights" * 1000)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text('{"q": 1}\n')
    rec = make_record(
        suite="math",
        metrics={"gsm8k": {"accuracy": 0.5}},
        k=1,
        seeds=[0],
        algorithm="grpo",
        workflow="proposers-aggregator",
        weights_path=weights,
        config_hash=H3,
        dataset_paths={"gsm8k": data},
        repo_dir=tmp_path,  # not a git repository
    )
    import hashlib

    assert rec.provenance.weights_sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert rec.provenance.dataset_sha256["gsm8k"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert rec.provenance.git_commit == "unknown"
    assert rec.provenance.model_id is None
    assert rec.name.startswith("grpo/weights:")
    assert rec.provenance.package_version == schema.package_version()
    assert schema.package_version("surely-not-an-installed-dist-xyz") == "unknown"
    with pytest.raises(ValueError, match="exactly one"):
        make_record(
            suite="m", metrics={"d": {"accuracy": 1.0}}, k=1, seeds=[0], algorithm="a", workflow="w",
            model_id="m", dataset_sha256={"d": H1},
        )  # fmt: skip


def test_make_record_reports_invalid_input() -> None:
    with pytest.raises(RecordValidationError) as info:
        record(accs=(1.5, 0.25))
    assert any("[0, 1]" in e for e in info.value.errors)


def test_json_round_trip_is_stable() -> None:
    rec = record()
    text = schema.dump_record_json(rec)
    assert text.endswith("}\n")
    assert json.loads(text) == schema.record_dict(rec)
    back = schema.parse_record_json(text)
    assert back == rec
    assert schema.dump_record_json(back) == text
    keys = list(json.loads(text))
    assert keys == sorted(keys)


def test_integer_metric_values_are_accepted_as_floats() -> None:
    d = good_dict()
    d["metrics"]["gsm8k"]["team_tokens_per_problem"] = 1000  # int in JSON is fine for a float field
    assert validate_record(d).record_hash == d["record_hash"]


# ----------------------------------------------------------------------------- invalid records


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        *parents, last = path.split("/")
        for p in parents:
            d = d[p]
        d[last] = value

    return mutate


def _del(path: str) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        *parents, last = path.split("/")
        for p in parents:
            d = d[p]
        del d[last]

    return mutate


def _tamper_consistently(d: dict) -> None:
    # Raise one score and the macro to match: internally consistent, but not what was hashed.
    d["metrics"]["gsm8k"]["avg@4"] = 0.9
    d["macro"]["avg@4"] = (0.9 + d["metrics"]["math500"]["avg@4"]) / 2


def _different_metric_sets(d: dict) -> None:
    del d["metrics"]["math500"]["pass@4"]


BAD_RECORDS = [
    # malformed
    ("missing top-level field", _del("suite"), "suite: missing required field"),
    (
        "missing provenance field",
        _del("provenance/algorithm"),
        "provenance.algorithm: missing required field",
    ),
    ("missing record_hash", _del("record_hash"), "record_hash: missing required field"),
    ("unknown field", _set("extra", 1), "extra: unknown field"),
    ("k wrong type (str)", _set("k", "4"), "k: Input should be a valid integer"),
    ("k wrong type (bool)", _set("k", True), "k: Input should be a valid integer"),
    ("seeds wrong type", _set("seeds", "0,1"), "seeds: Input should be a valid list"),
    (
        "metric wrong type",
        _set("metrics/gsm8k/avg@4", "0.5"),
        "metrics.gsm8k.avg@4: Input should be a valid number",
    ),
    (
        "metric NaN",
        _set("metrics/gsm8k/avg@4", math.nan),
        "metrics.gsm8k.avg@4: Input should be a finite number",
    ),
    (
        "macro inf",
        _set("macro/team_tokens_per_problem", math.inf),
        "macro.team_tokens_per_problem: Input should be a finite number",
    ),
    ("accuracy > 1", _set("metrics/gsm8k/avg@4", 1.2), "must be in [0, 1]"),
    ("accuracy < 0", _set("metrics/math500/pass@4", -0.1), "must be in [0, 1]"),
    ("negative tokens", _set("metrics/gsm8k/team_tokens_per_problem", -5.0), "must be non-negative"),
    ("bad dataset sha256", _set("provenance/dataset_sha256/gsm8k", "XYZ"), "not a sha256 hex digest"),
    ("uppercase sha256", _set("provenance/config_hash", "A" * 64), "not a sha256 hex digest"),
    ("short record hash", _set("record_hash", "abc123"), "record_hash: not a sha256 hex digest"),
    ("bad git commit", _set("provenance/git_commit", "HEAD"), "git commit must be"),
    ("bad date", _set("provenance/date", "yesterday"), "ISO 8601"),
    ("date in 2099", _set("provenance/date", "2099-01-01T00:00:00Z"), "is in the future"),
    ("date in 9999", _set("provenance/date", "9999-12-31T23:59:59"), "is in the future"),
    ("bad suite name", _set("suite", "../etc"), "invalid suite name"),
    ("control chars in name", _set("name", "a\nb"), "control characters"),
    ("empty name", _set("name", "  "), "non-empty"),
    ("no model identity", _set("provenance/model_id", None), "model_id or weights_sha256"),
    ("wrong schema version", _set("schema_version", 2), "schema_version"),
    # inconsistent
    ("macro inconsistent", _set("macro/avg@4", 0.5), "is not the mean over datasets"),
    ("macro missing metric", _del("macro/pass@4"), "macro must have exactly the dataset metrics"),
    ("datasets with different metrics", _different_metric_sets, "every dataset must report the same metrics"),
    ("dataset hash missing", _del("provenance/dataset_sha256/math500"), "must cover exactly the datasets"),
    ("empty seeds", _set("seeds", []), "seeds must list at least one seed"),
    ("duplicate seeds", _set("seeds", [1, 1]), "seeds must be distinct"),
    ("k = 0", _set("k", 0), "k must be >= 1"),
    ("no datasets", _set("metrics", {}), "metrics must contain at least one dataset"),
    # tampered
    ("tampered name", _set("name", "someone else"), "record_hash mismatch"),
    ("tampered score", _tamper_consistently, "record_hash mismatch"),
    ("tampered provenance", _set("provenance/workflow", "routed"), "record_hash mismatch"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [b[1:] for b in BAD_RECORDS], ids=[b[0] for b in BAD_RECORDS]
)
def test_validation_rejects(mutate: Callable[[dict], None], expected: str) -> None:
    d = good_dict()
    validate_record(copy.deepcopy(d))  # the base record is valid
    mutate(d)
    with pytest.raises(RecordValidationError) as info:
        validate_record(d, source="rec.json")
    errors = info.value.errors
    assert any(expected in e for e in errors), errors
    if "record_hash mismatch" not in expected:
        # Rejected for the stated reason, not merely because the hash no longer matches.
        assert not any("record_hash mismatch" in e for e in errors), errors
    assert str(info.value).startswith("rec.json: invalid leaderboard record")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"k": NaN}', "non-finite number NaN"),
        ('{"k": Infinity}', "non-finite number Infinity"),
        ('{"k": 1, "k": 2}', "duplicate JSON key 'k'"),
        ("[1, 2]", "record must be a JSON object"),
        ("{not json", "not valid record JSON"),
    ],
)
def test_json_level_rejections(text: str, expected: str) -> None:
    with pytest.raises(RecordValidationError) as info:
        schema.parse_record_json(text)
    assert any(expected in e for e in info.value.errors), info.value.errors


def test_nan_in_record_file_is_rejected(tmp_path) -> None:
    text = schema.dump_record_json(record()).replace('"avg@4": 0.5', '"avg@4": NaN', 1)
    assert "NaN" in text
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(RecordValidationError, match="NaN"):
        schema.load_record(path)


def test_macro_tolerance() -> None:
    d = good_dict()
    rec = record(macro={"avg@4": 0.375 + 5e-7, "pass@4": 0.575, "team_tokens_per_problem": 2000.0})
    assert rec.macro["avg@4"] != d["macro"]["avg@4"]  # accepted within 1e-6
    with pytest.raises(RecordValidationError, match="not the mean"):
        record(macro={"avg@4": 0.375 + 5e-6, "pass@4": 0.575, "team_tokens_per_problem": 2000.0})


# ----------------------------------------------------------------------------- store


def test_store_submit_round_trip(tmp_path) -> None:
    st = LeaderboardStore(tmp_path / "lb")
    recs = [record(), record(name="GRPO baseline", algorithm="grpo", accs=(0.4, 0.2)), record(suite="qa")]
    paths = [st.submit(r) for r in recs]
    for r, p in zip(recs, paths, strict=True):
        assert p.parent == (tmp_path / "lb").resolve()
        assert p.name == f"{store.slugify(r.suite + '-' + r.name)}-{r.record_hash[:12]}.json"
        text = p.read_text()
        assert text == json.dumps(schema.record_dict(r), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert paths[1].name.startswith("math-grpo-baseline-")
    assert st.submit(recs[0]) == paths[0]  # idempotent
    loaded = st.load_all()
    assert sorted(r.record_hash for r in loaded) == sorted(r.record_hash for r in recs)
    assert st.validate_all() == {p.name: [] for p in sorted(paths)}
    assert st.load(paths[0].name) == recs[0]
    assert st.load(paths[0].stem) == recs[0]  # ".json" optional
    assert store.load_all(tmp_path / "lb") == loaded
    # No stray temp files.
    assert sorted(p.name for p in (tmp_path / "lb").iterdir()) == sorted(p.name for p in paths)


def test_store_submit_rejects_invalid_dict(tmp_path) -> None:
    d = good_dict()
    d["k"] = 0
    with pytest.raises(RecordValidationError):
        store.submit(d, tmp_path / "lb")
    assert not (tmp_path / "lb").exists() or not list((tmp_path / "lb").iterdir())


def test_store_validate_all_reports_per_file(tmp_path) -> None:
    root = tmp_path / "lb"
    st = LeaderboardStore(root)
    good = st.submit(record())
    tampered = st.submit(record(name="to tamper"))
    data = json.loads(tampered.read_text())
    data["metrics"]["gsm8k"]["avg@4"] = 0.99
    data["macro"]["avg@4"] = (0.99 + 0.25) / 2
    tampered.write_text(json.dumps(data))
    renamed = root / "renamed-copy.json"
    renamed.write_text(good.read_text())
    (root / "Odd Name.json").write_text(good.read_text())
    (root / "garbage.json").write_text("{oops")
    (root / "README.md").write_text("ignored")
    report = st.validate_all()
    assert report[good.name] == []
    assert any("record_hash mismatch" in e for e in report[tampered.name])
    assert any("file name should be" in e for e in report["renamed-copy.json"])
    assert any("duplicate of" in e for e in report["renamed-copy.json"])
    assert any("unsafe record name" in e for e in report["Odd Name.json"])
    assert any("not valid record JSON" in e for e in report["garbage.json"])
    assert "README.md" not in report
    with pytest.raises(StoreError, match="record_hash mismatch"):
        st.load_all()
    assert [r.record_hash for r in st.load_all(strict=False)] == [record().record_hash]


@pytest.mark.parametrize(
    "name",
    [
        "../outside.json",
        "../../etc/passwd",
        "/etc/passwd",
        "sub/dir.json",
        "..",
        "a..b.json",
        "x\\y.json",
        "C:evil.json",
        "Upper.json",
        "has space.json",
        ".hidden.json",
        "nul\x00.json",
        "",
        "-leading-dash.json",
    ],
)
def test_store_rejects_unsafe_names(tmp_path, name: str) -> None:
    (tmp_path / "outside.json").write_text(schema.dump_record_json(record()))
    st = LeaderboardStore(tmp_path / "lb")
    (tmp_path / "lb").mkdir()
    with pytest.raises(StoreError, match="unsafe record name|non-empty"):
        st.load(name)


def test_store_rejects_symlink_escape(tmp_path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(schema.dump_record_json(record()))
    root = tmp_path / "lb"
    root.mkdir()
    os.symlink(outside, root / "link.json")
    with pytest.raises(StoreError, match="resolves outside the store"):
        LeaderboardStore(root).load("link.json")
    assert any("outside the store" in e for e in LeaderboardStore(root).validate_all()["link.json"])


def test_slugify() -> None:
    assert store.slugify("Math / SRPO v2 (Qwen)") == "math-srpo-v2-qwen"
    assert store.slugify("../../") == "record"
    assert len(store.slugify("x" * 500)) <= 80


# ----------------------------------------------------------------------------- render


def three_records() -> list[schema.LeaderboardRecord]:
    return [
        record(name="mid", accs=(0.5, 0.3)),  # macro 0.40
        record(name="best | pipe", accs=(0.6, 0.5), algorithm="grpo"),  # macro 0.55
        record(name="worst", accs=(0.7, 0.0), algorithm="mappo"),  # macro 0.35, best on gsm8k
        record(name="qa entry", suite="qa", accs=(0.2, 0.2)),
    ]


def _md_table(md: str, suite: str) -> list[list[str]]:
    lines = md.split("\n")
    start = lines.index(f"## {suite}")
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").replace("\\|", "\x00").split("|")]
            rows.append([c.replace("\x00", "\\|") for c in cells])
    return rows


def test_render_markdown() -> None:
    md = render.render_markdown(three_records())
    assert md.index("## math") < md.index("## qa")
    rows = _md_table(md, "math")
    header, body = rows[0], rows[2:]
    assert header[:5] == ["#", "Name", "Algorithm", "Model", "Workflow"]
    assert header[5:8] == ["gsm8k", "math500", "Macro avg@4"]
    assert [r[1] for r in body] == ["best \\| pipe", "mid", "worst"]  # macro descending, pipe escaped
    assert [r[0] for r in body] == ["1", "2", "3"]
    best = body[0]
    assert best[2] == "grpo" and best[5] == "0.6000" and best[6] == "0.5000" and best[7] == "0.5500"
    assert best[8] == "4" and best[9] == "3" and best[10] == "2025-03-01"
    assert all(len(r) == len(header) for r in rows)
    assert [r[1] for r in _md_table(md, "qa")[2:]] == ["qa entry"]
    assert "Ranked by macro `avg@4`" in md


def test_render_markdown_other_metric_and_empty() -> None:
    md = render.render_markdown(three_records(), metric="pass@4")
    body = _md_table(md, "math")[2:]
    # pass@4 = min(1, avg+0.2): mid (0.7,0.5)->0.6, best (0.8,0.7)->0.75, worst (0.9,0.2)->0.55
    assert [r[1] for r in body] == ["best \\| pipe", "mid", "worst"]
    assert body[1][7] == "0.6000"
    assert "No records." in render.render_markdown([])


def test_choose_metric_prefers_avg_at_k() -> None:
    assert render.choose_metric(three_records()) == "avg@4"
    rec = make_record(
        suite="s", metrics={"d": {"accuracy": 0.5, "f1": 0.4}}, k=1, seeds=[0], algorithm="a",
        workflow="w", model_id="m", config_hash=H1, dataset_sha256={"d": H2}, version="1", commit="unknown",
    )  # fmt: skip
    assert render.choose_metric([rec]) == "accuracy"


def test_render_html_static_and_escaped() -> None:
    evil = record(name='<script>alert("x")</script> & co', algorithm="<b>bold</b>")
    page = render.render_html([*three_records(), evil])
    assert page.startswith("<!DOCTYPE html>")
    lowered = page.lower()
    for needle in ("http://", "https://", "<link", " src=", "@import", "url("):
        assert needle not in lowered, needle
    assert "Content-Security-Policy" in page
    assert page.count("<script>") == 1  # only our own inline script
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert page.count('<table class="lb"') == 2
    assert 'data-suite="math"' in page and 'data-suite="qa"' in page


def test_write_leaderboard_files(tmp_path) -> None:
    paths = render.write_leaderboard(three_records(), tmp_path / "site")
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["leaderboard.html", "leaderboard.md"]
    assert paths["md"].read_text() == render.render_markdown(three_records())
    assert paths["html"].read_text() == render.render_html(three_records())


# ----------------------------------------------------------------------------- CLI


def test_cli_submit_validate_render(tmp_path) -> None:
    runner = CliRunner()
    lb = tmp_path / "lb"
    files = []
    for i, rec in enumerate(three_records()):
        f = tmp_path / f"in{i}.json"
        f.write_text(schema.dump_record_json(rec))
        files.append(f)
        res = runner.invoke(app, ["submit", str(f), "--store", str(lb)])
        assert res.exit_code == 0, res.output
        assert Path(res.stdout.strip()).exists()
    res = runner.invoke(app, ["validate", "--store", str(lb)])
    assert res.exit_code == 1 and "no per-sample evidence" in res.stderr  # evidence is required by default
    res = runner.invoke(app, ["validate", "--allow-missing-evidence", "--store", str(lb)])
    assert res.exit_code == 0, res.output
    assert "4 record(s) valid" in res.stdout
    res = runner.invoke(app, ["validate", "--allow-missing-evidence", *map(str, files)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "site"
    res = runner.invoke(app, ["render", "--store", str(lb), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "leaderboard.md").read_text() == render.render_markdown(store.load_all(lb))
    assert (out / "leaderboard.html").exists()


def test_cli_invalid_exits_nonzero(tmp_path) -> None:
    runner = CliRunner()
    lb = tmp_path / "lb"
    d = good_dict()
    d["seeds"] = []
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    res = runner.invoke(app, ["submit", str(bad), "--store", str(lb)])
    assert res.exit_code == 1
    assert "seeds must list at least one seed" in res.stderr
    good = tmp_path / "good.json"
    good.write_text(schema.dump_record_json(record()))
    res = runner.invoke(app, ["validate", "--allow-missing-evidence", str(good), str(bad)])
    assert res.exit_code == 1
    assert "1 of 2 record(s) invalid" in res.stderr and "ok: " in res.stdout
    # A tampered file inside the store fails validate and render; render lists it, leaves it off the
    # page it writes from the rest (issue 31), and exits 1.
    path = store.submit(record(), lb)
    path.write_text(path.read_text().replace('"srpo run"', '"someone else"'))
    res = runner.invoke(app, ["validate", "--store", str(lb)])
    assert res.exit_code == 1 and "record_hash mismatch" in res.stderr
    res = runner.invoke(app, ["render", "--store", str(lb), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "record_hash mismatch" in res.stderr and "skipped invalid" in res.stderr
    assert "someone else" not in (tmp_path / "o" / "leaderboard.md").read_text()
    res = runner.invoke(app, ["validate"])
    assert res.exit_code == 2


# ----------------------------------------------------------------------------- issue 12: trust
# Each test below fails on 646320c (checked by running it against that commit's leaderboards package).


def test_all_zero_dataset_hash_is_rejected() -> None:
    d = good_dict()
    d["provenance"]["dataset_sha256"]["gsm8k"] = "0" * 64
    with pytest.raises(RecordValidationError, match="all-zero sha256 is a placeholder"):
        validate_record(d)


@pytest.mark.parametrize(
    ("metric", "value", "expected"),
    [
        ("accuracy_strict", 42.0, "unknown metric name"),  # outside the old naming regex: was accepted
        ("accuracy_strict", 0.5, "unknown metric name"),
        ("Avg@4", 0.5, "unknown metric name"),
        ("utility", 2e6, "must be at most 1e+06"),
        ("n_problems", -1.0, "must be non-negative"),
        ("pass@4", 1.5, "must be in [0, 1]"),
    ],
)
def test_every_metric_is_range_checked_by_name(metric: str, value: float, expected: str) -> None:
    with pytest.raises(RecordValidationError) as info:
        record(metrics={"gsm8k": {metric: value}, "math500": {metric: value}})
    assert any(expected in e for e in info.value.errors), info.value.errors


def test_oversized_record_is_refused_before_parsing(tmp_path) -> None:
    """Finding: a valid 43 MB record with 330k datasets was accepted (1 GB RSS to submit and render).
    The size is checked before the file is read: refused in milliseconds, without reading 43 MB."""
    import time

    big = tmp_path / "big.json"
    d = good_dict()
    names = [f"dataset-{i:06d}" for i in range(330_000)]
    with big.open("w") as fh:  # streamed: the test itself never holds the 43 MB text
        fh.write('{"metrics": {' + ",".join(f'"{n}": {{"avg@4": 0.5}}' for n in names) + "},")
        fh.write('"macro": {"avg@4": 0.5}, "provenance": {"dataset_sha256": {')
        fh.write(",".join(f'"{n}": "{H1}"' for n in names) + "}, ")
        prov = {k: v for k, v in d["provenance"].items() if k != "dataset_sha256"}
        fh.write(json.dumps(prov)[1:] + ", ")
        rest = {k: v for k, v in d.items() if k not in ("metrics", "macro", "provenance")}
        fh.write(json.dumps(rest)[1:])
    assert big.stat().st_size > 35_000_000
    t0 = time.perf_counter()
    with pytest.raises(RecordValidationError, match="at most 1048576 are accepted"):
        schema.load_record(big)
    with pytest.raises(RecordValidationError, match="at most 1048576 are accepted"):
        schema.load_records(big)
    assert time.perf_counter() - t0 < 0.5
    res = CliRunner().invoke(app, ["validate", str(big)])
    assert res.exit_code == 1 and "at most 1048576" in res.stderr
    # a store file is refused the same way, and a big in-memory dict fails on counts, not after building
    lb = tmp_path / "lb"
    lb.mkdir()
    big.rename(lb / "big.json")
    assert "at most 1048576" in " ".join(LeaderboardStore(lb).validate_all()["big.json"])
    d["metrics"] = {f"d{i}": {"avg@4": 0.5} for i in range(330_000)}
    t0 = time.perf_counter()
    with pytest.raises(RecordValidationError, match="metrics has 330000 entries"):
        validate_record(d)
    assert time.perf_counter() - t0 < 0.5


def test_written_files_are_world_readable(tmp_path) -> None:
    """Finding: records were written mode 0600 (mkstemp's default); now 0644 whatever the umask."""
    old = os.umask(0o077)
    try:
        path = LeaderboardStore(tmp_path / "lb").submit(record())
        pages = render.write_leaderboard([record()], tmp_path / "site")
    finally:
        os.umask(old)
    for p in [path, *pages.values()]:
        assert oct(p.stat().st_mode & 0o777) == "0o644", p


def test_signatures_verify_and_show_on_the_page(tmp_path) -> None:
    from leaderboards import signing

    runner = CliRunner()
    key = tmp_path / "alice.pem"
    res = runner.invoke(app, ["keygen", "--out", str(key), "--key-id", "alice"])
    assert res.exit_code == 0, res.output
    assert oct(key.stat().st_mode & 0o777) == "0o600"  # a private key is not world-readable
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(res.stdout)
    signed_file, plain_file = tmp_path / "signed.json", tmp_path / "plain.json"
    signed_file.write_text(schema.dump_record_json(record()))
    plain_file.write_text(schema.dump_record_json(record(name="someone")))
    res = runner.invoke(app, ["sign", str(signed_file), "--key", str(key), "--key-id", "alice"])
    assert res.exit_code == 0, res.output
    signed = schema.load_record(signed_file)
    keys = signing.load_keys(keys_file)
    assert signed.record_hash == record().record_hash and signing.verify_signature(signed, keys)
    assert not signing.verify_signature(signed, {})  # unknown submitter
    forged = validate_record(
        {**signed.model_dump(mode="json"), "name": "x", "record_hash": record(name="x").record_hash}
    )
    assert not signing.verify_signature(forged, keys)  # the signature is of the other hash
    lb = tmp_path / "lb"
    for f in (signed_file, plain_file):
        assert runner.invoke(app, ["submit", str(f), "--store", str(lb)]).exit_code == 0
    res = runner.invoke(
        app, ["render", "--store", str(lb), "--out", str(tmp_path / "site"), "--keys", str(keys_file)]
    )
    assert res.exit_code == 0, res.output
    page = (tmp_path / "site" / "leaderboard.html").read_text()
    assert page.count('<span class="tag verified">verified</span>') == 1
    assert page.count('<span class="tag unverified">unverified</span>') == 1


def test_identical_scores_share_a_rank_and_partial_records_rank_apart() -> None:
    """Finding: three identical scores ranked 1, 2, 3."""
    same = [record(name=f"run {i}") for i in range(3)]
    (tab,) = render.suite_tables([*same, record(name="worse", accs=(0.1, 0.1))])
    assert tab.ranks == [1, 1, 1, 4]
    assert render.interval_ranks([(0.5, 0.1), (0.35, 0.06), (0.2, 0.0)]) == [1, 1, 3]
    assert render.interval_ranks([(0.5, 0.1), (0.35, 0.04), (None, 0.0)]) == [1, 2, None]
    evidence = {"samples_sha256": H3, "n_samples": 2 * 4 * 3, "samples_bytes": 10}
    partial = record(name="limit 1", accs=(0.9, 0.9), evidence={**evidence, "problems": {"gsm8k": 1, "math500": 1},
                     "suite_problems": {"gsm8k": 1, "math500": 500}})  # fmt: skip
    (tab,) = render.suite_tables([*same, partial])
    assert partial.partial and tab.rows == same and tab.partial == [partial] and tab.partial_ranks == [1]
    # a spread without evidence behind it does not buy a shared rank
    wide = {"avg@4": 0.9, "pass@4": 0.9, "team_tokens_per_problem": 0.0}
    (tab,) = render.suite_tables([*same, record(name="claims", accs=(0.1, 0.1), macro_std=wide)])
    assert tab.ranks == [1, 1, 1, 4]
    md = render.render_markdown(same)
    assert [
        line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ") and "run" in line
    ] == ["1"] * 3


def test_ranks_follow_the_paired_decisions_and_one_seed_never_ranks_strictly() -> None:
    """Issue 52: quick-search with one training seed ranked MAPPO 1, SRPO 2, GRPO 3 (0.332 / 0.328 /
    0.305, ± 0) while its decision table called every difference undecided."""
    evidence = {"samples_sha256": H3, "n_samples": 2 * 4, "samples_bytes": 10,
                "problems": {"gsm8k": 1, "math500": 1}, "suite_problems": {"gsm8k": 1, "math500": 1}}  # fmt: skip
    one = [
        record(name="mappo (m)", accs=(0.332, 0.332), seeds=[0], evidence=evidence),
        record(name="srpo (m)", accs=(0.328, 0.328), seeds=[0], evidence=evidence),
        record(name="grpo (m)", accs=(0.305, 0.305), seeds=[0], evidence=evidence),
    ]
    (tab,) = render.suite_tables(one)  # no decision table: one seed has no spread, no strict rank
    assert tab.ranks == [1, 1, 1]
    undecided = [{"variant": v, "reference": "srpo", "n_seeds": 1, "verdict": "undecided", "p_improvement": 1.0}
                 for v in ("grpo", "mappo")]  # fmt: skip
    (tab,) = render.suite_tables(one, decisions={"math": undecided})
    assert tab.ranks == [1, 1, 1]
    md = render.render_markdown(one, decisions={"math": undecided})
    assert "Every row has one training seed" in md
    assert [r[0] for r in _md_table(md, "math")[2:5]] == ["1", "1", "1"]
    assert "| grpo | srpo | — | \\[—, —\\] | — | undecided | — | 1 |" in md  # P(A>B) and MDE: —
    # ten seeds: a decided pair orders its rows, an undecided one ties them, one the table lacks ties too
    ten = [record(name=r.name, accs=(r.macro["avg@4"],) * 2, seeds=list(range(10))) for r in one]
    decided = [
        {"variant": "grpo", "reference": "srpo", "n_seeds": 10, "verdict": "worse"},
        {"variant": "mappo", "reference": "srpo", "n_seeds": 10, "verdict": "undecided"},
    ]
    (tab,) = render.suite_tables(ten, decisions={"math": decided})
    assert [r.name for r in tab.rows] == ["mappo (m)", "srpo (m)", "grpo (m)"] and tab.ranks == [1, 1, 2]
    # record hashes beat names (a submitted record may share a name)
    by_hash = [{**d, "variant_record": ten[2].record_hash, "reference_record": ten[0].record_hash} for d in decided[:1]]
    (tab,) = render.suite_tables(ten, decisions={"math": by_hash})
    # mappo (the reference by hash) above grpo; srpo, outside the table, by ten seeds' intervals (± 0 here)
    assert tab.ranks == [1, 2, 3]
    (tab,) = render.suite_tables(ten, decisions={"math": [{**by_hash[0], "verdict": "undecided"}]})
    assert tab.ranks == [1, 2, 2]  # the undecided pair ties; srpo still above grpo by the intervals
