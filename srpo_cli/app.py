"""The ``srpo`` command: one typer app wiring the packages' own command groups."""

from __future__ import annotations

import json

import typer

app = typer.Typer(
    help="srpo: multi-agent LLM environments, learners, benchmarks and leaderboards.", no_args_is_help=True
)


@app.command("envs")
def list_envs() -> None:
    """List registered env ids."""
    import srpo_envs

    for env_id, spec in sorted(srpo_envs.registry.items()):
        typer.echo(f"{env_id:32s} {spec.description}")


@app.command("demo")
def demo(
    env_id: str = typer.Option("MathVerify-v0", "--env", help="registered env id"),
    workflow: str = typer.Option("proposers-aggregator", help="math workflow"),
    team: str = typer.Option("noisy", help="scripted team: oracle, noisy, random"),
    episodes: int = typer.Option(3, min=1),
    seed: int = 0,
    as_json: bool = typer.Option(False, "--json", help="print events as JSON lines"),
) -> None:
    """Roll out a scripted team on real data and print every recorded event."""
    import srpo_envs
    from agents.scripted import ScriptedTeam

    env = srpo_envs.make(env_id, workflow=workflow)
    scripted = {
        "oracle": lambda: ScriptedTeam.oracle(env, route=2),
        "noisy": lambda: ScriptedTeam.noisy_oracle(env, p_correct=0.5, seed=seed),
        "random": lambda: ScriptedTeam.random(env, seed=seed),
    }[team]()
    correct = 0
    for ep in range(episodes):
        obs, infos = env.reset(seed=seed + ep)
        while env.agents:
            obs, _, _, _, infos = env.step(scripted.act(obs, infos))
        correct += bool(env.outcome.get("correct"))
        if as_json:
            for event in env.events:
                typer.echo(json.dumps(event.to_dict(), ensure_ascii=False, default=str))
        else:
            typer.echo(env.render())
            typer.echo("")
    typer.echo(f"{env_id} [{workflow}] team={team}: {correct}/{episodes} correct")


def _wire() -> None:
    """Attach each package's command group (kept in the package that owns the commands)."""
    from agents.cli import app as model_app
    from benchmarks.cli import app as bench_app
    from leaderboards.cli import app as leaderboard_app
    from learners.cli import train_command
    from srpo_envs.cli import app as envs_app

    model_app.command("sft")(sft_command)
    model_app.command("warm-start")(warm_start_command)
    app.add_typer(model_app, name="model", help="Build and warm-start tiny models.")
    app.command("train")(train_command)
    app.add_typer(bench_app, name="bench", help="Evaluate and compare on benchmark suites.")
    app.add_typer(leaderboard_app, name="leaderboard", help="Validate, submit and render leaderboards.")
    app.registered_commands.extend(envs_app.registered_commands)


def sft_command(
    model: str = typer.Option(..., help="model directory to warm-start (e.g. from `srpo model init-tiny`)"),
    out: str = typer.Option(..., help="where to save the warm-started model"),
    steps: int = 1000,
    lr: float = 2e-3,
    batch_size: int = 16,
    max_operand: int = 9,
    refine_steps: int = typer.Option(600, help="second pass at --refine-lr on new examples (0: none)"),
    refine_lr: float = 1e-3,
    seed: int = 0,
    save_dtype: str = typer.Option("float32", help="float32, or bfloat16 for a half-size checkpoint"),
    family: str = typer.Option(
        "math", help="math (procedural arithmetic, every math role) or search (KB searchers + aggregator)"
    ),
    dataset: str = typer.Option(
        "procedural",
        help="math family: procedural (nested arithmetic) or procedural-columns (column addition)",
    ),
    difficulties: str = typer.Option("1,2", help="math family: comma-separated difficulties"),
    carry_slip: float = typer.Option(
        0.0, help="procedural-columns: share of teacher solutions that forget the first carry"
    ),
) -> None:
    """Warm-start a model on teacher demonstrations for every role; prints held-out accuracy."""
    from learners.sft import SFT_FAMILIES, SFTConfig, run_sft
    from srpo_envs.tasks.math_data import PROCEDURAL_FAMILIES

    if family not in SFT_FAMILIES:
        raise typer.BadParameter(f"--family must be one of {', '.join(SFT_FAMILIES)}")
    if dataset not in PROCEDURAL_FAMILIES:
        raise typer.BadParameter(f"--dataset must be one of {', '.join(PROCEDURAL_FAMILIES)}")
    cfg = SFTConfig(
        dataset=dataset,
        difficulties=tuple(int(d) for d in difficulties.split(",") if d.strip()),
        carry_slip=carry_slip,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        max_operand=max_operand,
        refine_steps=refine_steps,
        refine_lr=refine_lr,
        seed=seed,
        save_dtype=save_dtype,
        family=family,
    )
    run_sft(model, out, cfg, log=typer.echo)


def warm_start_command(
    out: str = typer.Option(..., help="where to save the warm-started model"),
    family: str = typer.Option("math", help="math, columns or search: which shipped checkpoint to rebuild"),
) -> None:
    """Rebuild a shipped warm start from scratch: init-tiny (mini) + its SFT recipe (25-45 min on 2 cores).

    ``--family math`` reproduces agents/checkpoints/mini-sft, ``--family columns`` mini-columns-sft,
    ``--family search`` mini-search-sft.
    """
    from learners.sft import RECIPES, warm_start

    if family not in RECIPES:
        raise typer.BadParameter(f"--family must be one of {', '.join(RECIPES)}")
    warm_start(out, family, log=typer.echo)


_wire()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
