"""Experiment files: a flat config dataclass written and read in named sections, as TOML.

A config dataclass (``TrainConfig``, ``CompareOptions``) keeps its flat fields: they are the serialised
schema that checkpoints and leaderboard hashes already hold, and each field is one ``--option``
(:mod:`srpo_common.cli`). A :class:`Layout` says which section each field belongs to; an experiment
file is written in those sections::

    [rollout]
    group_size = 8
    temperature = 1.0

    [update]
    lr = 1e-4

Why TOML (``tomllib`` to read, ``tomli-w`` to write): ``tomllib`` is in the standard library, ``tomli-w``
is a small maintained writer with no dependencies; TOML has typed values (int vs float vs bool vs
string, ``inf``), tables for sections and no code execution, and it is what ``pyproject.toml`` and
prime-rl use. pydantic would duplicate the dataclasses' validation (``__post_init__`` stays the one
validator); OmegaConf/Hydra bring interpolation and a config-composition framework this project does
not need. TOML has no ``null``: a field whose value is ``None`` is left out of the file (every such
field here defaults to ``None``, so it reads back the same); writing a ``None`` where the default is
not ``None`` is refused with the field's name.

Overrides are ``--set section.field=value`` (the value parsed as TOML when it parses, e.g. ``8``,
``1e-4``, ``true``, ``[1, 2]``, ``{a = 1}``, else taken as a string). An unknown key, in a file or in
``--set``, is an error that names the nearest valid key; a known field under the wrong section names
its section (:class:`ConfigFileError`, a ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import tomli_w

from srpo_common import plugins
from srpo_common.fieldcheck import quote, strip_optional
from srpo_common.io import atomic_write_text

#: The largest experiment file read (the shipped ones are < 2 KB): a bigger one is a mistake or hostile.
MAX_FILE_BYTES = 1 << 20
#: A top-level key of an experiment file: modules to import before its names are read (plugins).
IMPORTS_KEY = "imports"
_MAX_KEY = 200


class ConfigFileError(ValueError):
    """A bad experiment file or ``--set`` item: unknown key, wrong section, unparsable TOML."""


def shipped_experiment(name: str | Path, directory: Path) -> Path:
    """``--config NAME``: a file, else an experiment shipped as ``directory/NAME.toml`` (a bare name,
    with or without ``.toml``); a :class:`ConfigFileError` listing the shipped ones otherwise. One rule for
    ``srpo train`` (``learners/experiments``) and ``srpo bench`` (``benchmarks/experiments``)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = directory / f"{path.name.removesuffix('.toml')}.toml"
    if len(path.parts) == 1 and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in directory.glob("*.toml")))
    raise ConfigFileError(f"no experiment file {name} (shipped experiments: {names})")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which section each field of a flat config dataclass belongs to.

    ``sections``: section name -> its field names, in file order. Every field of ``cls`` must be in
    exactly one section (checked here, naming the unplaced or doubled fields, so a new field without a
    section fails at import time, not when a file silently drops it).
    """

    cls: type
    sections: Mapping[str, tuple[str, ...]]
    #: section -> (the ``dict`` field that holds its other keys, the keys it accepts): an open table such as
    #: ``bench compare``'s ``[train]``, whose named fields are options and whose other keys are any
    #: ``TrainConfig`` field. The holding field counts as placed in that section.
    tables: Mapping[str, tuple[str, frozenset[str]]] = dataclasses.field(default_factory=dict)
    #: ``--config NAME`` -> the file to read (e.g. a shipped experiment by name); default: NAME as a path
    locate: Callable[[str | Path], Path] | None = None

    def __post_init__(self) -> None:
        names = [f.name for f in dataclasses.fields(self.cls)]
        placed = [n for fs in self.sections.values() for n in fs] + [h for h, _ in self.tables.values()]
        unplaced = [n for n in names if n not in placed]
        doubled = sorted({n for n in placed if placed.count(n) > 1})
        unknown = [n for n in placed if n not in names]
        problems = []
        if unplaced:
            problems.append(f"fields in no section: {unplaced} (add each to one section)")
        if doubled:
            problems.append(f"fields in more than one section: {doubled}")
        if unknown:
            problems.append(f"sections name fields {self.cls.__name__} does not have: {unknown}")
        if problems:
            raise ValueError(f"{self.cls.__name__} layout: " + "; ".join(problems))

    @property
    def section_of(self) -> dict[str, str]:
        """field -> its section."""
        return {name: sec for sec, names in self.sections.items() for name in names}

    def keys(self) -> list[str]:
        """Every valid dotted key, ``section.field`` (an open table's accepted keys included)."""
        named = [f"{sec}.{name}" for sec, names in self.sections.items() for name in names]
        return named + [f"{sec}.{name}" for sec, (_, ok) in self.tables.items() for name in sorted(ok)]

    # ------------------------------------------------------------------ flat <-> sections
    def nest(self, flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """A flat field -> value mapping as ``{section: {field: value}}`` (sections in layout order)."""
        where = self.section_of
        holders = {holder: sec for sec, (holder, _) in self.tables.items()}
        out: dict[str, dict[str, Any]] = {sec: {} for sec in self.sections}
        order = {name: i for i, name in enumerate(where)}  # each section's fields in layout order
        for name, value in sorted(flat.items(), key=lambda kv: order.get(kv[0], -1)):
            if name in holders:
                out[holders[name]].update(value or {})
                continue
            if name not in where:
                raise ConfigFileError(self._unknown(name))
            out[where[name]][name] = value
        return {sec: dict(sorted(vals.items())) if sec in self.tables else vals for sec, vals in out.items() if vals}

    def flatten(self, nested: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
        """``{section: {field: value}}`` -> flat fields; unknown sections/keys and misplaced fields raise."""
        where = self.section_of
        flat: dict[str, Any] = {}
        for sec, values in nested.items():
            if sec not in self.sections:
                if sec in where:  # a field written at the top level
                    raise ConfigFileError(
                        f"{source}: {quote(sec)} belongs in section [{where[sec]}] (write it as {where[sec]}.{sec})"
                    )
                raise ConfigFileError(f"{source}: {self._unknown(sec, section=True)}")
            if not isinstance(values, Mapping):
                raise ConfigFileError(f"{source}: [{sec}] must be a table of fields, got {quote(values)}")
            for name, value in values.items():
                field = self.check_key(f"{sec}.{name}", source)
                if sec in self.tables and field != name:  # an open table's key: into its holding dict
                    flat.setdefault(field, {})[name] = value
                else:
                    flat[field] = value
        return flat

    def check_key(self, key: str, source: str = "--set") -> str:
        """``section.field`` -> ``field`` (an open table's other keys -> its holding field); an unknown key
        or a field in the wrong section raises."""
        if len(key) > _MAX_KEY:  # no key is this long; and difflib's suggestion would cost O(len^2)
            raise ConfigFileError(f"{source}: unknown key {quote(key)}")
        sec, _, name = key.partition(".")
        if sec in self.sections and name in self.sections[sec]:
            return name
        if sec in self.tables and name in self.tables[sec][1]:
            return self.tables[sec][0]
        if not name:
            where = self.section_of
            hint = f"; did you mean '{where[sec]}.{sec}'?" if sec in where else self._suggest(key)
            raise ConfigFileError(f"{source}: key {quote(key)} must be section.field{hint}")
        where = self.section_of
        if name in where:
            raise ConfigFileError(
                f"{source}: unknown key {quote(key)}: {name!r} is in section [{where[name]}]; "
                f"did you mean '{where[name]}.{name}'?"
            )
        raise ConfigFileError(f"{source}: unknown key {quote(key)}{self._suggest(key)}")

    def _suggest(self, key: str) -> str:
        close = difflib.get_close_matches(key, self.keys(), n=1, cutoff=0.5)
        if not close:  # a typo'd section with a right field, or the field alone: match on the field name
            name = key.rpartition(".")[2]
            hit = difflib.get_close_matches(name, list(self.section_of), n=1, cutoff=0.6)
            close = [f"{self.section_of[hit[0]]}.{hit[0]}"] if hit else []
        return f"; did you mean {close[0]!r}?" if close else f" (sections: {', '.join(self.sections)})"

    def _unknown(self, name: str, section: bool = False) -> str:
        if len(name) > _MAX_KEY:
            return f"unknown {'section' if section else 'field'} {quote(name)}"
        pool = list(self.sections) if section else list(self.section_of)
        close = difflib.get_close_matches(name, pool, n=1, cutoff=0.5)
        what = "section" if section else "field"
        hint = f"; did you mean {close[0]!r}?" if close else f" (sections: {', '.join(self.sections)})"
        return f"unknown {what} {name!r}{hint}"

    # ------------------------------------------------------------------ files
    def dumps(self, flat: Mapping[str, Any], header: str = "", imports: Iterable[str] = ()) -> str:
        """TOML text of ``flat`` in sections; ``None`` values are left out (see the module docstring);
        ``imports``: modules the file imports first (its top-level ``imports`` key)."""
        defaults = {f.name: f for f in dataclasses.fields(self.cls)}
        kept: dict[str, Any] = {}
        for name, value in flat.items():
            if value is None:
                f = defaults.get(name)
                if f is not None and f.default is not None:
                    raise ConfigFileError(
                        f"{name}=None cannot be written to TOML (no null) and its default is not None"
                    )
                continue
            kept[name] = _toml_value(value, name)
        text = _inline_arrays(tomli_w.dumps(self.nest(kept)))
        lines = [f"# {line}".rstrip() for line in header.splitlines()] if header else []
        imports = list(imports)
        if imports:  # a top-level key: before the first table
            text = _inline_arrays(tomli_w.dumps({IMPORTS_KEY: imports})) + "\n" + text
        return "\n".join(lines) + ("\n\n" if lines else "") + text

    def write(self, path: str | Path, flat: Mapping[str, Any], header: str = "") -> Path:
        """:meth:`dumps` written atomically (a reader never sees half a file)."""
        return atomic_write_text(path, self.dumps(flat, header))

    def read(self, path: str | Path) -> dict[str, Any]:
        """The flat fields of an experiment file (only those it sets)."""
        path = self.locate(path) if self.locate is not None else Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise ConfigFileError(
                    f"{path}: {size:,} bytes is not an experiment file (at most {MAX_FILE_BYTES:,}): nothing was read"
                )
            nested = tomllib.loads(path.read_text(encoding="utf-8"))
            imports = nested.pop(IMPORTS_KEY, [])
        except FileNotFoundError:
            raise ConfigFileError(f"no experiment file {path}") from None
        except UnicodeDecodeError as exc:
            raise ConfigFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
        if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
            raise ConfigFileError(f"{path}: {IMPORTS_KEY} must be a list of module names, got {quote(imports)}")
        plugins.import_modules(imports, source=f"{path} {IMPORTS_KEY}")  # what the file's names need
        return self.flatten(nested, source=str(path))

    def parse_sets(self, items: Iterable[str]) -> dict[str, Any]:
        """``--set section.field=value`` items -> flat fields (later items win)."""
        out: dict[str, Any] = {}
        for item in items:
            key, eq, raw = item.partition("=")
            if not eq:
                raise ConfigFileError(f"--set: expected section.field=value, got {quote(item)}")
            sec, _, name = key.strip().partition(".")
            field = self.check_key(key.strip())
            if sec in self.tables and field != name:
                out.setdefault(field, {})[name] = parse_value(raw.strip())
            else:
                out[field] = parse_value(raw.strip())
        return out

    def typed(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """Values read from TOML in the types the fields declare: an ``int`` written for a ``float`` field
        becomes a float and an array for a ``tuple`` field a tuple, so a config read from a file equals
        (and hashes as) the one the flags build."""
        hints = typing.get_type_hints(self.cls)
        out = dict(flat)
        for name, value in flat.items():
            base = strip_optional(hints.get(name))[0]
            if base is float and isinstance(value, int) and not isinstance(value, bool):
                out[name] = float(value)
            elif typing.get_origin(base) is tuple and isinstance(value, list):
                out[name] = tuple(value)
        return out


_ARRAY = re.compile(r"= \[\n((?:    [^\n\[\]{}]*,\n)*)\]")


def _inline_arrays(text: str) -> str:
    """tomli-w writes one array item per line; arrays of scalars read better on one line (same TOML)."""
    return _ARRAY.sub(lambda m: "= [" + ", ".join(x.strip().rstrip(",") for x in m.group(1).splitlines()) + "]", text)


def parse_value(raw: str) -> Any:
    """A ``--set`` value: TOML when it parses as one (``8``, ``1e-4``, ``true``, ``[1,2]``), else the string.

    Refused (:class:`ConfigFileError`): a value over more than one line (TOML would read its first line
    and drop the rest, or a ``[table]`` on the next), and one that starts like a TOML string, array or
    table but does not parse (``"runs/x"\n[evil]`` with a literal backslash is a mistake, not a path
    whose first character is a quote)."""
    if "\n" in raw or "\r" in raw:
        raise ConfigFileError(f"--set: a value must be one line, got {quote(raw)}")
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if raw and raw[0] in "\"'[{":
            raise ConfigFileError(f"--set: {quote(raw)} is not a valid TOML value ({exc})") from None
        return raw


def _toml_value(value: Any, name: str) -> Any:
    """A config value as TOML can hold it: tuples as arrays, paths as strings; a nested ``None`` raises."""
    if value is None:
        raise ConfigFileError(f"{name}: TOML has no null; leave the key out instead")
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_toml_value(v, name) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _toml_value(v, f"{name}.{k}") for k, v in value.items()}
    return value
