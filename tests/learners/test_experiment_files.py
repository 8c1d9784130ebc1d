"""Experiment files: TrainConfig in sections, ``srpo train --config/--set``, the run's saved config.toml.

The end-to-end checks compare a tiny run's final weights and logged metrics (timings left out) by sha256:
exact equality is by design here (same seed, same process, CPU, one thread: the runs are bit-identical).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import learners.cli
from learners import config as train_config
from learners.trainer import TrainConfig
from srpo_cli.app import app
from srpo_common import sha256_json, weights_sha256
from srpo_common.config_file import ConfigFileError, Layout

MODEL = Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-columns-sft"


def test_every_field_is_in_exactly_one_section() -> None:
    """A field added to TrainConfig without a section fails here, naming it and where to add it."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    placed = [n for fields in train_config.TRAIN_SECTIONS.values() for n in fields]
    unplaced = [n for n in names if n not in placed]
    assert not unplaced, f"TrainConfig fields in no section: {unplaced}; add each to learners/config.py TRAIN_SECTIONS"
    doubled = sorted({n for n in placed if placed.count(n) > 1})
    assert not doubled, f"fields in more than one section: {doubled}"
    assert sorted(placed) == sorted(names), "TRAIN_SECTIONS names fields TrainConfig does not have"
    assert train_config.unplaced_fields() == []  # what train_layout() would warn about


def test_layout_names_an_unplaced_field() -> None:
    @dataclasses.dataclass
    class Two:
        a: int = 1
        b: int = 2

    with pytest.raises(ValueError, match=r"fields in no section: \['b'\]"):
        Layout(Two, {"s": ("a",)})


def test_sections_are_frozen_views_with_derived_values() -> None:
    cfg = TrainConfig(algo="gspo", model="m", minibatches_per_iter=3, group_size=5)
    assert cfg.rollout.group_size == 5
    assert cfg.update.clip_range == cfg.clip_range() == (3e-4, 4e-4)  # GSPO's own clip range, resolved once
    assert cfg.update.agg == cfg.resolved("agg") and cfg.update.adv_scale == cfg.resolved("adv_scale")
    assert cfg.update.policy_loss == "gspo" and cfg.derived.adv_estimator == "grpo"
    assert cfg.update.rows_per_minibatch(10) == 4  # minibatches_per_iter splits the batch
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.group_size = 9  # type: ignore[misc]
    assert cfg.rollout is cfg.rollout  # built once ...
    cfg.group_size = 9
    assert cfg.rollout.group_size == 9  # ... and rebuilt when a field is assigned
    # the views are not fields: asdict (checkpoints, record hashes) holds the flat fields only
    assert set(dataclasses.asdict(cfg)) == {f.name for f in dataclasses.fields(TrainConfig)}


def test_old_flat_checkpoint_configs_load_and_round_trip_through_toml(tmp_path: Path) -> None:
    flat = dataclasses.asdict(TrainConfig(model="m", kl_coef=0.01, env_kwargs={"difficulty": [2, 3]}))
    flat["max_policy_lag"] = 1  # a removed field old checkpoints still carry
    cfg = TrainConfig.from_dict(flat)
    path = train_config.write_run_config(cfg, tmp_path)
    text = path.read_text()
    assert "[rollout]" in text and "[update]" in text and "kl_coef = 0.01" in text
    again = train_config.read_train_config(path)
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)  # the same config, so the same hash
    assert train_config.flat_to_sections(dataclasses.asdict(cfg))["update"]["kl_coef"] == 0.01


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("rollout.grup_size=8", "unknown key 'rollout.grup_size'; did you mean 'rollout.group_size'?"),
        ("update.group_size=8", "'group_size' is in section [rollout]; did you mean 'rollout.group_size'?"),
        ("group_size=8", "did you mean 'rollout.group_size'?"),
        ("update.kl_coeff=0.1", "did you mean 'update.kl_coef'?"),
    ],
)
def test_unknown_or_misplaced_keys_name_the_valid_one(item: str, message: str) -> None:
    with pytest.raises(ConfigFileError) as exc:
        train_config.read_train_config(sets=[item])
    assert message in str(exc.value)


