"""Plugins: an out-of-tree package registers an env, an algorithm and a suite, and the srpo CLI trains and
decides with them without an edit to srpo (tests/fixtures/srpo-demo-plugin, installed into a venv);
``--import`` and an experiment file's ``imports``; a broken or clashing plugin is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from learners.algorithms import ALGORITHMS
from learners.config import dumps_train_config, read_train_config
from srpo_cli.app import main
from srpo_common import plugins
from tests._plugin_venv import plugin_venv

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "srpo-demo-plugin"  # (tests/_plugin_venv.py installs it)
MODEL = ROOT / "agents" / "checkpoints" / "mini-columns-sft"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """The demo plugin installed into a venv (tests/_plugin_venv.py)."""
    return plugin_venv(tmp_path_factory.mktemp("plugin-venv"))


def _srpo(python: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "srpo_cli.app", *args], cwd=cwd, capture_output=True, text=True)


def test_an_installed_plugin_env_and_algorithm_train_through_the_cli(venv: Path, tmp_path: Path) -> None:
    listed = _srpo(venv, "envs")
    assert listed.returncode == 0 and "DemoColumns-v0" in listed.stdout, listed.stderr
    assert "DemoColumns-v0" not in _srpo(Path(sys.executable), "envs").stdout  # the venv's plugin only
    run = tmp_path / "run"
    done = _srpo(
        venv, "train", "--algo", "demo-reinforce", "--env", "DemoColumns-v0", "--model", str(MODEL),
        "--out", str(run), "--iterations", "1", "--tasks-per-iter", "2", "--group-size", "2", "--eval-every", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["iteration"] == 1 and (run / "final").is_dir()


@pytest.mark.slow
def test_an_installed_plugin_algorithm_is_decided_on_its_suite(venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    done = _srpo(
        venv, "bench", "compare", "--algos", "srpo,demo-reinforce", "--suite", "demo-columns", "--model", str(MODEL),
        "--seeds", "0,1", "--set", "train.iterations=1", "--eval-limit", "4", "--eval-k", "1", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    decisions = json.loads((out / "decisions.json").read_text())
    assert "demo-reinforce" in json.dumps(decisions)
    records = json.loads((out / "results.json").read_text())
    assert records and all(
        r["provenance"]["plugins"] == {"demo": "srpo_demo_plugin [srpo-demo-plugin 0.3.1]"} for r in records
    ), records[0]["provenance"]


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write plugin modules into a directory on sys.path; forget them (and what they loaded) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(plugins.LOADED)

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    yield write
    for name in set(plugins.LOADED) - set(before):
        plugins.LOADED.pop(name)
        sys.modules.pop(name.partition(":")[0], None)


def _one_line_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_broken_plugin_is_one_line_naming_it(modules, capsys: pytest.CaptureFixture[str]) -> None:
    modules("srpo_test_broken_plugin", "raise RuntimeError('the plugin author forgot something')\n")
    err = _one_line_exit_2(["--import", "srpo_test_broken_plugin", "envs"], capsys)
    assert err.startswith("error: plugin srpo_test_broken_plugin (--import srpo_test_broken_plugin)") and (
        "RuntimeError: the plugin author forgot something" in err
    ), err
    err = _one_line_exit_2(["--import", "srpo_no_such_module_anywhere", "envs"], capsys)
    assert "ModuleNotFoundError" in err and "srpo_no_such_module_anywhere" in err


def test_a_plugin_may_not_replace_a_built_in(modules, capsys: pytest.CaptureFixture[str]) -> None:
    srpo = ALGORITHMS["srpo"]
    modules(
        "srpo_test_clash_plugin",
        """
        from learners.algorithms import register_algorithm
        register_algorithm("srpo", "grpo", "grpo", description="an impostor")
        """,
    )
    err = _one_line_exit_2(["--import", "srpo_test_clash_plugin", "envs"], capsys)
    assert "registers algorithm 'srpo', a name already taken" in err, err
    assert ALGORITHMS["srpo"] is srpo  # put back: the command (had it run) trains the real one


def test_an_experiment_file_imports_its_plugins_and_a_run_saves_them(
    modules, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = modules(
        "srpo_test_file_plugin",
        """
        from learners.algorithms import register_algorithm
        register_algorithm("file-plugin-rloo", "rloo", "grpo")
        """,
    )
    exp = tmp_path / "exp.toml"
    exp.write_text(f'imports = ["{name}"]\n\n[run]\nalgo = "file-plugin-rloo"\nmodel = "m"\n')
    try:
        cfg = read_train_config(exp)
        assert cfg.algo == "file-plugin-rloo"
        text = dumps_train_config(cfg)
        assert text.splitlines()[2] == f'imports = ["{name}"]', text  # after the header comment
    finally:
        ALGORITHMS.pop("file-plugin-rloo", None)
    exp.write_text('imports = "not a list"\n')
    err = _one_line_exit_2(["train", "--config", str(exp)], capsys)
    assert "imports must be a list of module names" in err


def test_the_suite_page_shows_the_plugin_unchanged() -> None:
    page = (ROOT / "docs" / "adding-a-suite.md").read_text(encoding="utf-8")
    source = (FIXTURE / "srpo_demo_plugin" / "__init__.py").read_text(encoding="utf-8")
    assert f"```python\n{source}```" in page and f"```toml\n{(FIXTURE / 'pyproject.toml').read_text()}```" in page
