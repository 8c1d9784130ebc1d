"""Plugins: code outside this package that registers envs, algorithms, suites or trackers, loaded by name.

A user extends srpo without editing it, the way pytest and Jupyter are extended: an installed package
declares an entry point in the group :data:`GROUP` and every ``srpo`` command loads it first::

    # the plugin's pyproject.toml
    [project.entry-points."srpo.plugins"]
    my_algo = "my_package.srpo_plugin"          # a module: importing it registers its parts
    my_env = "my_package.envs:register_all"     # or a callable: called with no arguments

or, without installing anything, a command names modules to import (``srpo --import my_module train ...``,
or ``imports = ["my_module"]`` at the top of an experiment file). What a plugin registers goes through the
project's own registries (``srpo_envs.register``, ``learners.algorithms.register_algorithm`` with its
estimator and loss, ``benchmarks.suites.register_suite``, ``learners.tracking.register_tracker``), which
refuse a name that is already taken, so a plugin cannot silently replace a built-in.

A plugin that fails to import, or whose registration raises, is one :class:`PluginError` line naming the
plugin (its entry point and distribution, or the module) and what went wrong: exit 2 at the ``srpo``
boundary, before the command does any work. :data:`LOADED` records what was loaded and from which
distribution version, for provenance (a leaderboard record names the plugins its run had loaded).

Nothing here runs code the user did not name: entry points are code the user installed, and ``--import``
imports what the user typed.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

#: The entry-point group srpo loads at start.
GROUP = "srpo.plugins"

_lock = threading.RLock()  # re-entrant: a plugin module may itself import plugins


class PluginError(ValueError):
    """A plugin could not be loaded (import error, or its registration raised)."""


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin: its name (entry point or module), the target, and the distribution it came from."""

    name: str
    target: str
    distribution: str | None = None
    version: str | None = None
    #: loaded from an installed entry point (every command loads it again), not named by --import / a file
    entry_point: bool = False

    def label(self) -> str:
        dist = f" from {self.distribution} {self.version}" if self.distribution else ""
        return f"{self.name} ({self.target}{dist})"


#: name -> the plugin loaded under it, in load order.
LOADED: dict[str, Plugin] = {}


#: kind -> a registry mapping (name -> object) whose existing names a plugin may not replace; each package
#: adds its registries with :func:`watch` (this module imports none of them).
WATCHED: dict[str, dict[str, object]] = {}


def watch(kind: str, registry: dict[str, object]) -> None:
    """Protect ``registry``'s names from being replaced by a plugin (``kind``: "algorithm", "env", ...)."""
    WATCHED[kind] = registry


def _run(plugin: Plugin, load: Callable[[], object]) -> None:
    before = {kind: dict(reg) for kind, reg in WATCHED.items()}
    try:
        target = load()
        if callable(target) and not isinstance(target, ModuleType):  # "module:function": call it
            target()
    except PluginError:
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever a plugin raises is reported as the plugin's
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        text = " ".join(str(exc).split())[:300]
        raise PluginError(f"plugin {plugin.label()} failed to load: {type(exc).__name__}: {text}") from exc
    for kind, old in before.items():
        replaced = sorted(name for name, obj in old.items() if WATCHED[kind].get(name, obj) is not obj)
        if replaced:
            for name in replaced:  # put the originals back: the command runs with what it had
                WATCHED[kind][name] = old[name]
            raise PluginError(
                f"plugin {plugin.label()} registers {kind} {', '.join(map(repr, replaced))}, a name already "
                "taken: give it another name"
            )


def load_entry_points(group: str = GROUP) -> list[Plugin]:
    """Load every installed entry point of ``group`` (once per process); the plugins loaded now."""
    loaded = []
    with _lock:
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            if ep.name in LOADED:
                continue
            dist = getattr(ep, "dist", None)
            plugin = Plugin(
                ep.name, ep.value, getattr(dist, "name", None), getattr(dist, "version", None), entry_point=True
            )
            _run(plugin, ep.load)
            LOADED[ep.name] = plugin
            loaded.append(plugin)
    return loaded


def import_modules(names: Iterable[str], source: str = "--import") -> list[Plugin]:
    """Import each module named (``package.module``, or ``package.module:function`` to call one); those
    already loaded are skipped. ``source`` says where the names came from, for the error line."""
    loaded = []
    with _lock:
        for raw in names:
            name = str(raw).strip()
            if not name or name in LOADED:
                continue
            module, _, attr = name.partition(":")
            plugin = Plugin(name, f"{source} {name}", *_distribution_of(module))

            def load(module: str = module, attr: str = attr) -> object:
                mod = importlib.import_module(module)
                return getattr(mod, attr) if attr else mod

            _run(plugin, load)
            LOADED[name] = plugin
            loaded.append(plugin)
    return loaded


def _distribution_of(module: str) -> tuple[str | None, str | None]:
    """The installed distribution that provides ``module``'s top-level package, and its version."""
    top = module.split(".")[0]
    try:
        dists = metadata.packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - provenance only: never fail a load over it
        return None, None
    if not dists:
        return None, None
    try:
        return dists[0], metadata.version(dists[0])
    except metadata.PackageNotFoundError:
        return dists[0], None


def imported() -> list[str]:
    """The modules named by ``--import`` or an experiment file's ``imports``, in load order: what a saved
    experiment file must import again to be rerun (entry points load on their own)."""
    return [p.name for p in LOADED.values() if not p.entry_point]


def provenance() -> dict[str, str]:
    """``{plugin name: "target [distribution version]"}`` of every plugin loaded in this process."""
    return {
        p.name: p.target + (f" [{p.distribution} {p.version}]" if p.distribution else "") for p in LOADED.values()
    }


__all__ = [
    "GROUP", "LOADED", "WATCHED", "Plugin", "PluginError", "import_modules", "imported", "load_entry_points", "provenance",
    "watch",
]  # fmt: skip
