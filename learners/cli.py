"""``srpo train``: rollout -> update iterations with any registered algorithm.

The options are generated from :class:`learners.config.TrainConfig` (CleanRL style: the config
dataclass *is* the command line; each field's docstring is its ``--help`` text), so a new config
field is a new option with no edit here. ``--algo`` accepts every name in
:data:`learners.algorithms.ALGORITHMS`, including ones registered by user code before the command
runs.

Experiment files: ``srpo train --config exp.toml --set rollout.group_size=8`` reads the config's sections
(:mod:`learners.config`; defaults < file < options given on the command line < ``--set``), and every run
writes its resolved config to ``OUT/config.toml``, so ``srpo train --config OUT/config.toml`` reruns it.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

import srpo_envs
from agents.model_source import ModelNotAvailable
from learners.algorithms import ALGORITHMS, get_algorithm
from learners.checkpoint import CheckpointError
from learners.config import TRAIN_SECTIONS, train_layout
from learners.memory_plan import GIB, MemoryPlanError, PlanOptions, load_model_shape, plan_memory
from learners.profiles import profile
from learners.served import LogprobMismatchError
from learners.trainer import TrainConfig, run_summary, train
from srpo_common.cli import Profile, dataclass_command
from srpo_common.interrupt import set_resume_point

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
    # one --help panel per experiment-file section ([run], [rollout], [update], ...)
    panels={name: f"Section {sec}" for sec, names in TRAIN_SECTIONS.items() for name in names},
    layout=train_layout,  # --config exp.toml / --set section.field=value (learners.config)
    # settings a user did not give: those tested for the model's class (learners.profiles)
    profile=Profile(
        profile,
        "--model-defaults",
        "SRPO_MODEL_DEFAULTS",
        "settings not given take those tested for the model's class (learners.profiles: the shipped tiny models "
        "the bench settings, real checkpoints the recipes' lr); --no-model-defaults: the plain defaults",
    ),
)
def train_command(
    cfg: TrainConfig,
    workflow: Annotated[
        str | None,
        typer.Option(help="env workflow (default: the env's own, e.g. routed for MathVerify-Routed-v0)"),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue from OUT/checkpoint/ (an error if there is none); with a larger --iterations a "
            "finished run trains on",
        ),
    ] = False,
    plan_only: Annotated[
        bool,
        typer.Option(
            "--plan-only",
            help="print the GPU memory plan of this run (weights, gradients, AdamW moments, vLLM share, "
            "activations per micro-batch; what would fit if it does not) and exit: 0 fits, 1 does not. "
            "Needs only the model's config.json (a directory, a config.json, or a cached hub id)",
        ),
    ] = False,
    plan_gpu_gb: Annotated[
        float | None,
        typer.Option(help="--plan-only: GiB of each GPU (default: this machine's first GPU)"),
    ] = None,
    plan_gpus: Annotated[
        int, typer.Option(help="--plan-only: GPUs (ranks) of the run, e.g. torchrun's --nproc_per_node")
    ] = 1,
    plan_response_share: Annotated[
        float | None,
        typer.Option(
            help="--plan-only: response tokens / all tokens of a micro-batch (only they get "
            "logits; default: max-new-tokens / (192 + max-new-tokens), 0.84 at 1024; long math answers ~0.85)"
        ),
    ] = None,
) -> None:
    """Train a team of LLM agents on an env (SRPO, GRPO, Dr.GRPO, GSPO, Dr. MAS, AT-GRPO, RLOO, MAPPO)."""
    if workflow is not None:
        cfg = dataclasses.replace(cfg, env_kwargs={**cfg.env_kwargs, "workflow": workflow})
    if plan_only:
        raise typer.Exit(_print_plan(cfg, plan_gpu_gb, plan_gpus, plan_response_share))
    if resume:  # until this run writes a newer one (Trainer.save_checkpoint says so then)
        set_resume_point(f"the checkpoint in {cfg.out_dir} is kept; rerun the same command to continue from it")
    elif cfg.save_every:
        set_resume_point(
            f"no checkpoint was written yet in {cfg.out_dir} (the first at iteration {cfg.save_every}): rerun "
            "the command to start again"
        )
    else:
        set_resume_point(f"--save-every 0 writes no checkpoint in {cfg.out_dir}: rerun the command to start again")
    try:
        history = train(cfg, resume=resume, log=typer.echo)
    except (CheckpointError, ModelNotAvailable, MemoryPlanError, LogprobMismatchError) as exc:  # one message
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    summary = run_summary(history)  # also in OUT/summary.json
    if summary["evaluations"]:
        typer.echo(summary["line"])


def _print_plan(cfg: TrainConfig, gpu_gb: float | None, gpus: int, response_share: float | None = None) -> int:
    """``--plan-only``: the plan of ``cfg`` on ``gpus`` GPUs of ``gpu_gb`` GiB; 0 when it fits, else 1."""

    if gpus < 1:
        raise typer.BadParameter(f"--plan-gpus must be >= 1, got {gpus}")
    if gpu_gb is None:
        import torch

        if not torch.cuda.is_available():
            typer.echo("error: no GPU here: give the card's size with --plan-gpu-gb (e.g. 80)", err=True)
            raise typer.Exit(2)
        total = torch.cuda.get_device_properties(0).total_memory
    else:
        if gpu_gb <= 0:
            raise typer.BadParameter(f"--plan-gpu-gb must be > 0, got {gpu_gb}")
        total = int(gpu_gb * GIB)
    env = srpo_envs.make(cfg.env_id, **cfg.env_kwargs)
    roles = len({env.role_of(a) for a in env.possible_agents})
    try:
        shape = load_model_shape(cfg.model)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if response_share is not None and not 0 < response_share <= 1:
        raise typer.BadParameter(f"--plan-response-share must be in (0, 1], got {response_share}")
    options = PlanOptions.from_train_config(
        cfg, roles, gpus, critic=get_algorithm(cfg.algo).critic, response_share=response_share
    )
    plan = plan_memory(shape, options, total)
    typer.echo(plan.table())
    return 0 if plan.fits else 1
