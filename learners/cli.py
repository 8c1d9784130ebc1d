"""``srpo train``: rollout -> update iterations for SRPO, GRPO or MAPPO."""

from __future__ import annotations

import json

import typer

from learners.checkpoint import CheckpointError
from learners.trainer import ALGORITHMS, SHARING, SRPO_NORMS, TrainConfig, train


def train_command(
    algo: str = typer.Option("srpo", help=f"one of {', '.join(ALGORITHMS)}"),
    env: str = typer.Option("ProcArith-v0", "--env", help="registered env id"),
    model: str = typer.Option(..., help="model directory or hub id (e.g. from `srpo model sft`)"),
    out: str = typer.Option("runs/train", help="run directory: metrics.jsonl, checkpoint/, final/"),
    workflow: str = typer.Option("proposers-aggregator", help="env workflow"),
    env_kwarg: list[str] = typer.Option([], help="extra env kwargs KEY=JSON (repeatable)"),
    sharing: str = typer.Option("shared", help=f"parameter sharing: {', '.join(SHARING)}"),
    iterations: int = 30,
    tasks_per_iter: int = 8,
    group_size: int = 4,
    epochs: int = 2,
    rows_per_batch: int = 64,
    lr: float = 3e-4,
    clip_eps: float = 0.2,
    norm: str = typer.Option("sqrt", help=f"SRPO set normalisation: {', '.join(SRPO_NORMS)}"),
    agg: str = typer.Option("token-mean", help="GRPO/MAPPO loss aggregation"),
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    eval_every: int = 10,
    eval_problems: int = 64,
    save_every: int = 5,
    seed: int = 0,
    tensorboard: bool = False,
    resume: bool = typer.Option(
        False, "--resume", help="continue from OUT/checkpoint/ (an error if there is none)"
    ),
) -> None:
    """Train a team of LLM agents on an env with SRPO, GRPO or MAPPO."""
    env_kwargs: dict = {"workflow": workflow}
    for item in env_kwarg:
        key, _, value = item.partition("=")
        try:
            env_kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            env_kwargs[key] = value
    cfg = TrainConfig(
        algo=algo,
        model=model,
        out_dir=out,
        env_id=env,
        env_kwargs=env_kwargs,
        sharing=sharing,
        iterations=iterations,
        tasks_per_iter=tasks_per_iter,
        group_size=group_size,
        epochs=epochs,
        rows_per_batch=rows_per_batch,
        lr=lr,
        clip_eps=clip_eps,
        norm=norm,
        agg=agg,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        eval_every=eval_every,
        eval_problems=eval_problems,
        save_every=save_every,
        seed=seed,
        tensorboard=tensorboard,
    )
    try:
        history = train(cfg, resume=resume, log=typer.echo)
    except CheckpointError as exc:  # missing or corrupt checkpoint: one line, not a traceback
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    evals = [(h["iteration"], h["eval_accuracy"]) for h in history if h.get("eval_accuracy") is not None]
    if evals:
        typer.echo(
            f"held-out accuracy: {evals[0][1]:.3f} (iteration {evals[0][0]}) -> "
            f"{evals[-1][1]:.3f} (iteration {evals[-1][0]})"
        )
