"""``srpo leaderboard ...``: submit, validate and render result records.

Exit status is the contract for CI: ``validate`` exits 1 when anything is invalid, after printing
every problem (not just the first), so one CI run shows all that needs fixing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .render import write_leaderboard
from .schema import RecordValidationError, load_record
from .store import LeaderboardStore, StoreError

app = typer.Typer(help="Leaderboard records: submit, validate, render.", no_args_is_help=True)


def _fail(lines: list[str], code: int = 1) -> None:
    for line in lines:
        typer.echo(line, err=True)
    raise typer.Exit(code)


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="Record JSON file to add.")],
    store: Annotated[Path, typer.Option("--store", help="Store directory.")],
) -> None:
    """Validate FILE and copy it into the store under its canonical name."""
    try:
        record = load_record(file)
        path = LeaderboardStore(store).submit(record)
    except RecordValidationError as exc:
        _fail([f"invalid: {exc.source or file}", *(f"  - {e}" for e in exc.errors)])
    except StoreError as exc:
        _fail([f"error: {exc}"])
    typer.echo(str(path))


@app.command()
def validate(
    files: Annotated[list[Path] | None, typer.Argument(help="Record files to validate.")] = None,
    store: Annotated[
        Path | None, typer.Option("--store", help="Validate every record in this store.")
    ] = None,
) -> None:
    """Validate record FILEs and/or a whole store; exit 1 if anything is invalid."""
    if not files and store is None:
        _fail(["error: give record files and/or --store DIR"], code=2)
    results: dict[str, list[str]] = {}
    for file in files or []:
        try:
            load_record(file)
            results[str(file)] = []
        except RecordValidationError as exc:
            results[str(file)] = exc.errors
    if store is not None:
        if not store.is_dir():
            _fail([f"error: store {store} is not a directory"], code=2)
        for name, errors in LeaderboardStore(store).validate_all().items():
            results[str(store / name)] = errors
    bad = {name: errs for name, errs in results.items() if errs}
    for name in results:
        if not results[name]:
            typer.echo(f"ok: {name}")
    if bad:
        lines = []
        for name, errs in bad.items():
            lines += [f"invalid: {name}", *(f"  - {e}" for e in errs)]
        lines.append(f"{len(bad)} of {len(results)} record(s) invalid")
        _fail(lines)
    typer.echo(f"{len(results)} record(s) valid")


@app.command()
def render(
    store: Annotated[Path, typer.Option("--store", help="Store directory.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory.")],
    metric: Annotated[str | None, typer.Option(help="Rank by this metric (default: avg@k).")] = None,
) -> None:
    """Write OUT/leaderboard.md and OUT/leaderboard.html from every record in the store."""
    try:
        records = LeaderboardStore(store).load_all(strict=True)
    except StoreError as exc:
        _fail([f"error: {exc}"])
    paths = write_leaderboard(records, out, metric=metric)
    for path in paths.values():
        typer.echo(str(path))