def test_a_typod_key_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--model", "m", "--set", "rollout.grup_size=8"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "did you mean 'rollout.group_size'?" in result.output
    exp = tmp_path / "exp.toml"
    exp.write_text("[update]\ngroup_size = 8\n")
    result = CliRunner().invoke(app, ["train", "--model", "m", "--config", str(exp)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "rollout.group_size" in result.output


def _captured(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> TrainConfig:
    seen: list[TrainConfig] = []
    monkeypatch.setattr(learners.cli, "train", lambda cfg, resume=False, log=None: seen.append(cfg) or [])
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_precedence_defaults_file_flags_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text(
        '[run]\nmodel = "from-file"\n[rollout]\ngroup_size = 8\ntasks_per_iter = 3\n'
        '[update]\nlr = 1\nkl_coef = 0.5\n[run.env_kwargs]\ndataset = "procedural-columns"\n'
    )
    cfg = _captured(monkeypatch, ["--config", str(exp)])
    assert (cfg.model, cfg.group_size, cfg.tasks_per_iter, cfg.kl_coef) == ("from-file", 8, 3, 0.5)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)  # an int in the file is the float field's value
    assert cfg.epochs == TrainConfig.epochs  # not in the file: the default
    cfg = _captured(
        monkeypatch,
        ["--config", str(exp), "--group-size", "4", "--env-kwarg", "difficulty=[2,3]", "--set", "update.kl_coef=0.25"],
    )
    assert cfg.group_size == 4  # a flag given on the command line beats the file, even at its default value
    assert cfg.tasks_per_iter == 3 and cfg.kl_coef == 0.25  # --set beats the file
    assert cfg.env_kwargs == {"dataset": "procedural-columns", "difficulty": [2, 3]}  # KEY=VALUE merge over it
    cfg = _captured(monkeypatch, ["--config", str(exp), "--group-size", "4", "--set", "rollout.group_size=16"])
    assert cfg.group_size == 16  # --set beats the flag


# ------------------------------------------------------------------------------------ end to end
TINY = [
    "--model", str(MODEL), "--env", "MathVerify-v0", "--env-kwarg", "dataset=procedural-columns",
    "--env-kwarg", "difficulty=[2,3]", "--workflow", "proposers-aggregator", "--iterations", "2",
    "--tasks-per-iter", "2", "--group-size", "2", "--epochs", "2", "--rows-per-batch", "8",
    "--lr", "1e-5", "--kl-coef", "0.01", "--eval-every", "0", "--save-every", "0", "--seed", "3",
]  # fmt: skip
TINY_FILE = """\
[run]
model = "{model}"
env_id = "MathVerify-v0"
iterations = 2
seed = 3
save_every = 0

[run.env_kwargs]
dataset = "procedural-columns"
difficulty = [2, 3]
workflow = "proposers-aggregator"

[rollout]
tasks_per_iter = 2
group_size = 2

[update]
epochs = 2
rows_per_batch = 8
lr = 1e-5
kl_coef = 0.01

[eval]
eval_every = 0
"""


def _run_fingerprint(args: list[str], out: Path) -> dict[str, str]:
    """Train in-process; sha256 of the final weights and of the logged metrics without timings."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(app, ["train", *args, "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timeless = [{k: v for k, v in r.items() if not k.endswith("_s") and not k.startswith("time/")} for r in rows]
    return {"weights": weights_sha256(out / "final"), "metrics": sha256_json(timeless), "n": str(len(rows))}


@pytest.mark.slow
def test_file_run_equals_flags_run_and_config_toml_reproduces(tmp_path: Path) -> None:
    flags = _run_fingerprint(TINY, tmp_path / "flags")
    exp = tmp_path / "exp.toml"
    exp.write_text(TINY_FILE.format(model=MODEL))
    from_file = _run_fingerprint(["--config", str(exp)], tmp_path / "file")
    saved = tomllib.loads((tmp_path / "flags" / "config.toml").read_text())
    assert saved["update"]["kl_coef"] == 0.01 and saved["rollout"]["group_size"] == 2
    rerun = _run_fingerprint(["--config", str(tmp_path / "flags" / "config.toml")], tmp_path / "rerun")
    print(f"flags:  {flags}\nfile:   {from_file}\nrerun:  {rerun}")
    assert flags["n"] == "2"
    assert from_file == flags
    assert rerun == flags
    # the three runs' saved configs differ only in out_dir
    cfgs = [train_config.read_train_config(tmp_path / d / "config.toml") for d in ("flags", "file", "rerun")]
    assert len({json.dumps({**dataclasses.asdict(c), "out_dir": ""}, sort_keys=True) for c in cfgs}) == 1


# ------------------------------------------------------------------------- bench compare / ablation / power
SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "benchmarks" / "experiments").glob("*.toml"))


@pytest.fixture
def compare_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple, dict]]:
    import benchmarks.compare_cli as compare_cli

    calls: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(compare_cli, "run_compare", lambda *a, **kw: calls.append((a, kw)))
    return calls


def _bench(*args: str) -> None:
    from benchmarks.cli import app as bench_app

    result = CliRunner().invoke(bench_app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output


def test_compare_train_table_takes_every_training_field(compare_calls: list, tmp_path: Path) -> None:
    """``_train_overrides`` passed 9 hand-picked fields; ``[train]`` / ``--set train.X`` takes any, and the
    shortcut options still beat the file."""
    _bench("compare", "--model", "m", "--suite", "quick-columns", "--set", "train.kl_coef=0.05",
           "--set", "train.temperature=0.7")  # fmt: skip
    train = compare_calls[-1][0][5]
    assert (train["kl_coef"], train["temperature"], train["group_size"]) == (0.05, 0.7, 8)
    exp = tmp_path / "exp.toml"
    exp.write_text('[compare]\nmodel = "m"\nsuite = "quick-columns"\n[train]\nkl_coef = 0.01\nlr = 1e-5\n')
    _bench("ablation", "--config", str(exp), "--lr", "2e-5")
    train = compare_calls[-1][0][5]
    assert (train["kl_coef"], train["lr"]) == (0.01, 2e-5)


def test_compare_typo_and_run_fields_are_usage_errors(compare_calls: list) -> None:
    from benchmarks.cli import app as bench_app

    res = CliRunner().invoke(bench_app, ["compare", "--model", "m", "--set", "train.kl_coeff=1"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "did you mean 'train.kl_coef'?" in res.output, res.output
    res = CliRunner().invoke(bench_app, ["compare", "--model", "m", "--set", "train.norm=cube"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "norm must be one of" in res.output, res.output  # checked before any run
    res = CliRunner().invoke(bench_app, ["compare", "--model", "m", "--config", "no-such-experiment"], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "shipped experiments:" in res.output, res.output
    assert not compare_calls


def test_saved_experiment_reruns_the_same_comparison(compare_calls: list, tmp_path: Path) -> None:
    _bench("compare", "--model", "m", "--suite", "quick-search", "--algos", "srpo,grpo", "--iterations", "3",
           "--set", "train.kl_coef=0.02", "--env-kwarg", "max_turns=2")  # fmt: skip
    first_args, first_kw = compare_calls[-1]
    saved = tmp_path / "experiment.toml"
    saved.write_text(first_kw["experiment"])  # what run_compare writes to OUT/experiment.toml
    _bench("compare", "--config", str(saved))
    again_args, again_kw = compare_calls[-1]
    assert again_args == first_args
    assert {k: v for k, v in again_kw.items() if k != "experiment"} == {
        k: v for k, v in first_kw.items() if k != "experiment"
    }


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_experiments_equal_the_presets_they_mirror(name: str, compare_calls: list) -> None:
    """``--config SUITE`` (a shipped file, found by name) runs what ``--suite SUITE`` runs: presets.py reads
    the suite's decision settings from the same file, and the file's layers land where the presets' do."""
    from benchmarks import options, presets

    assert len(SHIPPED) >= 5 and name in presets.DECISION_SEEDS
    for cls in (options.CompareOptions, options.AlgoCompareOptions, options.PowerOptions):
        assert options.layout(cls).read(name)["suite"] == name  # every command's layout reads it
    for command in ("compare", "ablation"):
        _bench(command, "--model", "m", "--suite", name)
        _bench(command, "--model", "m", "--config", name)
        (preset_args, preset_kw), (file_args, file_kw) = compare_calls[-2:]
        assert file_args == preset_args, name
        assert file_kw["env_kwargs"] == preset_kw["env_kwargs"], name
    # an explicit minibatch size replaces the file's split as it replaces the preset's
    _bench("compare", "--model", "m", "--suite", name, "--rows-per-batch", "64", "--set", "train.kl_coef=0.1")
    _bench("compare", "--model", "m", "--config", name, "--rows-per-batch", "64", "--set", "train.kl_coef=0.1")
    assert compare_calls[-1][0] == compare_calls[-2][0], name
    assert compare_calls[-1][0][5]["rows_per_batch"] == 64 and "minibatches_per_iter" not in compare_calls[-1][0][5]


def test_record_provenance_carries_the_config_and_old_records_keep_their_hash() -> None:
    from leaderboards.schema import compute_record_hash, hash_config, make_record, validate_record

    config = {"compare": {"suite": "quick-math"}, "train": train_config.flat_to_sections({"kl_coef": 0.01})}
    common = {
        "suite": "quick-math", "metrics": {"arith": {"avg@2": 0.5}}, "k": 2, "seeds": [0], "algorithm": "srpo",
        "workflow": "proposers-aggregator", "model_id": "m", "dataset_sha256": {"arith": "ab" * 32},
        "version": "0.1.0", "commit": "a" * 40, "date": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    new = make_record(config=config, **common)
    assert new.provenance.config == config and new.provenance.config_hash == hash_config(config)
    assert validate_record(new.model_dump(mode="json")).record_hash == new.record_hash  # round trip
    old = make_record(config_hash=hash_config(config), **common)  # how records were written before
    content = old.model_dump(mode="json")
    content["provenance"].pop("config")  # an old file has no such key
    content["provenance"].pop("plugins")  # nor this one (the plugins a run loaded: None without any)
    assert compute_record_hash(content) == old.record_hash
    # the hash as computed before provenance.config existed: the canonical JSON without it
    before = {k: v for k, v in content.items() if k not in ("record_hash", "signature") and v is not None}
    assert sha256_json(before) == old.record_hash
    bad = new.model_dump(mode="json")
    bad["provenance"]["config"]["train"]["update"]["kl_coef"] = 0.5
    with pytest.raises(Exception, match="does not hash to"):
        validate_record(bad)


def _train_recipes() -> list:
    from tests._recipes import extract

    # the documented commands written with flags (a docs line `srpo train --config 3b` runs the shipped file)
    return [r for r in extract() if r.command == "train" and "--config" not in r.argv]


@pytest.mark.parametrize("recipe", _train_recipes(), ids=lambda r: r.source)
def test_each_docs_train_recipe_ships_as_an_experiment_file(recipe, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every ``srpo train`` recipe of the docs (tests/_recipes.py finds them) has a shipped file
    ``learners/experiments/<its --out name>.toml`` that ``--config NAME`` finds and that trains the same
    config as the documented flags."""
    from tests._recipes import _option, _srpo_index

    argv = list(recipe.argv[_srpo_index(recipe.argv) + 2 :])  # after `srpo train`
    name = (_option(recipe.argv, "--out") or "").removeprefix("runs/")
    shipped = train_config.EXPERIMENTS_DIR / f"{name}.toml"
    assert shipped.is_file(), f"{recipe.source}: no shipped experiment {shipped} ({_REGENERATE})"
    from_flags = _captured(monkeypatch, argv)
    from_file = _captured(monkeypatch, ["--config", name])
    assert dataclasses.asdict(from_file) == dataclasses.asdict(from_flags), f"{recipe.source}: {_REGENERATE}"


def test_every_shipped_train_experiment_is_a_docs_recipe() -> None:
    from tests._recipes import _option

    documented = {(_option(r.argv, "--out") or "").removeprefix("runs/") for r in _train_recipes()}
    shipped = {p.stem for p in train_config.EXPERIMENTS_DIR.glob("*.toml")}
    assert shipped == documented, f"shipped {sorted(shipped - documented)} without a docs recipe ({_REGENERATE})"


_REGENERATE = "a docs recipe changed: regenerate the files with `python -m tests.learners.test_experiment_files`"


def write_recipe_experiments() -> list[Path]:
    """Write ``learners/experiments/<name>.toml`` for every docs ``srpo train`` recipe (``--out runs/<name>``):
    the fields that differ from the defaults, in sections."""
    from tests._recipes import _option, _srpo_index

    seen: list[TrainConfig] = []
    original = learners.cli.train
    learners.cli.train = lambda cfg, resume=False, log=None: seen.append(cfg) or []
    written = []
    try:
        for old in train_config.EXPERIMENTS_DIR.glob("*.toml"):
            old.unlink()
        for r in _train_recipes():
            res = CliRunner().invoke(app, list(r.argv[_srpo_index(r.argv) + 1 :]))
            assert res.exit_code == 0, res.output
            name = (_option(r.argv, "--out") or "").removeprefix("runs/")
            launcher = " ".join(r.argv[: _srpo_index(r.argv)])
            header = (
                f"The {r.source.rsplit(':', 1)[0]} recipe `{name}` as an experiment file (what differs from the "
                f"defaults).\n{launcher + ' ' if launcher else ''}srpo train --config {name} [--set section.field=value]\n"
                "tests/learners/test_experiment_files.py checks it equals the documented command."
            )
            path = train_config.EXPERIMENTS_DIR / f"{name}.toml"
            written.append(train_config.train_layout().write(path, train_config.non_default(seen[-1]), header))
    finally:
        learners.cli.train = original
    return written


if __name__ == "__main__":
    for path in write_recipe_experiments():
        print(f"wrote {path}")


def test_views_are_not_pickled_and_help_lists_config_and_set() -> None:
    """A config sent to a Ray worker carries its fields only (the views are rebuilt there)."""
    import pickle

    cfg = TrainConfig(model="m", group_size=3)
    assert cfg.rollout.group_size == 3
    again = pickle.loads(pickle.dumps(cfg))
    assert "_views" not in again.__dict__ and again.rollout.group_size == 3
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert "--config" in result.output and "--set" in result.output


def test_a_config_toml_cannot_hold_warns_instead_of_stopping_the_run(tmp_path: Path) -> None:
    cfg = TrainConfig(model="m", env_id="MultiTurnSearch-v0", env_kwargs={"retriever_url": None})
    # a previous run's file in the same --out must not survive to rerun that other run
    train_config.write_run_config(TrainConfig(model="other"), tmp_path)
    assert (tmp_path / "config.toml").exists()
    with pytest.warns(UserWarning, match="TOML has no null"):
        assert train_config.write_run_config(cfg, tmp_path) is None
    assert not (tmp_path / "config.toml").exists()
