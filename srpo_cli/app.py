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
    model: str | None = typer.Option(
        None,
        help="an LLM team instead of a scripted one: openai:NAME (served at --base-url) or a model directory",
    ),
    base_url: list[str] | None = typer.Option(
        None, "--base-url", help="openai: models: API root (ROLE=URL: a server per role; repeatable)"
    ),
    temperature: float = typer.Option(0.7, help="LLM team: sampling temperature"),
    max_new_tokens: int = typer.Option(128, min=1, help="LLM team: tokens per output"),
) -> None:
    """Roll out a scripted team (or an LLM team: --model) on real data and print every recorded event."""
    import srpo_envs
    from agents.scripted import ScriptedTeam

    if model is not None:
        from agents.cli import llm_demo

        llm_demo(
            model,
            base_url=base_url,
            env_id=env_id,
            workflow=workflow,
            episodes=episodes,
            seed=seed,
            as_json=as_json,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
        )
        return

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
    from learners.sft_cli import sft_command, warm_start_command
    from srpo_envs.cli import app as envs_app

    model_app.command("sft")(sft_command)
    model_app.command("warm-start")(warm_start_command)
    app.add_typer(model_app, name="model", help="Build and warm-start tiny models.")
    app.command("train")(train_command)
    app.add_typer(bench_app, name="bench", help="Evaluate and compare on benchmark suites.")
    app.add_typer(leaderboard_app, name="leaderboard", help="Validate, submit and render leaderboards.")
    _wire_leaderboard_hooks()
    app.registered_commands.extend(envs_app.registered_commands)
    app.registered_groups.extend(envs_app.registered_groups)  # ``srpo index build``


def _wire_leaderboard_hooks() -> None:
    """``leaderboards`` may not import env or model code, so the grader that ``validate`` regrades with
    and the sample re-generator of ``reproduce`` are passed in here (imported only when used)."""
    from leaderboards.cli import configure

    def grader() -> object:
        from benchmarks.evidence import SuiteGrader

        return SuiteGrader()

    def reproducer(*args: object, **kwargs: object) -> object:
        from benchmarks.evidence import reproduce

        return reproduce(*args, **kwargs)

    configure(grader_factory=grader, reproducer=reproducer)


_wire()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
