"""Issue 31 (trust, round two): each test fails on e4b4839 and passes after.

1. ``reproduce`` re-generates chunks the author cannot predict (every stratum by default, a drawn seed
   with ``--max-chunks``) and states its detection probability; a forged record is caught.
2. The trainer never writes non-finite weights; a diverged run stops (exit 3); a junk resumed state is
   one line, before ``metrics.jsonl`` is touched.
3. One error boundary for ``srpo``: one line and a documented exit status; ``validate --store`` and
   ``render`` list a hostile record and go on.
4. Bounded checks: checkpoint sizes before hashes, JSON depth before parsing.
5. A moved run directory resumes; the grader's first answers carry no start-up work.
"""

from __future__ import annotations

import errno
import json
import math
import shutil
import time
from pathlib import Path

import pytest

from learners import checkpoint as ckpt
from learners import state_check
from learners.trainer import train
from srpo_cli.app import main
from tests._builders import checkpoint_run_config

CHECKPOINTS = Path(__file__).resolve().parents[2] / "agents" / "checkpoints"


def _srpo(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``srpo ARGS`` through :func:`srpo_cli.app.main` (the real entry point and its boundary)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (0 if code is None else int(code)), out, err


# ------------------------------------------------------------------------------ 1. reproduce sampling
def _grid(seeds: int, datasets: int, problems: int, k: int) -> list[dict]:
    return [
        {"seed": s, "dataset": f"d{d}", "task_index": t, "sample_idx": g}
        for s in range(seeds)
        for d in range(datasets)
        for t in range(problems)
        for g in range(k)
    ]


def test_plan_covers_every_stratum_and_states_its_detection_probability() -> None:
    from leaderboards.reproduction import detection_probability, draw_seed, plan_reproduction

    samples = _grid(seeds=2, datasets=2, problems=8, k=2)  # chunk 2: 2 x 2 x 4 = 16 strata of 4 samples
    plan = plan_reproduction(samples, chunk_size=2)
    assert plan.n_chunks == 16 and len(plan.chunks) == 16 and plan.every_stratum
    assert plan.compared_samples == plan.total_samples == 64
    assert plan.detection(0.01) == (1, 1.0)
    assert plan.summary()[0].startswith("every chunk is re-generated")
    assert "re-run this exact check with --seed" in plan_reproduction(samples, 2, max_chunks=3).summary()[0]
    # a budget: chunks drawn with a seed nobody could know in advance, the same again with that seed
    a, b = plan_reproduction(samples, 2, max_chunks=4), plan_reproduction(samples, 2, max_chunks=4)
    assert a.seed != b.seed and len(a.chunks) == 4
    assert plan_reproduction(samples, 2, max_chunks=4, seed=a.seed).chunks == a.chunks
    # hypergeometric over chunks, the forgery packed into as few chunks as it fits in:
    # 4 forged samples fill 1 of 16 chunks; drawing 4 finds it with probability 4/16
    assert detection_probability([4] * 16, 4, 4) == pytest.approx(0.25)
    missed = (14 * 13 * 12 * 11) / (16 * 15 * 14 * 13)  # 5 samples need 2 chunks; neither drawn
    assert detection_probability([4] * 16, 4, 5) == pytest.approx(1 - missed)
    assert detection_probability([4] * 16, 16, 1) == 1.0
    assert draw_seed() != draw_seed()


def _forge(record, sample_set, out_dir: Path, keys: set[tuple], gold: dict[int, str]):
    """The probe's forgery: the chosen samples made correct (gold answer, reward 1), then the evidence
    file, metrics, spreads and record hash recomputed with the project's own functions."""
    from leaderboards.evidence import recompute_metrics, write_samples
    from leaderboards.schema import compute_record_hash, record_dict, validate_record

    samples = []
    for s in sample_set.samples:
        s = dict(s)
        if (s["seed"], s["dataset"], s["task_index"], s["sample_idx"]) in keys:
            s.update(answer=gold[s["task_index"]], correct=True, reward=1.0)
        samples.append(s)
    header = {k: v for k, v in sample_set.header.items() if k != "format"}
    _, fields = write_samples(out_dir, header, samples)
    datasets = sorted(record.metrics)
    metrics, spread, _, macro_std = recompute_metrics(samples, record.k, record.seeds, datasets)
    data = record_dict(record)
    data["evidence"].update(fields)
    data["metrics"] = {ds: {m: metrics[ds][m] for m in record.metrics[ds]} for ds in datasets}
    data["metrics_std"] = {ds: {m: spread[ds][m] for m in record.metrics[ds]} for ds in datasets}
    data["macro"] = {
        m: math.fsum(data["metrics"][ds][m] for ds in datasets) / len(datasets) for m in record.macro
    }
    data["macro_std"] = {m: macro_std[m] for m in record.macro_std or {}}
    data["record_hash"] = compute_record_hash(data)
    return validate_record(data)


@pytest.mark.slow
def test_forged_record_in_unchecked_chunks_is_caught(tmp_path: Path, capsys) -> None:
    """The probe's attack on the real path: a genuine eval of the shipped tiny model, wrong samples
    rewritten only in chunks the old default (seed 0, --n 4) never re-generated. ``validate`` still
    passes it (the forgery is self-consistent); ``reproduce`` now re-generates every stratum and
    fails it, and with --max-chunks states how likely a miss was."""
    import random

    from agents.hf import HFPolicy
    from agents.policy import PolicyMap, SamplingParams
    from benchmarks.evaluate import evaluate
    from benchmarks.evidence import record_evidence
    from benchmarks.suites import get_suite
    from leaderboards.evidence import check_evidence, load_samples, samples_path
    from leaderboards.schema import dump_record_json
    from srpo_common import weights_sha256

    model = CHECKPOINTS / "mini-sft"
    result = evaluate(
        PolicyMap.shared(HFPolicy(str(model))),
        "quick-math",
        "proposers-aggregator",
        2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
        limit=8,
        seed=3,
        progress=False,
        chunk_size=1,
        datasets=["arith-d2"],
    )
    rec = result.to_record(
        "sft",
        model_id="mini-sft",
        weights_sha256=weights_sha256(model),
        **record_evidence([result], tmp_path),
    )
    assert rec.evidence is not None
    sample_set = load_samples(samples_path(tmp_path, rec.evidence.samples_sha256), rec.evidence)
    # what e4b4839's reproduce regenerated by default: 4 groups drawn with random.Random(0)
    groups = sorted({(s["seed"], s["dataset"], s["task_index"]) for s in sample_set.samples})
    old_checked = set(random.Random(0).sample(groups, 4))
    targets = {
        (s["seed"], s["dataset"], s["task_index"], s["sample_idx"])
        for s in sample_set.samples
        if not s["correct"] and (s["seed"], s["dataset"], s["task_index"]) not in old_checked
    }
    assert targets, "the tiny model should get some arith-d2 problem wrong"
    tasks = get_suite("quick-math").select(["arith-d2"]).datasets[0].load_tasks(8)
    gold = {i: str(t.answer) for i, t in enumerate(tasks)}
    forged_dir = tmp_path / "forged"
    forged = _forge(rec, sample_set, forged_dir, targets, gold)
    assert forged.macro["avg@2"] > rec.macro["avg@2"]
    path = forged_dir / "record.json"
    path.write_text(dump_record_json(forged))
    forged_set = load_samples(samples_path(forged_dir, forged.evidence.samples_sha256), forged.evidence)
    assert check_evidence(forged, forged_set) == []  # self-consistent: only re-generation can tell
    code, out, err = _srpo(["leaderboard", "reproduce", str(path), "--model", str(model)], capsys)
    assert code == 1, out + err
    assert "NOT reproduced" in err and "re-generating 8 of 8 chunks" in out
    assert "mismatch:" in err and "caught with probability >= 1.0000" in out


def test_page_says_how_many_samples_were_reproduced_with_which_seed(tmp_path: Path) -> None:
    """A note of ``reproduce --store`` shows as ``reproduced M/N (seed S)``; a note of e4b4839's
    predictable-seed check (no seed, no total) is no longer a green "reproduced"."""
    from leaderboards.cli import row_status
    from leaderboards.render import render_html
    from leaderboards.store import LeaderboardStore
    from tests.leaderboards.test_leaderboards import record

    lb = tmp_path / "lb"
    rec = record()
    LeaderboardStore(lb).submit(rec)
    note = lb / "reproduced" / f"{rec.record_hash}.json"
    note.parent.mkdir()
    note.write_text(json.dumps({"record_hash": rec.record_hash, "compared": 96, "matched": 96}))
    old = row_status(lb, [rec], None)[rec.record_hash]
    assert old == ["unverified", "checked 96 samples (predictable seed)"]
    fields = {"record_hash": rec.record_hash, "compared": 64, "matched": 64, "total": 256, "seed": 9871}
    note.write_text(json.dumps({**fields, "chunks": 2, "n_chunks": 8}))
    status = row_status(lb, [rec], None)
    assert status[rec.record_hash] == ["unverified", "reproduced 64/256 (seed 9871)"]
    page = render_html([rec], status=status)
    assert '<span class="tag reproduced">reproduced 64/256 (seed 9871)</span>' in page
    note.write_text(json.dumps({**fields, "compared": 256, "matched": 256, "chunks": 8, "n_chunks": 8}))
    assert row_status(lb, [rec], None)[rec.record_hash][1] == "reproduced 256/256 (all chunks)"


# ------------------------------------------------------------------------------ 2. non-finite training
def test_diverging_run_stops_with_exit_3_and_exports_nothing(
    tiny_model_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The probe's ``--lr 1000`` (rc 0, every exported parameter NaN on e4b4839), made deterministic:
    from the second iteration on every loss is NaN. Non-finite steps are skipped and counted, the run
    stops with one line and exit 3, the last (finite) checkpoint is kept and nothing is exported."""
    from learners import forward as forward_mod
    from learners import trainer as trainer_mod

    real, real_update = forward_mod.PolicyForward.policy_logprobs, trainer_mod.Trainer.update
    training = {"iteration": 0}

    def update(self, batch, iteration):
        training["iteration"] = iteration
        return real_update(self, batch, iteration)

    def diverge(self, rows, sub):
        lp, ent, ref = real(self, rows, sub)
        return (lp * float("nan") if training["iteration"] >= 2 else lp), ent, ref

    monkeypatch.setattr(trainer_mod.Trainer, "update", update)
    monkeypatch.setattr(forward_mod.PolicyForward, "policy_logprobs", diverge)
    run = tmp_path / "run"
    args = [
        "train", "--model", str(tiny_model_dir), "--out", str(run), "--iterations", "6",
        "--tasks-per-iter", "1", "--group-size", "2", "--epochs", "1", "--max-new-tokens", "6",
        "--eval-every", "0", "--save-every", "1", "--seed", "7", "--max-nonfinite-steps", "2",
    ]  # fmt: skip
    code, out, err = _srpo(args, capsys)
    assert code == 3, out + err
    last = err.strip().splitlines()[-1]  # the progress bar shares stderr (and this line)
    assert "error: training diverged: 2 optimizer steps in a row" in last and "Traceback" not in err
    assert not (run / "final").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["actor/nonfinite_steps"]) for r in rows] == [(1, 0.0), (2, 1.0)]
    state = ckpt.load_checkpoint(run)
    assert state["iteration"] == 2
    for tensors in state["models"].values():
        assert state_check.nonfinite_tensors(tensors) == []


def test_nonfinite_step_is_skipped_and_counted(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """One NaN loss: no optimizer step, ``actor/nonfinite_steps`` 1, the weights stay finite, and the
    run goes on (a streak shorter than max_nonfinite_steps)."""
    import torch

    from learners import forward as forward_mod
    from learners import trainer as trainer_mod

    calls = {"n": 0}
    real = forward_mod.PolicyForward.policy_logprobs

    def nan_once(self, rows, sub):
        lp, ent, ref = real(self, rows, sub)
        calls["n"] += 1
        return (lp * float("nan") if calls["n"] == 1 else lp), ent, ref

    monkeypatch.setattr(forward_mod.PolicyForward, "policy_logprobs", nan_once)
    history = train(checkpoint_run_config(tiny_model_dir, tmp_path / "run", iterations=2, save_every=0), log=None)
    assert [h["actor/nonfinite_steps"] for h in history] == [1.0, 0.0]
    model = trainer_mod.HFPolicy(str(tmp_path / "run" / "final")).model
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _edit_state(run: Path, edit) -> None:
    """Rewrite a checkpoint's state.json and recompute its manifest (what a forger can do)."""
    c = run / ckpt.CHECKPOINT_DIR
    state = json.loads((c / ckpt.STATE_FILE).read_text())
    edit(state)
    (c / ckpt.STATE_FILE).write_text(json.dumps(state))
    manifest = json.loads((c / ckpt.MANIFEST_FILE).read_text())
    for name in manifest["files"]:
        manifest["files"][name] = ckpt.sha256_file(c / name)
        if "sizes" in manifest:
            manifest["sizes"][name] = (c / name).stat().st_size
    (c / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda s: s.update(iteration=-1_000_000), "iteration must be an integer"),
        (lambda s: s.update(iteration="3"), "iteration must be an integer"),
        (lambda s: s["optimizer"]["param_groups"][0].update(lr=1e3), "exceeds the configured learning rate"),
        (lambda s: s["optimizer"]["param_groups"][0].update(lr={"$float": "nan"}), "lr must be a finite"),
        (lambda s: s["scheduler"].update(base_lrs=[1e3]), "scheduler/base_lrs"),
        (lambda s: s["rng"]["numpy"]["$tuple"].__setitem__(2, 10**9), "rng/numpy"),
        (
            lambda s: s["rng"]["numpy"]["$tuple"].__setitem__(
                1, {"$ndarray": {"dtype": "|O", "shape": [1], "data": [1]}}
            ),
            "object arrays are refused",
        ),
        (
            lambda s: s["rng"]["numpy"]["$tuple"].__setitem__(
                1, {"$ndarray": {"dtype": "<u4", "shape": [10**12], "data": [1]}}
            ),
            "$ndarray",
        ),
        (lambda s: s["rng"].update(python=[1, 2]), "rng/python"),
        # an asynchronous run's in-flight weights (checked with the rest, before anything is restored)
        (lambda s: s.update(async_snapshots={"x": 1}), "async_snapshots/x"),
        (lambda s: s.update(async_snapshots={"0": {"versions": [0], "models": {"model0": 1}}}), "async_snapshots/0/models"),
    ],
)
def test_junk_resume_state_is_one_line_and_leaves_metrics_alone(
    tiny_model_dir: Path, tmp_path: Path, edit, says: str
) -> None:
    run = tmp_path / "run"
    train(checkpoint_run_config(tiny_model_dir, run, iterations=1), log=None)
    metrics = (run / "metrics.jsonl").read_text()
    assert metrics
    _edit_state(run, edit)
    with pytest.raises(ckpt.CheckpointError, match=r"^[^\n]*$") as info:
        train(checkpoint_run_config(tiny_model_dir, run, iterations=1), resume=True, log=None)
    assert says in str(info.value)
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing trimmed before the check


