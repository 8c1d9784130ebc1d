"""The ``srpo`` command: one typer app wiring the packages' own command groups, and its error boundary.

Every ``srpo`` command runs inside :func:`main`, which turns the failures a user can meet - a corrupt
or hostile file, a refused checkpoint, a full disk, a diverged run - into one line on stderr and a
documented exit status (:data:`EXIT_CODES`); the traceback is printed only with ``--debug`` (anywhere
on the command line) or ``SRPO_DEBUG=1``. Unexpected exceptions are bugs: one line naming the
exception and exit 70, the traceback again with ``--debug``.

Exit status:

* 0 - success
* 1 - a check failed: ``leaderboard validate`` found invalid records, ``reproduce`` found mismatches,
  ``render`` left invalid records off the page
* 2 - bad usage or bad input: an unknown option or value, a missing, corrupt, oversized or too deeply
  nested file, a checkpoint refused by its manifest or its contents, an invalid record
* 3 - training diverged: non-finite loss or gradients for ``--max-nonfinite-steps`` optimizer steps in
  a row, or an update past the divergence guard's ``--guard-*`` thresholds (:mod:`learners.guard`); the
  last good checkpoint is kept, the diverged weights are neither checkpointed nor exported
* 4 - the system failed: disk full (ENOSPC, quota), permission denied, out of memory, other OS errors
* 5 - an external service failed: an OpenAI-compatible server, a retrieval server or an env server
  answered an error (5xx, 429 past the retries), malformed JSON or nothing
  (:class:`srpo_common.errors.ExternalServiceError`); the line names the service, its URL, the HTTP
  status and what to do
* 70 - internal error (a bug in srpo): please report it with the ``--debug`` traceback
* 130 - interrupted (Ctrl-C)
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click
import typer

import srpo_envs
from agents.cli import app as model_app
from agents.cli import llm_demo
from agents.scripted import ScriptedTeam
from benchmarks.cli import app as bench_app
from leaderboards.cli import app as leaderboard_app
from leaderboards.cli import configure
from learners.cli import train_command
from learners.sft_cli import sft_command, warm_start_command
from srpo_common import plugins
from srpo_common.interrupt import interrupted_line
from srpo_envs.cli import app as envs_app


def _clicks(name: str) -> tuple[type[BaseException], ...]:
    """click's exception class ``name`` from click and from the copy typer vendors (``typer._click``), which
    raises its own classes: the boundary must catch either."""
    mods = [click.exceptions]
    with contextlib.suppress(ImportError):
        mods.append(importlib.import_module("typer._click.exceptions"))
    return tuple({getattr(m, name) for m in mods if hasattr(m, name)})


_NO_ARGS, _CLICK_ERROR, _ABORT = _clicks("NoArgsIsHelpError"), _clicks("ClickException"), _clicks("Abort")

#: Exit status -> meaning (the module docstring explains each).
EXIT_CODES = {
    0: "success",
    1: "a check failed (invalid records, reproduction mismatches)",
    2: "bad usage or bad input (options, corrupt/hostile/missing files, refused checkpoints)",
    3: "training diverged (non-finite loss or gradients, or past a --guard-* threshold)",
    4: "the system failed (disk full, permission denied, out of memory, other OS errors)",
    5: "an external service failed (OpenAI-compatible, retrieval or env server: named in the message)",
    70: "internal error (a bug: rerun with --debug and report the traceback)",
    130: "interrupted",
}
_EPILOG = "Exit status: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()) + "."

app = typer.Typer(
    help="srpo: multi-agent LLM environments, learners, benchmarks and leaderboards.",
    no_args_is_help=True,
    epilog=_EPILOG,
)


@app.callback()
def _options(
    debug: bool = typer.Option(
        False, "--debug", help="Print the full traceback of an error (also: SRPO_DEBUG=1); any position."
    ),
    imports: list[str] | None = typer.Option(
        None,
        "--import",
        help="import MODULE (or call MODULE:FUNCTION) first, so that what it registers (an env, algorithm, "
        "suite, tracker) can be named; repeatable, any position. Installed packages' `srpo.plugins` entry "
        "points load on their own",
    ),
) -> None:
    """srpo: multi-agent LLM environments, learners, benchmarks and leaderboards."""
    if debug:
        os.environ["SRPO_DEBUG"] = "1"
    plugins.import_modules(imports or [])  # app() called directly; main() took them off the line already


@app.command("envs")
def list_envs() -> None:
    """List registered env ids."""

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

    if model is not None:
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

    def grader() -> object:
        from benchmarks.evidence import SuiteGrader

        return SuiteGrader()

    def reproducer(*args: object, **kwargs: object) -> object:
        from benchmarks.evidence import reproduce

        return reproduce(*args, **kwargs)

    configure(grader_factory=grader, reproducer=reproducer)


_wire()


#: Exceptions that mean "this input (file, option, checkpoint) is not acceptable": exit 2. By name
#: and module, so that the boundary imports nothing a command did not already import.
INPUT_ERRORS = {
    ("learners.checkpoint", "CheckpointError"),
    ("learners.checkpoint", "CheckpointConfigError"),
    ("learners.tracking", "TrackerError"),
    ("srpo_common.plugins", "PluginError"),
    ("leaderboards.schema", "RecordValidationError"),
    ("leaderboards.evidence", "EvidenceError"),
    ("leaderboards.store", "StoreError"),
    ("leaderboards.signing", "SigningError"),
    ("benchmarks.evidence", "ReproduceError"),
    ("agents.model_source", "ModelNotAvailable"),
    ("srpo_common.jsonsafe", "JSONDepthError"),
    ("json.decoder", "JSONDecodeError"),
    ("builtins", "UnicodeDecodeError"),
}
#: A run that stopped itself: non-finite training or the divergence guard (exit 3).
NONFINITE_ERROR = ("learners.state_check", "NonFiniteError")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _one_line(text: str, limit: int = 600) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def classify(exc: BaseException) -> tuple[int, str]:
    """Exit status and the one line to print for an exception that escaped a command."""
    names = {(k.__module__, k.__qualname__) for k in type(exc).__mro__}
    if isinstance(exc, KeyboardInterrupt):
        return 130, interrupted_line()
    if ("srpo_common.errors", "ExternalServiceError") in names:  # before OSError: EnvServerError is one
        return 5, f"error: {_one_line(exc.one_line())}"  # type: ignore[attr-defined]
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        where = f" writing {exc.filename}" if exc.filename else ""
        return 4, f"error: disk full{where} ({exc.strerror or exc}); nothing half-written was published"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return 4, f"error: {exc.strerror or exc}{where}"
    if isinstance(exc, MemoryError):
        return 4, "error: out of memory"
    if type(exc).__name__ == "SafetensorError":  # safetensors' own type; its I/O errors are in the text
        text = str(exc)
        if "No space left" in text or "code: 28" in text or "StorageFull" in text:
            return 4, f"error: disk full while writing tensors ({_one_line(text, 200)})"
        return 2, f"error: unreadable safetensors file ({_one_line(text, 300)})"
    if isinstance(exc, RecursionError):
        return 2, "error: input nested too deeply to process (a hostile or corrupt file?)"
    if NONFINITE_ERROR in names:
        return 3, f"error: {_one_line(str(exc))}"
    if names & INPUT_ERRORS:
        errors = getattr(exc, "errors", None)
        if isinstance(errors, list) and errors:  # RecordValidationError: first problem and a count
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            source = getattr(exc, "source", None)
            return 2, _one_line(f"invalid: {source + ': ' if source else ''}{errors[0]}{more}")
        return 2, f"error: {_one_line(str(exc))}"
    return 70, (
        f"internal error: {type(exc).__name__}: {_one_line(str(exc), 300)} "
        "(a bug; rerun with --debug for the traceback and report it)"
    )


def _close_progress_bars() -> None:
    """Finish any tqdm bar a failed command left open, so the error gets a line of its own."""
    tqdm = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or []):
        with contextlib.suppress(Exception):  # cosmetic: never let it hide the real error
            bar.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``srpo`` with its error boundary (see the module docstring for the exit status)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("SRPO_DEBUG") == "1"
    args = [a for a in args if a != "--debug"]
    args, imports = _take_imports(args)
    try:
        # plugins before the command parses: `--algo THEIRS` and `--env THEIRS` must be registered by then
        plugins.load_entry_points()
        plugins.import_modules(imports)
        # standalone_mode=False: click hands usage errors to this boundary (one line) instead of printing
        # its boxed panel, and returns an ``Exit``'s code; typer turns Ctrl-C into Exit(130) itself
        code = app(args=args, prog_name="srpo", standalone_mode=False)
    except SystemExit:
        raise
    except _NO_ARGS as exc:  # `srpo bench` alone: its help, as click prints it
        print(exc.format_message(), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except _CLICK_ERROR as exc:  # a usage error (exit 2) or a file click could not open
        print(_usage_line(exc), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except _ABORT:  # end of input at a prompt
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BaseException as exc:  # noqa: BLE001 - the boundary: every failure is one line and a status
        code, line = classify(exc)
        _close_progress_bars()
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        print(line, file=sys.stderr)
        raise SystemExit(code) from None
    if code == 130:  # KeyboardInterrupt, turned into Exit(130) by typer: say where the run can go on
        _close_progress_bars()
        print(interrupted_line(), file=sys.stderr)
    # commands return None: an int here is the code of a typer.Exit they raised (0: success); like click's
    # standalone mode, main() always ends with SystemExit, so a caller sees the status either way
    raise SystemExit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


def _take_imports(args: list[str]) -> tuple[list[str], list[str]]:
    """``--import MODULE`` / ``--import=MODULE`` anywhere on the command line (like ``--debug``): the
    modules, and the arguments without them."""
    rest: list[str] = []
    modules: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":  # everything after is the command's own
            rest += args[i:]
            break
        if a == "--import" and i + 1 < len(args):
            modules.append(args[i + 1])
            i += 2
            continue
        if a.startswith("--import="):
            modules.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return rest, modules


def _usage_line(exc: Any) -> str:
    """``error: srpo train: <message> (see 'srpo train --help')``: one line, the message cut to fit."""
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None and exc.exit_code == 2 else ""
    return f"error: {where}{_one_line(exc.format_message(), 400)}{hint}"


if __name__ == "__main__":
    main()
