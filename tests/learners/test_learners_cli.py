"""``srpo train``: options generated from TrainConfig, every algorithm listed, the env's own workflow."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import learners.cli
from learners.trainer import TrainConfig
from srpo_cli.app import app

ALGOS = ("srpo", "grpo", "dr-grpo", "gspo", "dr-mas", "at-grpo", "rloo", "mappo")


def test_help_lists_every_algorithm_and_generated_options() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ALGOS:
        assert name in result.output, name
    for option in (
        "--max-tokens-per-microbatch",
        "--minibatches-per-iter",
        "--dtype",
        "--device",
        "--adv-scale",
    ):
        assert option in result.output, option
    assert "generation budget per output" in result.output  # a field docstring became help text


def _captured_config(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> TrainConfig:
    seen: list[TrainConfig] = []

    def fake_train(cfg: TrainConfig, resume: bool = False, log=None) -> list:
        seen.append(cfg)
        return []

    monkeypatch.setattr(learners.cli, "train", fake_train)
    result = CliRunner().invoke(app, ["train", "--model", "m", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_is_accepted(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _captured_config(monkeypatch, ["--algo", algo]).algo == algo


def test_unknown_algorithm_is_a_usage_error_listing_the_known_ones() -> None:
    result = CliRunner().invoke(app, ["train", "--model", "m", "--algo", "ppo2"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "known" in result.output and "rloo" in result.output


@pytest.mark.parametrize(
    ("env_id", "workflow"), [("MathVerify-Routed-v0", "routed"), ("MultiTurnSearch-v0", None)]
)
def test_the_env_workflow_is_the_default(
    env_id: str, workflow: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --workflow the env's own workflow trains (the CLI used to force proposers-aggregator,
    which silently retargeted the routed env and broke every search env)."""
    import srpo_envs

    cfg = _captured_config(monkeypatch, ["--env", env_id])
    assert "workflow" not in cfg.env_kwargs
    env = srpo_envs.make(cfg.env_id, **cfg.env_kwargs)
    if workflow is not None:
        assert env.unwrapped.workflow == workflow
    explicit = _captured_config(monkeypatch, ["--env", "MathVerify-v0", "--workflow", "routed"])
    assert explicit.env_kwargs["workflow"] == "routed"


def test_kv_options_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _captured_config(
        monkeypatch,
        [
            "--env-kwarg",
            "dataset=procedural-columns",
            "--env-kwarg",
            "difficulty=[2,3]",
            "--gradient-checkpointing",
        ],
    )
    assert cfg.env_kwargs == {"dataset": "procedural-columns", "difficulty": [2, 3]}
    assert cfg.gradient_checkpointing is True
