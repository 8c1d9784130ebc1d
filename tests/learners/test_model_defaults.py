"""Defaults that help: a command that names only a model and an env gets the settings tested for the
model's class (learners.profiles), and the docs' training commands on shipped models, run as written,
end at or above their start on held-out problems (slow: they train)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from learners import trainer as trainer_mod
from learners.profiles import TINY, model_class, settings_for
from learners.trainer import run_summary
from srpo_cli.app import main
from tests._plugin_venv import plugin_venv

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "agents" / "checkpoints" / "mini-columns-sft"


def test_model_classes() -> None:
    assert model_class(str(SHIPPED)) == "tiny"
    assert model_class("Qwen/Qwen2.5-3B-Instruct") == "pretrained"
    assert model_class("") is None
    assert settings_for(str(SHIPPED))[1] == TINY
    assert settings_for("Qwen/Qwen2.5-3B-Instruct", sharing="lora")[1] == {"lr": 1e-5}
    assert settings_for("Qwen/Qwen2.5-3B-Instruct")[1] == {"lr": 1e-6}


def _plan(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``srpo train ARGS --plan-only``: builds the config (profile included) and trains nothing."""
    with pytest.raises(SystemExit) as exc:  # 0: the plan fits
        main(["train", *args, "--plan-only", "--plan-gpu-gb", "80"])
    err = capsys.readouterr().err
    assert exc.value.code == 0, err
    return err


def test_a_shipped_model_gets_the_tiny_settings_that_were_not_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("SRPO_MODEL_DEFAULTS", "1")
    err = _plan(["--model", str(SHIPPED)], capsys)
    assert "settings for a tiny model" in err and "lr=0.0001" in err and "group_size=8" in err, err
    # given on the command line, in a file or by --set: the user's value wins and is not listed
    err = _plan(["--model", str(SHIPPED), "--lr", "3e-4", "--set", "rollout.group_size=4"], capsys)
    assert "lr=" not in err and "group_size=" not in err and "epochs=1" in err, err
    exp = tmp_path / "exp.toml"
    exp.write_text("[update]\nepochs = 2\n")
    err = _plan(["--model", str(SHIPPED), "--config", str(exp)], capsys)
    assert "epochs=" not in err and "lr=0.0001" in err, err
    # off: the plain dataclass defaults, and no line
    err = _plan(["--model", str(SHIPPED), "--no-model-defaults"], capsys)
    assert "settings for" not in err


def test_a_run_that_made_its_model_worse_says_so() -> None:
    history = [{"iteration": 0, "eval_accuracy": 0.75}, {"iteration": 8, "eval_accuracy": 0.25}]
    summary = run_summary(history)
    assert summary["verdict"] == "worse" and "WORSE than the start by 50.0 pt" in summary["line"]
    assert run_summary([{"iteration": 0, "eval_accuracy": 0.5}, {"iteration": 1, "eval_accuracy": 0.6}])[
        "verdict"
    ] == "better"
    assert run_summary([{"iteration": 1}])["verdict"] == "unevaluated"


def test_the_last_line_and_summary_of_a_worse_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scores = iter([0.5, 0.25])
    monkeypatch.setattr(trainer_mod.Trainer, "evaluate", lambda self, *a, **k: next(scores))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as done:
        main([
            "train", "--model", str(tiny_model_dir), "--out", str(run), "--iterations", "1", "--tasks-per-iter",
            "1", "--group-size", "2", "--max-new-tokens", "4", "--eval-every", "1", "--save-every", "0",
        ])  # fmt: skip
    assert done.value.code == 0  # a worse model is said, not an error
    out = capsys.readouterr().out.strip().splitlines()
    assert "0.500 (iteration 0) -> 0.250 (iteration 1): WORSE than the start" in out[-1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "worse" and summary["delta"] == -0.25


def _doc_train_commands() -> list[tuple[str, str]]:
    """``srpo train`` commands on a shipped model in README.md and docs/*.md code blocks, as written."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = line.split("  #")[0].split(" # ")[0].strip()
                if command.startswith("srpo train ") and ("agents/checkpoints/" in command or "runs/train/" in command):
                    found.append((f"{path.relative_to(ROOT)}:{command[:60]}", command))
    return found


def _needs_demo_plugin(command: str) -> bool:
    """A docs command that names what the demo plugin registers (docs/algorithms.md installs it first)."""
    return "demo-reinforce" in command or "DemoColumns-v0" in command


@pytest.mark.slow
def test_every_docs_train_command_on_a_shipped_model_ends_at_or_above_its_start(tmp_path: Path) -> None:
    """Run in order in one directory (the README's second command reads the first's config.toml), with
    the environment a user has: no SRPO_MODEL_DEFAULTS."""
    commands = _doc_train_commands()
    assert any(c.startswith("README.md") for c, _ in commands), commands
    (tmp_path / "agents").symlink_to(ROOT / "agents")
    env = {k: v for k, v in os.environ.items() if k != "SRPO_MODEL_DEFAULTS"}
    python = Path(sys.executable)
    if any(_needs_demo_plugin(c) for _, c in commands):  # as docs/algorithms.md says: the plugin installed
        python = plugin_venv(tmp_path / "plugin")
    for where, command in commands:
        args = shlex.split(command)[2:]
        srpo = [str(python if _needs_demo_plugin(command) else sys.executable), "-m", "srpo_cli.app"]
        done = subprocess.run([*srpo, "train", *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{where}: {done.stderr[-2000:]}"
        out = args[args.index("--out") + 1] if "--out" in args else "runs/train"
        summary = json.loads((tmp_path / out / "summary.json").read_text())
        assert summary["evaluations"] >= 2, f"{where}: not evaluated at start and end"
        assert summary["final_accuracy"] >= summary["start_accuracy"], f"{where}: {summary['line']}"
        print(f"{where}: {summary['line']}")


def test_ctrl_c_says_where_the_checkpoint_is_and_exits_130(tiny_model_dir: Path, tmp_path: Path) -> None:
    """SIGINT once the first checkpoint exists: one line, naming it and --resume, and exit 130."""
    import signal
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "srpo_cli.app", "train", "--model", str(tiny_model_dir), "--out", str(run),
            "--iterations", "200", "--tasks-per-iter", "1", "--group-size", "2", "--max-new-tokens", "4",
            "--eval-every", "0", "--save-every", "1",
        ],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run / "checkpoint" / "manifest.json").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: the last checkpoint is ") and "--resume" in last, err[-2000:]
    assert str(run / "checkpoint") in last and "Traceback" not in err
