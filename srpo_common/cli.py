"""Command-line options generated from a config dataclass: one declaration per setting.

A package's config dataclass (``SFTConfig``, ``TrainConfig``, ...) already names every setting, its
type and its default; re-declaring them as typer options by hand lets the two drift apart. Here the
options are *generated*: :func:`dataclass_command` wraps a function ``run(cfg, **extra)`` into a typer
command that has one ``--option`` per dataclass field, builds the config from the parsed values and
calls ``run``.

The ``--help`` text of an option is its field's documentation, found in the class source, in this
order (the CleanRL/tyro convention first)::

    @dataclass
    class SFTConfig:
        steps: int = 1000
        \"\"\"Optimizer steps of the first pass.\"\"\"   # 1. a string right after the field
        #: Learning rate of the first pass.            # 2. ``#:`` comment lines right above it
        lr: float = 2e-3
        seed: int = 0  # sampling and data seed          # 3. a comment on the field's own line

How field types become options:

* ``int``, ``float``, ``str``, ``Path`` and ``X | None`` of those: one option of that type;
* ``bool``: a ``--flag/--no-flag`` pair;
* ``Literal["a", "b"]``: a string checked against the choices;
* ``tuple[T, ...]`` / ``list[T]``: one comma-separated option (``--difficulties 1,2``);
* ``dict[str, ...]``: a repeatable ``KEY=VALUE`` option parsed by :func:`srpo_common.kv.parse_kv`
  (values as JSON when they parse), merged over the field's default.

Usage (``run``'s own parameters after the config become extra options, declared the typer way)::

    @dataclass_command(SFTConfig, exclude=("kb_seed",), names={"env_id": "--env"})
    def sft_command(
        cfg: SFTConfig, model: Annotated[str, typer.Option(help="model directory")]
    ) -> None:
        \"\"\"Warm-start MODEL on teacher demonstrations.\"\"\"  # the command's help
        run_sft(model, cfg)

    app.command("sft")(sft_command)

A ``ValueError`` raised while building the config (``__post_init__`` validation) becomes a
``typer.BadParameter``, so bad input is a usage error with the config's own message, not a traceback.

Experiment files: with ``layout=`` (a :class:`srpo_common.config_file.Layout` of the dataclass, or a
function returning one) the command also takes ``--config FILE`` (TOML in the layout's sections) and
repeatable ``--set section.field=value``. Precedence, lowest first: the dataclass's (or ``defaults=``)
value < the file < an option given on the command line < ``--set``. An option counts as given when click
says its value came from the command line (or an environment variable), not from its default, so a
flag repeated at its default value still beats the file. A ``dict`` option's ``KEY=VALUE`` items merge
over the file's table. An unknown key is a usage error naming the nearest valid one.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import typer

from srpo_common.config_file import ConfigFileError, Layout
from srpo_common.fieldcheck import strip_optional
from srpo_common.kv import parse_kv

T = TypeVar("T")
R = TypeVar("R")

_SCALARS = (int, float, str, Path)


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's documentation (see the module docstring for where it is read from).

    Base classes are read first, so a subclass's text for a field wins. Whitespace is folded to one
    line; a field with no documentation maps to ``""``.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # defined in a REPL / exec: no source to read
            continue
        lines = source.splitlines()
        class_def = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
        body = class_def.body
        for i, node in enumerate(body):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            name = node.target.id
            text = ""
            nxt = body[i + 1] if i + 1 < len(body) else None
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                text = nxt.value.value
            else:
                above: list[str] = []
                j = node.lineno - 2  # 0-based index of the line above the field
                while j >= 0 and lines[j].strip().startswith("#:"):
                    above.insert(0, lines[j].strip()[2:].strip())
                    j -= 1
                text = " ".join(above)
                last = lines[(node.end_lineno or node.lineno) - 1]
                code = _code_part(last)
                if not text and len(code) < len(last):
                    text = last[len(code) + 1 :]
            docs[name] = " ".join(text.split())
    return docs


def _code_part(line: str) -> str:
    """The line without its trailing comment, when the ``#`` is outside a string literal."""
    in_str: str | None = None
    for i, ch in enumerate(line):
        if in_str:
            if ch == in_str:
                in_str = None
        elif ch in "\"'":
            in_str = ch
        elif ch == "#":
            return line[:i]
    return line


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return ...


