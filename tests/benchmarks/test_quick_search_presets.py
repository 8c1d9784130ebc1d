"""quick-search's settings reach the run: an edit of its learning rate in benchmarks/presets.py is the lr
the runs train with (the ``CompareConfig`` that ``compare_config.json`` records), misplaced keys are
refused instead of ignored, and running from another checkout than the one whose code runs is flagged.

A quick-search lr edit once left ``compare_config.json`` at 1e-4; these tests fail on the code before
the fix (the search entry had no lr line of its own and the CLI bound the presets at import)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import benchmarks.compare as compare
import benchmarks.presets as presets
from benchmarks import cli, compare_cli, quick_cli

REPO = Path(__file__).resolve().parents[2]
SEARCH_MODEL = str(REPO / "agents" / "checkpoints" / "mini-search-worlds-sft")


class _Captured(Exception):
    """Raised by the stand-in runner once it holds the config: nothing trains."""


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``run_comparison`` replaced by one that keeps the config as compare_config.json would hold it."""
    configs: list[dict[str, Any]] = []

    def fake_run(cfg: compare.CompareConfig, log: Any = None) -> None:
        configs.append(json.loads(json.dumps(asdict(cfg), default=str)))  # what compare_config.json holds
        raise _Captured

    monkeypatch.setattr(compare, "run_comparison", fake_run)
    return configs


def _edit_presets_file(monkeypatch: pytest.MonkeyPatch, lr: float) -> None:
    """Edit the search learning rate in the text of benchmarks/presets.py and load the edited file as the
    presets (as a rerun after the edit would), restoring every name afterwards."""
    source = Path(presets.__file__).read_text()
    # the statement, on one line or several (up to the line that closes the dict)
    line = re.search(r"^_SEARCH_TRAIN\b.*?\}$", source, flags=re.M | re.S)
    assert line is not None, "benchmarks/presets.py defines no _SEARCH_TRAIN"
    edited_line, n = re.subn(r'"lr": [0-9.e+-]+', f'"lr": {lr!r}', line.group(0))
    assert n == 1, f"quick-search's lr has no line of its own to edit: {line.group(0)!r}"
    namespace: dict[str, Any] = {"__name__": presets.__name__, "__file__": presets.__file__}
    exec(compile(source.replace(line.group(0), edited_line), presets.__file__, "exec"), namespace)
    for name, value in namespace.items():
        if name.isupper() or name.startswith("_") and name.endswith("_TRAIN"):
            monkeypatch.setattr(presets, name, value, raising=False)


def test_a_search_lr_edit_in_presets_reaches_the_runs_config(
    monkeypatch: pytest.MonkeyPatch, captured: list[dict[str, Any]], tmp_path: Path
) -> None:
    _edit_presets_file(monkeypatch, 7.5e-4)
    runner = CliRunner()
    quick = runner.invoke(
        cli.app,
        ["quick", "--suites", "quick-search", "--out", str(tmp_path), "--search-model", SEARCH_MODEL],
    )
    assert isinstance(quick.exception, _Captured), quick.output
    compare_run = runner.invoke(
        cli.app, ["compare", "--model", SEARCH_MODEL, "--suite", "quick-search", "--out", str(tmp_path)]
    )
    assert isinstance(compare_run.exception, _Captured), compare_run.output
    assert len(captured) == 2
    for cfg in captured:
        assert cfg["suite"] == "quick-search"
        assert cfg["train"]["lr"] == 7.5e-4
    # bench quick trains its budgeted iterations, bench compare the decision settings over them
    assert captured[0]["train"]["iterations"] == presets.QUICK_SETTINGS["quick-search"]["train"]["iterations"]
    assert captured[1]["train"]["iterations"] == presets.DECISION_TRAIN["quick-search"]["iterations"]
    # the run says what it trains with, and whose presets, before training starts
    assert "lr=0.00075" in quick.output and str(Path(presets.__file__).resolve()) in quick.output


def test_a_quick_setting_beside_train_is_refused_not_ignored(
    monkeypatch: pytest.MonkeyPatch, captured: list[dict[str, Any]], tmp_path: Path
) -> None:
    entry = presets.QUICK_SETTINGS["quick-search"]
    monkeypatch.setitem(presets.QUICK_SETTINGS, "quick-search", {**entry, "lr": 5e-4})
    args = ["quick", "--suites", "quick-search", "--out", str(tmp_path), "--search-model", SEARCH_MODEL]
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 2 and not captured, res.output
    assert "['lr'] are not read" in res.output
    monkeypatch.setitem(
        presets.QUICK_SETTINGS, "quick-search", {**entry, "train": {**entry["train"], "learning_rate": 1}}
    )
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 2 and "['learning_rate'] are no TrainConfig fields" in res.output


def test_every_quick_setting_is_read() -> None:
    """Every key of every shipped QUICK_SETTINGS entry is one bench quick reads."""
    for suite in presets.QUICK_SETTINGS:
        assert quick_cli.quick_settings(suite) is presets.QUICK_SETTINGS[suite]


def test_running_from_another_checkout_is_flagged(tmp_path: Path) -> None:
    other = tmp_path / "clone"
    (other / "benchmarks").mkdir(parents=True)
    (other / "pyproject.toml").write_text('[project]\nname = "srpo"\n')
    (other / "benchmarks" / "presets.py").write_text("")
    (other / "tests").mkdir()
    msg = cli.warn_other_checkout(other / "tests")
    assert msg is not None
    assert str(other) in msg and str(Path(presets.__file__).resolve().parent.parent) in msg
    assert cli.warn_other_checkout(REPO / "tests") is None  # the checkout whose code runs
    assert cli.warn_other_checkout(tmp_path) is None  # not a checkout at all