# ------------------------------------------------------------------------------ 3. error boundary
def _deep_record(path: Path, depth: int = 100_000) -> Path:
    path.write_text('{"name": ' + "[" * depth + "]" * depth + "}")
    return path


def test_hostile_files_are_one_line_with_a_documented_status(tmp_path: Path, capsys) -> None:
    deep = _deep_record(tmp_path / "deep.json")
    code, out, err = _srpo(["leaderboard", "validate", str(deep)], capsys)
    assert code == 1 and "nests deeper than" in err and "Traceback" not in err
    code, out, err = _srpo(["leaderboard", "sign", str(deep), "--key", "k", "--key-id", "me"], capsys)
    assert code == 1 and "nests deeper than" in err and "Traceback" not in err
    code, out, err = _srpo(["train", "--model", "m", "--out", str(tmp_path), "--lr", "x"], capsys)
    assert code == 2 and "Traceback" not in err
    from srpo_cli.app import EXIT_CODES

    assert set(EXIT_CODES) >= {0, 1, 2, 3, 4, 70}


def test_validate_store_and_render_list_a_deep_record_and_go_on(tmp_path: Path, capsys) -> None:
    from leaderboards import store as store_mod
    from tests.leaderboards.test_leaderboards import record

    lb = tmp_path / "lb"
    good = store_mod.LeaderboardStore(lb).submit(record())
    _deep_record(lb / "deep-000000000000.json")
    args = ["leaderboard", "validate", "--store", str(lb), "--allow-missing-evidence"]
    code, out, err = _srpo(args, capsys)
    assert code == 1 and "deep-000000000000.json" in err and "nests deeper than" in err
    assert f"ok: {good}" in out and "Traceback" not in err
    args = ["leaderboard", "render", "--store", str(lb), "--out", str(tmp_path / "o")]
    code, out, err = _srpo(args, capsys)
    assert code == 1 and "skipped invalid" in err and "deep-000000000000.json" in err
    assert record().name in (tmp_path / "o" / "leaderboard.md").read_text()