class _Converter:
    """How one field travels: the option's type and default, and the option value -> field value."""

    def __init__(self, name: str, tp: Any, default: Any, option: str) -> None:
        self.name, self.option = name, option
        base, optional = strip_optional(tp)
        origin = typing.get_origin(base)
        self.kind = "scalar"
        self.suffix = ""
        if base is bool:
            self.kind, self.type, self.default = "bool", bool, default
        elif origin is Literal:
            self.values = {str(c): c for c in typing.get_args(base)}
            self.kind, self.type, self.default = "literal", str, default
            self.suffix = f" (one of: {', '.join(self.values)})"
        elif origin in (tuple, list):
            args = [a for a in typing.get_args(base) if a is not Ellipsis]
            self.item = args[0] if args else str
            if self.item not in _SCALARS:
                raise TypeError(f"field {name!r}: sequences of {self.item!r} are not supported")
            self.kind, self.type, self.container = "seq", str, origin
            self.default = ",".join(str(v) for v in default) if default not in (..., None) else default
            self.suffix = " (comma-separated)"
        elif origin is dict or base is dict:
            self.kind, self.type = "dict", list[str]
            self.base_default = dict(default) if isinstance(default, Mapping) else {}
            self.default = []
            self.suffix = " (KEY=VALUE, repeatable; VALUE parsed as JSON when it can be)"
        elif base in _SCALARS:
            self.type, self.default = base, default
        else:
            raise TypeError(f"field {name!r}: no command-line option for type {tp!r}; exclude it")
        if optional and self.kind in ("scalar", "literal", "seq"):
            self.type = self.type | None  # type: ignore[operator]

    def param_decls(self) -> tuple[str, ...]:
        options = self.option.split(",")  # "--eval-k,--k": the first is the name, the rest aliases
        if self.kind == "bool":
            flags = [o.removeprefix("--") for o in options]
            return tuple(f"--{f}/--no-{f}" for f in flags)
        return tuple(options)

    def convert(self, value: Any, base: Any = ...) -> Any:
        """The option value as the field's value; a dict option merges over ``base`` (the file's table)
        when given, else over the field's default."""
        if value is None:
            return None
        if self.kind == "literal":
            if value not in self.values:
                raise typer.BadParameter(f"must be one of {', '.join(self.values)}", param_hint=self.option)
            return self.values[value]
        if self.kind == "seq":
            try:
                items = [self.item(v.strip()) for v in str(value).split(",") if v.strip()]
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint=self.option) from None
            return self.container(items)
        if self.kind == "dict":
            try:
                merged = dict(base) if isinstance(base, Mapping) else self.base_default
                return {**merged, **parse_kv(value, option=self.option.split(",")[0])}
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint=self.option) from None
        return value


