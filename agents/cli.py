"""``srpo model ...``: make and inspect local models (no hub access needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
    from agents.corpus import CORPORA
    from agents.tiny import SIZES, init_tiny

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