def test_the_main_job_runs_routed_columns_and_the_search_team_each_with_its_seeds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`srpo bench quick` with no options: quick-columns-routed's three algorithms at seeds 0,1, and the
    search half, quick-search-team, SRPO alone at seeds 0,1 in its 16 decision worlds from the routed warm
    start (what fits the job's budget); --seeds given applies to every suite."""
    runs: list[tuple[str, list[int], str, list[str], Any]] = []

    def fake_compare(warm, out, algos, seeds, name, *args, **kwargs):
        runs.append((name, list(seeds), Path(warm).name, list(algos), kwargs.get("env_kwargs")))
        return None

    monkeypatch.setattr(compare_cli, "run_compare", fake_compare)
    monkeypatch.setattr(quick_cli, "merge_quick_outputs", lambda out, results: {})
    res = CliRunner().invoke(cli.app, ["quick", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    worlds = {"kb_seed": list(range(3, 19))}
    assert runs == [
        ("quick-columns-routed", [0, 1], "mini-columns-sft", ["srpo", "grpo", "mappo"], None),
        ("quick-search-team", [0, 1], "mini-search-worlds-routed-sft", ["srpo"], worlds),
    ]
    assert worlds["kb_seed"] == presets.DECISION_ENV_KWARGS["quick-search-team"]["kb_seed"]
    runs.clear()
    res = CliRunner().invoke(cli.app, ["quick", "--out", str(tmp_path), "--seeds", "3,4,5"])
    assert res.exit_code == 0, res.output
    assert [seeds for _, seeds, *_ in runs] == [[3, 4, 5], [3, 4, 5]]


def test_a_quick_setting_naming_an_unknown_algorithm_is_refused(
    monkeypatch: pytest.MonkeyPatch, captured: list[dict[str, Any]], tmp_path: Path
) -> None:
    entry = presets.QUICK_SETTINGS["quick-search"]
    monkeypatch.setitem(presets.QUICK_SETTINGS, "quick-search", {**entry, "algos": ("srpo", "ppo")})
    args = ["quick", "--suites", "quick-search", "--out", str(tmp_path), "--search-model", SEARCH_MODEL]
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 2 and not captured, res.output
    assert "warm start" not in res.output  # refused before any suite starts
    assert "algos ['ppo'] are not among" in " ".join(res.output.replace("│", " ").split())


@pytest.mark.parametrize("command", ["compare", "ablation"])
def test_env_kwarg_replaces_the_decision_worlds_of_training_only(
    command: str, captured: list[dict[str, Any]], tmp_path: Path
) -> None:
    """``--env-kwarg kb_seed=[...]`` trains in other worlds than the preset's 16; the other training env
    kwargs stay, and a malformed pair is a usage error before anything runs."""
    base = [command, "--model", SEARCH_MODEL, "--suite", "quick-search", "--out", str(tmp_path)]
    res = CliRunner().invoke(cli.app, [*base, "--env-kwarg", "kb_seed=[3,4,5]", "--env-kwarg", "max_turns=2"])
    assert isinstance(res.exception, _Captured), res.output
    suite_env = presets.TRAINING_ENVS["quick-search"].env_kwargs
    assert captured[0]["env_kwargs"] == {**suite_env, "kb_seed": [3, 4, 5], "max_turns": 2}
    res = CliRunner().invoke(cli.app, base)
    assert captured[1]["env_kwargs"] == {**suite_env, **presets.DECISION_ENV_KWARGS["quick-search"]}
    res = CliRunner().invoke(cli.app, [*base, "--env-kwarg", "kb_seed"])
    assert res.exit_code == 2 and len(captured) == 2, res.output
    assert "KEY=VALUE" in res.output


@pytest.mark.parametrize("command", ["compare", "ablation"])
def test_continue_from_is_checked_before_anything_runs(
    command: str, captured: list[dict[str, Any]], tmp_path: Path
) -> None:
    """``--continue-from`` a directory that is no finished comparison, or one of other settings, is a
    usage error naming the difference; a matching one reaches the runs' config."""
    out = tmp_path / "out"
    base = [command, "--model", SEARCH_MODEL, "--suite", "quick-search", "--out", str(out), "--seeds", "0"]

    def said(res: Any) -> str:  # the error box's text, unwrapped
        return " ".join(res.output.replace("│", " ").split())

    res = CliRunner().invoke(cli.app, [*base, "--continue-from", str(tmp_path / "none")])
    assert res.exit_code == 2 and not captured and "no compare_config.json" in said(res), res.output
    assert not out.exists()
    res = CliRunner().invoke(cli.app, base)  # what a finished comparison of these settings wrote
    source = tmp_path / "source"
    cfg = dict(captured[0], out_dir=str(source))
    (source / "runs").mkdir(parents=True)
    (source / "compare_config.json").write_text(json.dumps(cfg, default=str))
    for name in cfg["variants"]:
        (source / "runs" / f"{name}-s0" / "final").mkdir(parents=True)
        (source / "runs" / f"{name}-s0" / "final" / "config.json").write_text("{}")
    more = cfg["train"]["iterations"] * 2
    res = CliRunner().invoke(
        cli.app, [*base, "--continue-from", str(source), "--iterations", str(more), "--lr", "1e-3"]
    )
    assert res.exit_code == 2 and len(captured) == 1 and "['train.lr']" in said(res), res.output
    res = CliRunner().invoke(cli.app, [*base, "--continue-from", str(source), "--iterations", str(more)])
    assert isinstance(res.exception, _Captured), res.output
    assert captured[1]["continue_from"] == str(source) and captured[1]["train"]["iterations"] == more
