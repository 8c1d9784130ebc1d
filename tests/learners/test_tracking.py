"""``--logger``: every backend gets the numbers ``metrics.jsonl`` gets, read back with each tool's own reader.

The end-to-end test trains a tiny model for one iteration with ``--logger
console,jsonl,tensorboard,wandb,mlflow``, resumes it to two, then reads the W&B offline run (its
``.wandb`` transaction log, parsed into W&B's own protobuf records), the MLflow run (through
``MlflowClient``) and the TensorBoard event files (through TensorBoard's ``EventAccumulator``) and
compares every logged value with ``metrics.jsonl``. W&B and MLflow store float64, so their values are
compared exactly (bit-identical by design); TensorBoard stores float32, compared to float32 rounding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from learners.tracking import (
    TRACKERS,
    TrackerError,
    flatten_config,
    mlflow_key,
    open_trackers,
    parse_loggers,
    scalar_metrics,
)


# ------------------------------------------------------------------------------------------ unit tests
def _unboxed(text: str) -> str:
    """A typer error panel's text as one line (rich wraps it inside a box)."""
    return " ".join(text.replace("│", " ").split())


def test_unknown_logger_names_the_nearest() -> None:
    with pytest.raises(ValueError, match=r"unknown logger 'wandbb'; did you mean 'wandb'\?"):
        parse_loggers("console,wandbb")
    with pytest.raises(ValueError, match=r"unknown logger 'zzz' \(known: console, jsonl"):
        parse_loggers(["zzz"])
    assert parse_loggers(" console, mlflow,console,") == ("console", "mlflow")


def test_train_config_checks_logger_names() -> None:
    from learners.trainer import TrainConfig

    assert TrainConfig(model="m").logger == ("jsonl",)  # the default writes what it wrote before
    assert TrainConfig(model="m", logger=["wandb", "jsonl"]).logger == ("wandb", "jsonl")  # from a dict/file
    with pytest.raises(ValueError, match="did you mean 'mlflow'"):
        TrainConfig(model="m", logger="mlfow")


def test_cli_typo_is_a_usage_error() -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    result = CliRunner().invoke(app, ["train", "--model", "m", "--logger", "jsonl,wandbb"])
    assert result.exit_code == 2
    assert "did you mean 'wandb'?" in _unboxed(result.output)


def test_bench_compare_passes_logger_to_every_run() -> None:
    from typer.testing import CliRunner

    from benchmarks.compare_cli import with_logger
    from learners.trainer import TrainConfig
    from srpo_cli.app import app

    train = with_logger({"iterations": 2}, " console,mlflow")
    assert train == {"iterations": 2, "logger": "console,mlflow"}
    assert TrainConfig(model="m", **train).logger == ("console", "mlflow")  # as train_and_evaluate builds it
    assert with_logger({"iterations": 2}, None) == {"iterations": 2}  # not given: the config is unchanged
    for command in ("compare", "ablation"):
        result = CliRunner().invoke(app, ["bench", command, "--model", "m", "--logger", "tensorbord"])
        assert result.exit_code == 2
        assert "did you mean 'tensorboard'?" in _unboxed(result.output)


def test_flatten_and_scalars_keep_namespaces() -> None:
    config = {"lr": 1e-3, "env_kwargs": {"difficulty": [2, 3], "w": {"x": 1}}, "eval_env_kwargs": {}}
    assert flatten_config(config) == {
        "lr": 1e-3,
        "env_kwargs.difficulty": [2, 3],
        "env_kwargs.w.x": 1,
        "eval_env_kwargs": {},
    }
    row = {"iteration": 3, "actor/loss": -0.5, "rollout/k_hist": {"1": 4, "3": 2}, "ok": True,
           "name": "x", "bad": None, "lst": [1.0]}  # fmt: skip
    assert scalar_metrics(row) == {"actor/loss": -0.5, "rollout/k_hist/1": 4.0, "rollout/k_hist/3": 2.0, "ok": 1.0}


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("actor/clip_frac", "actor/clip_frac"),  # valid names are unchanged
        ("rollout/mean_k_by_type/propose step-2.5", "rollout/mean_k_by_type/propose step-2.5"),
        ("eval/acc@k:16", "eval/acc_k_16"),
        ("a//b/", "a/_/b/_"),
        ("/../x/./y", "_/_/x/_/y"),
        ("grading/ü", "grading/_"),
    ],
)
def test_mlflow_key_mapping(name: str, key: str) -> None:
    from mlflow.utils.validation import _validate_metric_name, _validate_param_name

    assert mlflow_key(name) == key
    _validate_metric_name(key)  # MLflow's own checks accept every mapped key
    _validate_param_name(key)