def test_full_disk_is_one_line_exit_4(tmp_path: Path, capsys, monkeypatch) -> None:
    """``submit`` on a full disk (ENOSPC from the atomic write) and a safetensors write to /dev/full."""
    from leaderboards import schema
    from leaderboards import store as store_mod
    from tests.leaderboards.test_leaderboards import record

    def full(path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(store_mod, "atomic_write_text", full)
    rec = tmp_path / "r.json"
    rec.write_text(schema.dump_record_json(record()))
    code, out, err = _srpo(["leaderboard", "submit", str(rec), "--store", str(tmp_path / "lb")], capsys)
    assert code == 4 and err.startswith("error: disk full") and err.count("\n") == 1
    # ``srpo train`` on a full disk: safetensors raises its own error with the OS error in the text
    from safetensors import SafetensorError

    from srpo_cli.app import classify

    text = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left" })'
    code, line = classify(SafetensorError(text))
    assert code == 4 and line.startswith("error: disk full")


def test_debug_shows_the_traceback(tmp_path: Path, capsys, monkeypatch) -> None:
    from leaderboards import schema
    from leaderboards import store as store_mod
    from tests.leaderboards.test_leaderboards import record

    def broken(path, *a, **k):
        raise KeyError("boom")  # an unexpected exception: a bug, exit 70

    monkeypatch.setattr(store_mod, "atomic_write_text", broken)
    rec = tmp_path / "r.json"
    rec.write_text(schema.dump_record_json(record()))
    args = ["leaderboard", "submit", str(rec), "--store", str(tmp_path / "lb")]
    code, _, err = _srpo(args, capsys)
    assert code == 70 and err.startswith("internal error: KeyError") and "Traceback" not in err
    code, _, err = _srpo([*args, "--debug"], capsys)
    assert code == 70 and "Traceback" in err and "boom" in err
    from srpo_cli.app import classify

    assert classify(RecursionError("x"))[0] == 2


# ------------------------------------------------------------------------------ 4. bounded checks
def test_sparse_tensor_file_is_refused_before_hashing(tmp_path: Path, monkeypatch) -> None:
    """A 64 GB sparse tensors.safetensors: refused by size at once, never hashed (e4b4839 hashed it
    for 129 s). Also for a manifest without sizes (older checkpoints): the safetensors header decides."""
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, {"iteration": 1, "w": __import__("torch").ones(4)})
    target = run / ckpt.CHECKPOINT_DIR / ckpt.TENSORS_FILE
    with target.open("r+b") as fh:
        fh.truncate(64 << 30)
    hashed: list[Path] = []
    monkeypatch.setattr(ckpt, "sha256_file", lambda p, *a: hashed.append(Path(p)) or "0" * 64)
    t0 = time.monotonic()
    with pytest.raises(ckpt.CheckpointError, match="bytes, the manifest says"):
        ckpt.load_checkpoint(run)
    manifest_path = run / ckpt.CHECKPOINT_DIR / ckpt.MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    del manifest["sizes"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CheckpointError, match="safetensors header describes"):
        ckpt.load_checkpoint(run)
    assert hashed == [] and time.monotonic() - t0 < 5


