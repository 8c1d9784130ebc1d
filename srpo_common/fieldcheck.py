"""Values of a config dataclass checked against the types its fields declare, before any work.

Why: a config is built from three untyped sources - an experiment file (TOML), ``--set`` items and
Python callers - and a value of the wrong type does not fail where it enters. It fails later, or never:
``iterations = 1.5`` ran two iterations and was saved as 1.5; ``group_size = true`` was taken as 1
(single-rollout groups, every advantage zero); ``temperature = nan`` sampled at T=1 and saved nan; a
string where an int belongs crashed deep in the trainer as "internal error". Here every field's value is
checked (and, where the conversion is exact, converted) against its annotation in one place, so each bad
value is one line naming the field, its type and at most :data:`QUOTE_LIMIT` characters of the value.

The rules (``X | None`` accepts ``None`` and then X's rules):

* ``bool``: only ``True``/``False`` (not 0/1, not "true");
* ``int``: a 64-bit integer, not a bool, not a float (``1.5`` and ``2.0`` are refused: no silent
  rounding);
* ``float``: an int or float (not a bool), converted to float; NaN is refused, and so are +-inf unless
  the field is named in ``allow_inf`` (e.g. a threshold whose ``inf`` means "off");
* ``str`` / ``Path``: a string (a ``Path`` for ``Path``) of at most :data:`MAX_STR` characters with no
  NUL, CR or LF (every string field here is a name, a path, a URL or a choice: one line);
* ``Literal[...]``: one of the choices;
* ``tuple[T, ...]`` / ``list[T]``: a list or tuple (converted to the declared container) whose items
  follow T's rules;
* ``dict[str, ...]``: a mapping with string keys (its values are the field's business: env kwargs).

Range checks (positive, within (0, 1], ...) stay with each config's ``__post_init__``, which runs after
this, so they compare numbers with numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

#: The most characters of a value an error message quotes.
QUOTE_LIMIT = 200
#: The longest string a config field takes (PATH_MAX on Linux): longer is hostile or a mistake.
MAX_STR = 4096


class FieldTypeError(ValueError):
    """A config field holds a value its declared type does not admit."""


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters (with the full length said), for one-line errors.

    A huge value is sliced before ``repr`` so that quoting a 50 MB string costs nothing."""
    if isinstance(value, str | bytes) and len(value) > limit:
        head = repr(value[:limit])
        return f"{head[:limit]}... ({len(value):,} characters)"
    text = repr(value) if not isinstance(value, Mapping | list | tuple) or len(value) < 1000 else (
        f"<{type(value).__name__} of {len(value):,} items>"
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def strip_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)`` (``X | Y | None`` -> ``(X | Y, True)``); any other type -> ``(tp, False)``.
    The one reading of an optional annotation for the CLI generator, the experiment files and this module."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return tp, False


def conform(name: str, tp: Any, value: Any, allow_inf: bool = False) -> Any:
    """``value`` as field ``name`` of type ``tp`` holds it; :class:`FieldTypeError` when it cannot."""
    base, optional = strip_optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise FieldTypeError(f"{name}: expected {_type_name(base)}, got None")
    origin = typing.get_origin(base)

    def bad(expected: str) -> FieldTypeError:
        return FieldTypeError(f"{name}: expected {expected}, got {_describe(value)} {quote(value)}")

    if base is Any:
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        if not -(2**63) <= value < 2**63:
            raise FieldTypeError(f"{name}: {quote(value, 60)} is out of range (a 64-bit integer)")
        return value
    if base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        if isinstance(value, int) and abs(value) > 2**1023:
            raise FieldTypeError(f"{name}: {quote(value, 60)} is too large for a float")
        out = float(value)
        if math.isnan(out) or (math.isinf(out) and not allow_inf):
            raise FieldTypeError(
                f"{name}: expected a finite number, got {out}" + ("" if not math.isinf(out) else " (inf is not allowed here)")
            )
        return out
    if base in (str, Path):
        if not isinstance(value, str | Path) or (base is str and isinstance(value, Path)):
            raise bad("a string")
        text = str(value)
        if len(text) > MAX_STR:
            raise FieldTypeError(f"{name}: {len(text):,} characters is too long (at most {MAX_STR:,}): {quote(text)}")
        if any(c in text for c in "\x00\r\n"):
            raise FieldTypeError(f"{name}: a value must be one line without NUL characters, got {quote(text)}")
        return value
    if origin is Literal:
        choices = typing.get_args(base)
        if isinstance(value, bool) or value not in choices:
            raise bad("one of " + ", ".join(map(str, choices)))
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise bad(f"a list of {_type_name(_item_type(base))}")
        item = _item_type(base)
        return origin(conform(f"{name}[{i}]", item, v, allow_inf) for i, v in enumerate(value))
    if origin is dict or base is dict:
        if not isinstance(value, Mapping):
            raise bad("a table of KEY = VALUE")
        for key in value:
            if not isinstance(key, str):
                raise FieldTypeError(f"{name}: keys must be strings, got {quote(key)}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):  # X | Y: the first that takes it
        for option in typing.get_args(base):
            with contextlib.suppress(FieldTypeError):
                return conform(name, option, value, allow_inf)
        raise bad(" or ".join(_type_name(o) for o in typing.get_args(base)))
    return value  # a type this checker has no rule for: the config's own validation owns it


def _item_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    return args[0] if args else Any


def _type_name(tp: Any) -> str:
    base, optional = strip_optional(tp)
    origin = typing.get_origin(base)
    if origin is Literal:
        text = "one of " + ", ".join(map(str, typing.get_args(base)))
    elif origin in (tuple, list):
        text = f"a list of {_type_name(_item_type(base))}"
    elif origin is dict or base is dict:
        text = "a table"
    else:
        text = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path"}.get(
            base, getattr(base, "__name__", str(base))
        )
    return text + (" (or nothing)" if optional else "")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A class's resolved annotations, once per class (a config is validated at every construction)."""
    return typing.get_type_hints(cls)


def check_fields(obj: Any, allow_inf: Iterable[str] = (), names: Mapping[str, str] | None = None) -> None:
    """Conform every field of dataclass instance ``obj`` in place (see the module docstring).

    ``allow_inf``: float fields where ``inf`` is meaningful. ``names``: field -> the name to say in an
    error (e.g. ``run.iterations``, the key a user writes); default the field name.
    """
    hints = _type_hints(type(obj))
    inf_ok = set(allow_inf)
    names = names or {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out = conform(names.get(f.name, f.name), hints.get(f.name, Any), value, allow_inf=f.name in inf_ok)
        if out is not value:
            if type(obj).__dataclass_params__.frozen:  # type: ignore[attr-defined]
                object.__setattr__(obj, f.name, out)
            else:
                setattr(obj, f.name, out)


__all__ = ["MAX_STR", "QUOTE_LIMIT", "FieldTypeError", "check_fields", "conform", "quote", "strip_optional"]