def test_mlflow_key_long_names_are_cut_deterministically() -> None:
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH

    a, b = "x/" + "a" * 300, "x/" + "a" * 299 + "b"
    assert len(mlflow_key(a)) == MAX_ENTITY_KEY_LENGTH and mlflow_key(a) == mlflow_key(a)
    assert mlflow_key(a) != mlflow_key(b)


def test_mlflow_key_collision_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = open_trackers("mlflow", tmp_path)
    try:
        with pytest.raises(ValueError, match="both map to MLflow key 'a/b_c'"):
            tracker.log({"iteration": 1, "a/b:c": 1.0, "a/b@c": 2.0}, step=1)
    finally:
        tracker.close()


def test_registry_and_multi_tracker_fan_out(tmp_path: Path) -> None:
    calls: list[tuple[str, Any]] = []

    class Recorder:
        def __init__(self, run: Any) -> None:
            self.run = run

        def log_hparams(self, config: Any) -> None:
            calls.append(("hparams", dict(config)))

        def log(self, metrics: Any, step: int) -> None:
            calls.append(("log", step))

        def close(self) -> None:
            calls.append(("close", None))

    from learners.tracking import register_tracker

    with pytest.raises(ValueError, match="without commas"):
        register_tracker("a,b", Recorder)
    register_tracker("recorder", Recorder)  # the public door a new backend uses
    try:
        tracker = open_trackers("recorder,console", tmp_path, echo=lambda s: calls.append(("echo", s)))
        assert tracker.names == ("jsonl", "recorder", "console")  # metrics.jsonl is always written
        tracker.log_hparams({"a": 1})
        tracker.log({"iteration": 2, "actor/loss": 0.25}, step=2)
        tracker.close()
        tracker.close()  # idempotent
    finally:
        del TRACKERS["recorder"]
    assert calls == [("hparams", {"a": 1}), ("log", 2), ("echo", "[it 2] actor/loss=0.25"), ("close", None)]
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"iteration": 2, "actor/loss": 0.25}
    ]



def test_a_junk_trackers_json_starts_new_runs_instead_of_crashing(tmp_path: Path) -> None:
    """``OUT/trackers.json`` is read on resume: an entry that is not ``{key: str}`` (hand-edited, another
    tool's) must not reach a backend (MLflow read ``previous.get(...)`` from it: AttributeError)."""
    from learners.tracking import STATE_FILE, register_tracker

    seen: list[dict[str, Any]] = []

    class Peek:
        def __init__(self, run: Any) -> None:
            seen.append(dict(run.state))

        def log_hparams(self, config: Any) -> None: ...
        def log(self, metrics: Any, step: int) -> None: ...
        def close(self) -> None: ...

    register_tracker("peek", Peek)
    try:
        for junk in ('["not", "a", "dict"]', '{"mlflow": "run-1", "wandb": {"id": 3}, "x": {"id": "a"}}'):
            (tmp_path / STATE_FILE).write_text(junk)
            open_trackers("peek", tmp_path, resume=True, main=True).close()
    finally:
        del TRACKERS["peek"]
    assert seen == [{}, {"x": {"id": "a"}}]


