"""``srpo model ...``: make and inspect local models (no hub access needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

import srpo_envs
from agents.corpus import CORPORA
from agents.model_source import ModelNotAvailable, resolve_model
from agents.openai_policy import parse_model_spec, served_policies
from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutCollector
from agents.tiny import SIZES, init_tiny

app = typer.Typer(help="Local models: build tiny test models.", no_args_is_help=True)


@app.callback()
def model() -> None:
    """Local models: build tiny test models (a callback keeps this a group even with one command)."""


@app.command("init-tiny")
def init_tiny_cmd(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the model and tokenizer to.")],
    size: Annotated[
        str, typer.Option(help="tiny (~0.85M params), mini (~2.4M), small (~5M) or base (~30M).")
    ] = "mini",
    arch: Annotated[str, typer.Option(help="llama or qwen2.")] = "llama",
    seed: Annotated[int, typer.Option(help="Weight initialisation seed.")] = 0,
    corpus: Annotated[
        str, typer.Option(help="Train the tokenizer on the texts of the math or the (KB) search envs.")
    ] = "math",
) -> None:
    """Write a randomly initialised causal LM with a locally trained BPE tokenizer to OUT.

    The directory loads with AutoModelForCausalLM/AutoTokenizer.from_pretrained(OUT).
    """

    if size not in SIZES:
        raise typer.BadParameter(f"--size must be one of {', '.join(SIZES)}")
    if arch not in ("llama", "qwen2"):
        raise typer.BadParameter("--arch must be llama or qwen2")
    if corpus not in CORPORA:
        raise typer.BadParameter(f"--corpus must be one of {', '.join(CORPORA)}")
    info = init_tiny(out, size=size, arch=arch, seed=seed, domain=corpus)  # type: ignore[arg-type]
    typer.echo(f"wrote {info.path}: arch={info.arch} size={info.size} seed={info.seed}")
    typer.echo(f"parameters: {info.n_params:,}")
    typer.echo(f"vocab size: {info.vocab_size}")


def llm_demo(
    model: str,
    *,
    base_url: list[str] | None,
    env_id: str,
    workflow: str,
    episodes: int,
    seed: int,
    as_json: bool,
    temperature: float = 0.7,
    max_new_tokens: int = 128,
    api: str = "auto",
    echo: Callable[[str], None] = typer.echo,
) -> None:
    """``srpo demo --model M``: an LLM team (``openai:NAME`` on a server, or a local model directory) plays
    ``episodes`` episodes of an env; every recorded event is printed as for the scripted teams."""
    import json

    served = parse_model_spec(model)
    if served is not None:
        if not base_url:
            raise typer.BadParameter("an openai: model needs --base-url URL", param_hint="--base-url")
        try:
            policies = served_policies(served, base_url, api=api)  # type: ignore[arg-type]
        except ValueError as exc:  # a failing server is an OpenAIServerError: the external-service status
            raise typer.BadParameter(str(exc), param_hint="--base-url") from None
    else:
        from agents.hf import HFPolicy

        try:
            policies = PolicyMap.shared(HFPolicy(str(resolve_model(model))))
        except ModelNotAvailable as exc:
            raise typer.BadParameter(str(exc), param_hint="--model") from None
    try:
        srpo_envs.make(env_id, workflow=workflow)
    except (KeyError, ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc.args[0] if exc.args else exc)) from None
    collector = RolloutCollector(
        lambda: srpo_envs.make(env_id, workflow=workflow),
        policies,
        SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
    )
    batch = collector.collect(list(range(episodes)), group_size=1, seed=seed)
    for env, stats in zip(collector._envs, batch.episodes, strict=False):
        if as_json:
            for event in batch.events[stats.episode_id]:
                echo(json.dumps(event.to_dict(), ensure_ascii=False, default=str))
        else:
            echo(env.render())
            echo(f"# team tokens {stats.team_tokens}")
            echo("")
    reasons = {r.meta["evaluation_only"] for r in batch.rows if r.meta.get("evaluation_only")}
    trainable = "evaluation only: " + "; ".join(sorted(reasons)) if reasons else "trainable (exact ids + log-probs)"
    correct = sum(e.correct for e in batch.episodes)
    echo(f"{env_id} [{workflow}] model={model}: {correct}/{episodes} correct; rows {trainable}")