def test_json_depth_is_measured_without_recursion() -> None:
    from leaderboards.schema import RecordValidationError, parse_record_json
    from srpo_common.jsonsafe import JSONDepthError, json_depth, loads_bounded

    assert json_depth('{"a": [1, {"b": "[[[["}]}') == 3
    assert json_depth("]]]]\n[[[[[") == 5  # stray closers cannot hide a deep line
    with pytest.raises(JSONDepthError):
        loads_bounded("[" * 1_000_000)
    with pytest.raises(RecordValidationError, match="nests deeper"):
        parse_record_json("[" * 100_000 + "]" * 100_000)


# ------------------------------------------------------------------------------ 5. moved run, grader
def test_moved_run_directory_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """e4b4839: "checkpoint ... differs in ['out_dir']". The run directory is where, not what."""
    first, moved = tmp_path / "a", tmp_path / "b"
    train(checkpoint_run_config(tiny_model_dir, first, iterations=1), log=None)
    shutil.move(first, moved)
    logs: list[str] = []
    resumed = train(checkpoint_run_config(tiny_model_dir, moved, iterations=1), resume=True, log=logs.append)
    assert "resumed srpo from iteration 1" in logs
    assert [h["iteration"] for h in resumed] == [1]


def test_grader_first_answers_import_nothing() -> None:
    """The worker's warm-up covers every kind of answer whose first use imports more of sympy (on
    e4b4839 the first polynomial imported 17 sympy.physics.units modules on the answer's 2 s clock)."""
    from srpo_envs.grading import _Worker

    worker = _Worker()
    try:
        worker.wait_ready(120)
        for pred, gold in [
            ("x^3-1", "(x-1)(x^2+x+1)"),
            ("e^{2i\\pi}", "1"),
            ("[0,1)", "[0, 1)"),
            ("\\{3,4\\}", "\\{4,3\\}"),
            ("\\log_3 9", "2"),
            ("\\cos^2 x", "1-\\sin^2 x"),
            ("x \\ge 2", "x>=2"),
            ("\\begin{pmatrix}3\\\\4\\end{pmatrix}", "(3,4)"),
        ]:
            assert worker.ask(pred, gold, 30.0) is not None
            assert worker.last_imports == 0, (pred, worker.last_imports)
    finally:
        worker.kill()