# --------------------------------------------------------------------------- the W&B offline run reader
def _wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a W&B offline run's ``run-<id>.wandb``.

    W&B keeps no Python reader of this file since its core moved to Go (0.2x), so this reads the
    format itself: a 7-byte header (``:W&B``, magic, version) then LevelDB's log format (32 KiB blocks
    of records: crc32 of type+data, length, type FULL/FIRST/MIDDLE/LAST, data), each record's data a
    ``wandb_internal_pb2.Record``. Every checksum is verified."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, offset, pending, out = 32768, 7, b"", []
    while offset + 7 <= len(data):
        left = block - offset % block
        if left < 7:  # a block's trailer: too short for a record header
            offset += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            offset += left
            continue
        payload = data[offset + 7 : offset + 7 + length]
        assert zlib.crc32(bytes([kind]) + payload) == crc, f"{path}: bad checksum at byte {offset}"
        offset += 7 + length
        if kind == 1:
            whole = payload
        elif kind == 2:
            pending = payload
            continue
        elif kind == 3:
            pending += payload
            continue
        else:
            whole, pending = pending + payload, b""
        record = wandb_internal_pb2.Record()
        record.ParseFromString(whole)
        out.append(record)
    return out


def _wandb_run(run_dir: Path) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """``(step -> {key: value}, config)`` logged by one offline run directory."""
    (log,) = run_dir.glob("run-*.wandb")
    history: dict[int, dict[str, float]] = {}
    config: dict[str, Any] = {}
    for record in _wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            step = int(items.pop("_step"))
            history[step] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            for item in updates:
                key = "/".join(item.nested_key) or item.key
                if not key.startswith("_"):
                    config[key] = json.loads(item.value_json)
    return history, config


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


