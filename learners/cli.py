"""``srpo train``: rollout -> update iterations with any registered algorithm.

The options are generated from :class:`learners.trainer.TrainConfig` (CleanRL style: the config
dataclass *is* the command line; each field's docstring is its ``--help`` text), so a new config
field is a new option with no edit here. ``--algo`` accepts every name in
:data:`learners.algorithms.ALGORITHMS`, including ones registered by user code before the command
runs.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from agents.model_source import ModelNotAvailable
from learners.algorithms import ALGORITHMS
from learners.checkpoint import CheckpointError
from learners.trainer import TrainConfig, train
from srpo_common.cli import dataclass_command

_ALGO_HELP = "algorithm, one of: " + ", ".join(
    f"{name} ({spec.description})" if spec.description else name for name, spec in ALGORITHMS.items()
)


@dataclass_command(
    TrainConfig,
    names={
        "env_id": "--env",
        "out_dir": "--out",
        "env_kwargs": "--env-kwarg",
        "eval_env_kwargs": "--eval-env-kwarg",
    },
    helps={"algo": _ALGO_HELP},
)
def train_command(
    cfg: TrainConfig,
    workflow: Annotated[
        str | None,
        typer.Option(help="env workflow (default: the env's own, e.g. routed for MathVerify-Routed-v0)"),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from OUT/checkpoint/ (an error if there is none)")
    ] = False,
) -> None:
    """Train a team of LLM agents on an env (SRPO, GRPO, Dr.GRPO, GSPO, Dr. MAS, AT-GRPO, RLOO, MAPPO)."""
    if workflow is not None:
        cfg = dataclasses.replace(cfg, env_kwargs={**cfg.env_kwargs, "workflow": workflow})
    try:
        history = train(cfg, resume=resume, log=typer.echo)
    except (CheckpointError, ModelNotAvailable) as exc:  # missing checkpoint or model: one line, no traceback
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    evals = [(h["iteration"], h["eval_accuracy"]) for h in history if h.get("eval_accuracy") is not None]
    if evals:
        typer.echo(
            f"held-out accuracy: {evals[0][1]:.3f} (iteration {evals[0][0]}) -> "
            f"{evals[-1][1]:.3f} (iteration {evals[-1][0]})"
        )
