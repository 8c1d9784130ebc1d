"""srpo_common.cli: typer commands generated from config dataclasses (options, help text, validation)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import typer
from typer.testing import CliRunner

from srpo_common.cli import dataclass_command, field_docs


@dataclass
class _Base:
    seed: int = 0
    """Random seed."""


@dataclass
class _Config(_Base):
    steps: int = 10
    """Optimizer steps."""
    #: Learning rate,
    #: two comment lines.
    lr: float = 1e-3
    name: str = "x"  # an inline comment
    label: str = "a # b"
    flag: bool = False
    """Turn it on."""
    sizes: tuple[int, ...] = (1, 2)
    mode: Literal["fast", "slow"] = "fast"
    out: Path | None = None
    kwargs: dict[str, Any] = field(default_factory=lambda: {"keep": 1})

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError("steps must be >= 0")


def _app(**kw: Any) -> tuple[typer.Typer, list[Any]]:
    seen: list[Any] = []

    @dataclass_command(_Config, **kw)
    def run(cfg: _Config, tag: Annotated[str, typer.Option(help="an extra option")] = "t") -> None:
        """Run it."""
        seen.append((cfg, tag))

    app = typer.Typer()
    app.command("run")(run)
    app.command("other")(lambda: None)  # two commands keep ``run`` a named subcommand
    return app, seen


def test_field_docs_reads_docstrings_comments_and_bases() -> None:
    docs = field_docs(_Config)
    assert docs["seed"] == "Random seed."
    assert docs["steps"] == "Optimizer steps."
    assert docs["lr"] == "Learning rate, two comment lines."
    assert docs["name"] == "an inline comment"
    assert docs["label"] == ""  # a '#' inside a string is not a comment
    assert docs["sizes"] == ""


def test_generated_options_build_the_config() -> None:
    app, seen = _app()
    args = ["run", "--steps", "3", "--lr", "0.5", "--flag", "--sizes", "4,5,6", "--mode", "slow"]
    args += ["--kwargs", "a=1", "--kwargs", "b=[1, 2]", "--kwargs", "c=text", "--tag", "z", "--out", "o"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    cfg, tag = seen[0]
    assert tag == "z"
    assert cfg == _Config(
        steps=3, lr=0.5, flag=True, sizes=(4, 5, 6), mode="slow", out=Path("o"),
        kwargs={"keep": 1, "a": 1, "b": [1, 2], "c": "text"},
    )  # fmt: skip
    res = CliRunner().invoke(app, ["run"])
    assert res.exit_code == 0 and seen[1][0] == _Config()  # defaults are the dataclass's


def test_bad_values_are_usage_errors() -> None:
    app, seen = _app()
    runner = CliRunner()
    for args, message in (
        (["--steps", "-1"], "steps must be >= 0"),  # __post_init__'s ValueError
        (["--mode", "medium"], "fast, slow"),
        (["--sizes", "1,x"], "invalid literal"),
        (["--kwargs", "novalue"], "KEY=VALUE"),
    ):
        res = runner.invoke(app, ["run", *args], env={"COLUMNS": "200"})
        assert res.exit_code == 2, (args, res.output)
        assert message in " ".join(res.output.replace("│", " ").split()), (args, res.output)
    assert not seen


def test_help_shows_field_docs_and_options_can_be_renamed_excluded_and_redefaulted() -> None:
    app, seen = _app(exclude=("seed",), names={"steps": "--num-steps"}, defaults={"lr": 0.25})
    res = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    out = " ".join(res.output.replace("│", " ").split())
    assert "--num-steps" in out and "Optimizer steps." in out and "Learning rate, two comment lines." in out
    assert "--seed" not in out and "--no-flag" in out and "(one of: fast, slow)" in out
    assert CliRunner().invoke(app, ["run", "--num-steps", "7"]).exit_code == 0
    assert seen[0][0].steps == 7 and seen[0][0].lr == 0.25 and seen[0][0].seed == 0
    with pytest.raises(ValueError, match="unknown fields"):
        dataclass_command(_Config, exclude=("nope",))


def test_sft_command_exposes_every_sft_config_field() -> None:
    """``srpo model sft`` is generated from SFTConfig: a new field is a new documented option."""
    from learners.sft import SFTConfig
    from learners.sft_cli import sft_command, warm_start_command

    app = typer.Typer()
    app.command("sft")(sft_command)
    app.command("warm-start")(warm_start_command)
    res = CliRunner().invoke(app, ["sft", "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    docs = field_docs(SFTConfig)
    for f in dataclasses.fields(SFTConfig):
        assert "--" + f.name.replace("_", "-") in res.output
        assert docs[f.name], f"SFTConfig.{f.name} has no docstring (its --help text)"
    res = CliRunner().invoke(app, ["sft", "--model", "m", "--out", "o", "--domain", "chess"])
    assert res.exit_code == 2 and "domain must be one of" in res.output