# ---------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_every_backend_reads_back_what_metrics_jsonl_holds(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from typer.testing import CliRunner

    from learners.config import flat_to_sections
    from learners.trainer import TrainConfig
    from srpo_cli.app import app

    for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)  # the defaults under test: offline W&B, MLflow in OUT
    wandb_dir = tmp_path / "wandb-root"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # CliRunner swaps sys.stdout; W&B need not wrap it
    out = tmp_path / "run"
    args = [
        "train", "--model", str(tiny_model_dir), "--out", str(out), "--tasks-per-iter", "2",
        "--group-size", "2", "--epochs", "1", "--max-new-tokens", "8", "--eval-problems", "4",
        "--eval-every", "1", "--save-every", "1", "--lr", "5e-3",
        "--logger", "console,jsonl,tensorboard,wandb,mlflow",
    ]  # fmt: skip
    first = CliRunner().invoke(app, [*args, "--iterations", "1"])
    assert first.exit_code == 0, first.output
    resumed = CliRunner().invoke(app, [*args, "--iterations", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "[it 1] " in first.output and "[it 2] " in resumed.output  # console

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    expected = {r["iteration"]: scalar_metrics(r) for r in rows}
    assert "actor/loss" in expected[1] and "eval_accuracy" in expected[2]
    # not a comparison of zeros: timings, token counts, K statistics and tiny log-ratios differ from 0
    assert sum(v != 0 for v in expected[1].values()) >= 10, expected[1]
    # the resolved config of the first attempt (the resume changed only --iterations)
    first_cfg = TrainConfig(
        model=str(tiny_model_dir), out_dir=str(out), tasks_per_iter=2, group_size=2, epochs=1, max_new_tokens=8,
        eval_problems=4, eval_every=1, save_every=1, lr=5e-3, iterations=1,
        logger=("console", "jsonl", "tensorboard", "wandb", "mlflow"),
    )  # fmt: skip
    config = flatten_config(flat_to_sections(dataclasses.asdict(first_cfg)))  # `section.field` keys
    assert config["update.lr"] == 5e-3 and config["run.logger"] == first_cfg.logger

    # --- W&B: offline, two local runs (the first attempt and the resume) under one run id
    runs = sorted(wandb_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 2, runs
    ids = {r.name.rsplit("-", 1)[1] for r in runs}
    assert ids == {json.loads((out / "trackers.json").read_text())["wandb"]["id"]}
    (h1, c1), (h2, c2) = (_wandb_run(r) for r in runs)
    assert c1 == {k: _jsonable(v) for k, v in config.items()}  # hyperparameters, once
    assert c2 == {}  # the resume did not log them again
    wandb_history = {**h1, **h2}
    assert sorted(wandb_history) == [0, 1, 2]
    for step, values in expected.items():
        finite = {k: v for k, v in values.items() if math.isfinite(v)}
        assert wandb_history[step] == finite, step  # float64 both sides: exact

    # --- MLflow: the SQLite store in the run directory, one run continued by the resume
    client = MlflowClient(tracking_uri=f"sqlite:///{out.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("srpo")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"]
    assert run.info.status == "FINISHED"
    assert run.data.params == {mlflow_key(k): str(v) for k, v in config.items()}  # iterations stays "1"
    keys = set().union(*expected.values())
    assert set(run.data.metrics) == {mlflow_key(k) for k in keys}
    for key in keys:
        history = client.get_metric_history(run.info.run_id, mlflow_key(key))
        got = {m.step: m.value for m in history}
        assert len(got) == len(history), key  # each step once
        want = {step: values[key] for step, values in expected.items() if key in values}
        assert got == want, key  # float64 both sides: exact

    # --- TensorBoard: the scalars, and the HParams session written once across both event files
    acc = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == keys
    for key in keys:
        got = {e.step: e.value for e in acc.Scalars(key)}
        want = {step: values[key] for step, values in expected.items() if key in values}
        assert got.keys() == want.keys(), key
        for step, value in want.items():  # float32 on disk: its rounding, scaled to the value
            assert got[step] == pytest.approx(value, rel=1e-6, abs=1e-6 * max(1.0, abs(value))), (key, step)
    sessions = [
        v.tag
        for f in sorted((out / "tb").glob("events.out.tfevents.*"))
        for event in EventFileLoader(str(f)).Load()
        for v in event.summary.value
        if v.tag == "_hparams_/session_start_info"
    ]
    assert len(sessions) == 1


def test_a_fresh_start_forgets_the_trackers_run_ids(tmp_path: Path) -> None:
    """``Trainer.start_fresh`` / ``continue_from`` clear the run directory: a continued run opens its
    trackers with ``resume=True`` and would otherwise reattach to the W&B/MLflow run trained there before."""
    from learners.run_state import RunState
    from learners.tracking import STATE_FILE

    (tmp_path / STATE_FILE).write_text('{"wandb": {"id": "old", "mode": "offline"}}\n')
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1}\n')
    RunState(tmp_path, None, None, None, None).clear()  # type: ignore[arg-type]
    assert not (tmp_path / STATE_FILE).exists() and not (tmp_path / "metrics.jsonl").exists()


def test_broken_tracker_state_is_one_line_naming_the_tracker(tmp_path, monkeypatch) -> None:
    """A directory or junk file where MLflow's store goes, W&B online without a key: a TrackerError naming
    the tracker and the fix, before any backend starts (no retries, nothing written outside OUT)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    (run / "mlflow.db").mkdir(parents=True)
    with pytest.raises(TrackerError, match=r"^mlflow: .*mlflow.db is a directory"):
        open_trackers(["mlflow"], run, resume=True, main=True)
    (run / "mlflow.db").rmdir()
    (run / "mlflow.db").write_bytes(b"not a database at all")
    with pytest.raises(TrackerError, match=r"^mlflow: .*is not a SQLite database"):
        open_trackers(["mlflow"], run, resume=True, main=True)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with pytest.raises(TrackerError, match=r"^wandb: WANDB_MODE=online needs an API key"):
        open_trackers(["wandb"], tmp_path / "w", main=True)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot create the run directory"):
        open_trackers(["wandb"], blocker / "run", main=True)
