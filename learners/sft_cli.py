"""``srpo model sft`` and ``srpo model warm-start``: supervised warm starts from the command line.

The options of ``sft`` are generated from :class:`learners.sft.SFTConfig` (one ``--option`` per field,
the field's docstring as its help; :func:`srpo_common.cli.dataclass_command`), so a new SFT setting
needs one field and no CLI edit. The commands are wired into the ``srpo model`` group by
:mod:`srpo_cli.app` (``agents`` owns that group but may not import ``learners``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from learners.presets import RECIPES
from learners.sft import SFTConfig, run_sft, warm_start
from srpo_common.cli import dataclass_command


@dataclass_command(SFTConfig)
def sft_command(
    cfg: SFTConfig,
    model: Annotated[
        str, typer.Option(help="model directory to warm-start (e.g. from `srpo model init-tiny`)")
    ],
    out: Annotated[str, typer.Option(help="where to save the warm-started model")],
) -> None:
    """Warm-start a model on teacher demonstrations for every role; prints held-out accuracy."""
    run_sft(model, out, cfg, log=typer.echo)


def warm_start_command(
    out: Annotated[str, typer.Option(help="where to save the warm-started model")],
    recipe: Annotated[
        str, typer.Option(help=f"which shipped checkpoint to rebuild: {', '.join(RECIPES)}")
    ] = "math",
) -> None:
    """Rebuild a shipped warm start from scratch: init-tiny (mini) + its SFT recipe (25-70 min on 2 cores).

    ``--recipe math`` reproduces agents/checkpoints/mini-sft, ``--recipe columns`` mini-columns-sft,
    ``--recipe search`` mini-search-sft, ``--recipe search-worlds`` mini-search-worlds-sft,
    ``--recipe search-worlds-routed`` mini-search-worlds-routed-sft, ``--recipe columns5``
    mini-columns5-sft (the recipes: ``learners.presets.RECIPES``).
    """
    if recipe not in RECIPES:
        raise typer.BadParameter(f"--recipe must be one of {', '.join(RECIPES)}")
    warm_start(out, recipe, log=typer.echo)