def dataclass_command(
    config_cls: type[T],
    *,
    exclude: Iterable[str] = (),
    names: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    helps: Mapping[str, str] | None = None,
    layout: Layout | Callable[[], Layout] | None = None,
    profile: Profile | None = None,
    panels: Mapping[str, str] | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorator: ``run(cfg: config_cls, **extra)`` -> a typer command with one option per field.

    ``exclude``: fields left at their dataclass default (not settable from the command line).
    ``names``: field -> option name (``{"env_id": "--env"}``; ``"--eval-k,--k"`` adds an alias); the default
    is ``--field-name``.
    ``defaults``: field -> the command's default when it differs from the dataclass's.
    ``helps``: field -> help text that replaces the field's documentation.
    ``run``'s parameters after the first are kept as extra options (typer-annotated as usual) and are
    passed through by name; a field may not share a name with one of them.
    ``layout``: adds ``--config`` and ``--set`` (see the module docstring); a function is called when the
    command runs, so a layout that cannot be built fails that command only.
    ``profile`` (with ``layout``): a :class:`Profile`, defaults that depend on other values (``srpo train``'s
    settings by model class, :mod:`learners.profiles`). Its overrides replace only the fields the user did
    not set (on the command line, in the file or by ``--set``), and a line on stderr says which ones it
    set; its ``--option/--no-option`` flag (or environment variable) turns it off.
    ``panels``: field -> the ``--help`` panel its option is listed in (e.g. its experiment-file section).
    """
    skip = set(exclude)
    names, defaults, helps = dict(names or {}), dict(defaults or {}), dict(helps or {})
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    known = {f.name for f in dataclasses.fields(config_cls)}
    for label, keys in (("exclude", skip), ("names", names), ("defaults", defaults), ("helps", helps)):
        unknown = set(keys) - known
        if unknown:
            raise ValueError(f"{label} names unknown fields of {config_cls.__name__}: {sorted(unknown)}")

    def decorate(run: Callable[..., R]) -> Callable[..., R]:
        run_sig = inspect.signature(run, eval_str=True)
        run_params = list(run_sig.parameters.values())[1:]
        extra_names = {p.name for p in run_params}
        hints = typing.get_type_hints(config_cls, include_extras=True)
        docs = field_docs(config_cls)
        converters: dict[str, _Converter] = {}
        params: list[inspect.Parameter] = []
        for f in dataclasses.fields(config_cls):
            if f.name in skip or not f.init:
                continue
            if f.name in extra_names:
                raise ValueError(f"field {f.name!r} clashes with a parameter of {run.__name__}; exclude it")
            default = defaults[f.name] if f.name in defaults else _field_default(f)
            option = names.get(f.name, "--" + f.name.replace("_", "-"))
            conv = _Converter(f.name, hints[f.name], default, option)
            converters[f.name] = conv
            help_text = (helps.get(f.name) or docs.get(f.name, "")) + conv.suffix
            info = typer.Option(
                conv.default, *conv.param_decls(), help=help_text.strip() or None,
                rich_help_panel=(panels or {}).get(f.name),
            )  # fmt: skip
            params.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=conv.type)
            )
        extra = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in run_params]
        if layout is not None:
            for name in (_CONFIG, _SETS, _CTX, _PROFILE):
                if name in extra_names or name in known:
                    raise ValueError(f"{name!r} is reserved for --config/--set; rename it")
            params += _file_params()
            if profile is not None:
                params.append(profile.parameter())

        @functools.wraps(run)
        def command(**kwargs: Any) -> R:
            if layout is None:
                values = {name: conv.convert(kwargs.pop(name)) for name, conv in converters.items()}
            else:
                use = kwargs.pop(_PROFILE) if profile is not None else False
                values = _layered(
                    config_cls, converters, kwargs, layout() if callable(layout) else layout,
                    profile.choose if use and profile is not None else None,
                )  # fmt: skip
            try:
                cfg = config_cls(**values)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
            return run(cfg, **kwargs)

        del command.__wrapped__  # typer must read the generated signature, not run's
        command.__signature__ = inspect.Signature(extra + params, return_annotation=run_sig.return_annotation)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in extra + params}
        return command

    return decorate


# ---------------------------------------------------------------------------------- --config / --set
_CONFIG, _SETS, _CTX, _PROFILE = "config_file_", "config_sets_", "click_ctx_", "profile_on_"


@dataclasses.dataclass(frozen=True)
class Profile:
    """Defaults that depend on other values (see :func:`dataclass_command`'s ``profile``)."""

    #: ``values -> (label, overrides)`` or None: the overrides for these values and what they are
    choose: Callable[[Mapping[str, Any]], tuple[str, Mapping[str, Any]] | None]
    #: the flag that turns it on and off, e.g. ``--model-defaults`` (``--no-model-defaults``)
    option: str
    #: the environment variable that sets the flag (``0``/``false`` turns it off)
    envvar: str
    help: str

    def parameter(self) -> inspect.Parameter:
        flag = self.option.removeprefix("--")
        return inspect.Parameter(
            _PROFILE, inspect.Parameter.KEYWORD_ONLY, annotation=bool,
            default=typer.Option(True, f"--{flag}/--no-{flag}", envvar=self.envvar, help=self.help),
        )  # fmt: skip


def _file_params() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(
            _CONFIG, kw, annotation=Path | None,
            default=typer.Option(
                None, "--config", help="experiment file (TOML in the config's sections, e.g. a run's "
                "config.toml); options given on the command line and --set override it",
            ),
        ),
        inspect.Parameter(
            _SETS, kw, annotation=list[str] | None,
            default=typer.Option(
                None, "--set", help="section.field=VALUE over everything else (repeatable; VALUE as TOML "
                "when it parses: 8, 1e-4, true, [1,2], else a string)",
            ),
        ),
        inspect.Parameter(_CTX, kw, annotation=typer.Context),
    ]  # fmt: skip


def _layered(
    config_cls: type,
    converters: Mapping[str, _Converter],
    kwargs: dict[str, Any],
    layout: Layout,
    profile: Callable[[Mapping[str, Any]], tuple[str, Mapping[str, Any]] | None] | None = None,
) -> dict[str, Any]:
    """The config's values: defaults < a profile's < ``--config`` file < options given on the command line
    < ``--set``."""
    path, sets, ctx = kwargs.pop(_CONFIG), kwargs.pop(_SETS) or [], kwargs.pop(_CTX)
    try:
        from_file = layout.read(path) if path is not None else {}
        from_sets = layout.parse_sets(sets)
    except ConfigFileError as exc:
        text = str(exc)
        hint = "--set" if text.startswith("--set: ") else "--config"
        raise typer.BadParameter(text.removeprefix("--set: "), param_hint=hint) from None
    # an open table's section (bench compare's [train]): a file's values all go into the table, so options
    # given on the command line (the section's named fields) and --set land above the whole file
    for sec, (holder, _) in layout.tables.items():
        for name in layout.sections.get(sec, ()):
            if name in from_file:
                from_file.setdefault(holder, {})[name] = from_file.pop(name)
    # by name: typer may carry its own copy of click, whose ParameterSource is another enum class
    given = ("COMMANDLINE", "ENVIRONMENT")
    values: dict[str, Any] = {}
    explicit = set(from_file) | set(from_sets)
    for name, conv in converters.items():
        raw = kwargs.pop(name)
        source = ctx.get_parameter_source(name)
        if getattr(source, "name", None) in given:
            explicit.add(name)
        if getattr(source, "name", None) in given or name not in from_file:
            values[name] = conv.convert(raw, from_file.get(name, ...))
        else:
            values[name] = from_file[name]
    for name, value in from_file.items():  # fields the command line cannot set (excluded) still load
        values.setdefault(name, value)
    for name, value in from_sets.items():
        if isinstance(value, dict) and isinstance(values.get(name), dict) and name in {
            h for h, _ in layout.tables.values()
        }:
            values[name] = {**values[name], **value}  # an open table's --set keys merge into it
        else:
            values[name] = value
    if profile is not None:
        chosen = profile(values)
        if chosen is not None:
            label, overrides = chosen
            applied = {k: v for k, v in overrides.items() if k not in explicit and values.get(k) != v}
            if applied:
                values.update(applied)
                shown = " ".join(f"{k}={v}" for k, v in applied.items())
                typer.echo(f"settings for {label} (give any to override): {shown}", err=True)
    return layout.typed(values)
