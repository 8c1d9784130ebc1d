"""``srpo bench ...``: evaluate a local model on a benchmark suite (wired into ``srpo`` by the lead).

One command per room: ``eval`` (:mod:`benchmarks.eval_cli`), ``compare`` / ``ablation`` / ``report`` /
``power`` (:mod:`benchmarks.compare_cli`) and ``quick``, the main job (:mod:`benchmarks.quick_cli`); this
module assembles the ``bench`` group and warns when the code that runs is another checkout's.
"""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import presets
from benchmarks.compare_cli import ablation_cmd, compare_cmd, power_cmd, report_cmd
from benchmarks.eval_cli import eval_cmd
from benchmarks.presets import (  # noqa: F401  (re-exported: the presets' old home)
    BUNDLED_COLUMNS_MODEL,
    BUNDLED_MODEL,
    BUNDLED_SEARCH_MODEL,
    COMPARE_DEFAULTS,
    QUICK_SETTINGS,
    QUICK_SUITES,
    QUICK_TRAIN,
    QUICK_WORKERS,
    TRAINING_ENVS,
    TrainingEnv,
)
from benchmarks.quick_cli import quick_cmd

app = typer.Typer(help="Benchmarks: evaluate models on the benchmark suites.", no_args_is_help=True)


@app.callback()
def bench() -> None:
    """Benchmarks: evaluate models on the benchmark suites (a callback keeps this a command group)."""
    warn_other_checkout()


def warn_other_checkout(cwd: Path | None = None) -> str | None:
    """Warn (stderr) when the working directory lies in a srpo checkout other than the one whose code
    runs, and return the warning. The ``srpo`` command imports the package from wherever
    ``pip install -e`` last ran (``.ci/run`` on a clean clone re-points it there), so preset edits made
    in this checkout would silently not reach the run: the likely reason a quick-search lr edit once
    left ``compare_config.json`` at 1e-4."""
    code_root = Path(presets.__file__).resolve().parent.parent
    here = (cwd or Path.cwd()).resolve()
    for root in (here, *here.parents):
        if (root / "pyproject.toml").is_file() and (root / "benchmarks" / "presets.py").is_file():
            if root == code_root:
                return None
            msg = (
                f"warning: srpo runs the code in {code_root}, not this checkout {root}: edits here do not "
                "reach the run (`pip install -e .` here, or run `python -m srpo_cli` from here)"
            )
            typer.echo(msg, err=True)
            return msg
    return None



app.command("eval")(eval_cmd)
app.command("compare")(compare_cmd)
app.command("ablation")(ablation_cmd)
app.command("report")(report_cmd)
app.command("power")(power_cmd)
app.command("quick")(quick_cmd)
