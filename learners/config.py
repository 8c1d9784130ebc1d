"""``TrainConfig`` in sections: typed section views, values derived once, and experiment files.

Design. ``TrainConfig`` (:mod:`learners.trainer`) keeps its flat fields: they are the serialised schema
that every checkpoint's ``config.json``, every ``final/`` export and every leaderboard ``config_hash``
already hold (``asdict`` of the flat dataclass), and each field is one ``srpo train --option`` with its
docstring as help. Nesting the dataclass itself would change ``asdict`` (so the hash of every config
that enters a record id) and every flat checkpoint config on disk would need a converter; the
sections are therefore *views* over the flat schema, plus the layout experiment files are written in:

* :data:`TRAIN_SECTIONS` places every field in exactly one section (``tests/test_experiment_files.py``
  fails naming a field added without one; at run time such a field only warns and is filed under
  ``[run]``, so a new option never stops a run);
* ``cfg.rollout``, ``cfg.update``, ``cfg.critic``, ... are frozen dataclasses with that section's fields
  (generated from the flat declarations, so they cannot drift), built once per config and rebuilt only
  if a field is assigned afterwards; a part of the trainer takes its section alone;
* the values that used to be resolved at each use (``cfg.resolved("agg")``, ``cfg.clip_range()``, the
  algorithm's estimator and loss, whether TIS is on, the minibatch split) are fields of the
  :class:`Derived` view ``cfg.derived`` and of the section they belong to (``cfg.update.clip_range``);
* an experiment file is TOML in these sections (``[rollout] group_size = 8``; :mod:`srpo_common.config_file`
  says why TOML and how ``--set section.field=value`` and unknown keys behave). ``srpo train --config
  FILE`` reads it; precedence is dataclass defaults < the file < options given on the command line <
  ``--set``. Each run writes its resolved config to ``OUT/config.toml`` (:func:`write_run_config`), so
  ``srpo train --config OUT/config.toml`` trains the same run again.

This module imports nothing from :mod:`learners.trainer` at import time (the trainer imports it); the
layout is built on first use.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srpo_common import plugins
from srpo_common.config_file import ConfigFileError, Layout, shipped_experiment

if TYPE_CHECKING:
    from learners.trainer import TrainConfig

__all__ = [
    "TRAIN_SECTIONS",
    "ConfigFileError",
    "Derived",
    "derived",
    "dotted_names",
    "read_train_config",
    "section",
    "train_layout",
    "with_sections",
    "write_run_config",
]

#: Section -> its ``TrainConfig`` fields, in file order. Every field is in exactly one section.
TRAIN_SECTIONS: dict[str, tuple[str, ...]] = {
    # what the run is and where it goes
    "run": (
        "algo", "model", "out_dir", "env_id", "env_kwargs", "iterations", "seed", "save_every",
        "logger", "tensorboard",
    ),
    # how the policies are held: sharing, precision, device, memory
    "policy": ("sharing", "lora_rank", "device", "dtype", "gradient_checkpointing", "memory_check"),
    # what one iteration samples
    "rollout": (
        "tasks_per_iter", "group_size", "filter_groups", "filter_signal", "max_gen_batches",
        "temperature", "top_p", "max_new_tokens", "max_staleness",
    ),
    # the update: batching, optimizer, advantage and loss, off-policy correction
    "update": (
        "epochs", "rows_per_batch", "minibatches_per_iter", "forward_rows", "max_tokens_per_microbatch",
        "prefix_tree", "pack_len", "lr", "warmup", "weight_decay", "max_grad_norm", "clip_eps",
        "clip_eps_high", "norm", "agg", "adv_scale", "adv_estimator", "policy_loss", "kl_coef",
        "entropy_coef", "tis", "tis_cap", "staleness_correction",
    ),
    # a critic's own settings (MAPPO) and its GAE
    "critic": ("critic_lr", "critic_max_tokens", "gamma", "gae_lambda", "vf_clip"),
    # which engine generates rollouts and how it is reached
    "engine": (
        "backend", "base_url", "served_sampling", "served_concurrency", "served_timeout",
        "logprob_tolerance", "vllm_gpu_memory_utilization", "vllm_sleep", "vllm_enforce_eager",
    ),
    # processes and machines: Ray rollout workers, torchrun/accelerate ranks
    "scale": ("rollout_workers", "ray_address", "rollout_timeout", "dp_engine", "dist_timeout"),
    # held-out evaluation
    "eval": ("eval_env_kwargs", "eval_every", "eval_problems", "eval_k"),
    # when a run stops itself (learners.guard and the non-finite step limit)
    "guard": (
        "max_nonfinite_steps", "guard_max_approx_kl", "guard_max_log_ratio", "guard_max_loss",
        "guard_max_grad_norm", "guard_eval_drop",
    ),
}  # fmt: skip


def dotted_names() -> dict[str, str]:
    """field -> ``section.field``, the key a user writes in an experiment file or ``--set`` (error messages)."""
    return {name: f"{sec}.{name}" for sec, names in TRAIN_SECTIONS.items() for name in names}


@dataclasses.dataclass(frozen=True)
class Derived:
    """Values computed once from a validated config instead of at each use."""

    adv_estimator: str
    """the advantage estimator's name (the field, else the algorithm's)"""
    policy_loss: str
    """the policy loss's name (the field, else the algorithm's)"""
    agg: str
    """token-loss aggregation (the field, else the algorithm's, else token-mean)"""
    adv_scale: str
    """group-relative advantage scale (the field, else the algorithm's, else std)"""
    clip_range: tuple[float, float | None]
    """(clip_eps, clip_eps_high) the loss uses (TrainConfig.clip_range)"""
    tis_on: bool
    """truncated importance sampling corrects the rollouts (tis != off, and auto means not hf)"""
    critic: bool
    """the algorithm trains a critic"""


def _rows_per_minibatch(self: Any, n_rows: int) -> int:
    """Rows per minibatch (optimizer step) of a rollout batch of ``n_rows`` complete-event rows:
    ``minibatches_per_iter`` splits the batch (and overrides ``rows_per_batch``), else ``rows_per_batch``."""
    if self.minibatches_per_iter is None:
        return int(self.rows_per_batch)
    return max(1, math.ceil(n_rows / self.minibatches_per_iter))


#: Methods a section view carries (the one rule for a value that depends on the batch).
_SECTION_METHODS: dict[str, dict[str, Any]] = {"update": {"rows_per_minibatch": _rows_per_minibatch}}


def derived(cfg: TrainConfig) -> Derived:
    """The :class:`Derived` values of ``cfg`` (use ``cfg.derived``: computed once per config)."""
    from learners.algorithms import get_algorithm

    spec = get_algorithm(cfg.algo)
    return Derived(
        adv_estimator=cfg.adv_estimator or spec.estimator,
        policy_loss=cfg.policy_loss or spec.loss,
        agg=cfg.resolved("agg"),
        adv_scale=cfg.resolved("adv_scale"),
        clip_range=cfg.clip_range(),
        tis_on=cfg.tis != "off" and not (cfg.tis == "auto" and cfg.backend == "hf"),
        critic=bool(spec.critic),
    )


#: Derived values a section view carries beside its fields (the part that takes the section needs them); one
#: named like a field (``agg``, ``adv_scale``, ``adv_estimator``, ``policy_loss``: None means the algorithm's)
#: holds the resolved value in the view, the raw field stays on the config.
_SECTION_DERIVED: dict[str, tuple[str, ...]] = {
    "update": ("adv_estimator", "policy_loss", "agg", "adv_scale", "clip_range", "tis_on"),
    "critic": ("critic",),
}


@functools.cache
def _section_class(name: str) -> type:
    """The frozen dataclass of section ``name``: its fields' names, types and docs from ``TrainConfig``."""
    from learners.trainer import TrainConfig

    declared = {f.name: f for f in dataclasses.fields(TrainConfig)}
    derived_fields = {f.name: f for f in dataclasses.fields(Derived)}
    spec = [(n, declared[n].type) for n in TRAIN_SECTIONS[name]]
    # a derived value named like a field (agg, adv_scale, ...) replaces it: the view holds what the part uses
    spec = [(n, derived_fields[n].type if n in derived_fields else t) for n, t in spec]
    spec += [(n, derived_fields[n].type) for n in _SECTION_DERIVED.get(name, ()) if n not in declared]
    cls = dataclasses.make_dataclass(
        f"{name.capitalize()}Section", spec, frozen=True,
        namespace={
            "__doc__": f"The [{name}] section of a TrainConfig (learners.config).",
            **_SECTION_METHODS.get(name, {}),
        },
    )  # fmt: skip
    cls.__module__ = __name__
    return cls


def section(cfg: TrainConfig, name: str) -> Any:
    """Section ``name`` of ``cfg`` as a frozen view (use ``cfg.<name>``: built once per config)."""
    cls = _section_class(name)
    values = {n: getattr(cfg, n) for n in TRAIN_SECTIONS[name]}
    d = cfg.derived
    values.update({n: getattr(d, n) for n in _SECTION_DERIVED.get(name, ())})
    return cls(**values)


def with_sections(cls: type) -> type:
    """Class decorator of ``TrainConfig``: ``cfg.<section>`` views and ``cfg.derived``, cached per instance.

    The cache lives in the instance (not a field: ``asdict`` and the hashes it feeds do not see it), is
    dropped when any attribute is assigned (a view never describes stale values) and is not pickled
    (a config sent to a Ray worker rebuilds its views there).
    """

    def _views(self: Any) -> dict[str, Any]:
        views = self.__dict__.get("_views")
        if views is None:
            views = {}
            object.__setattr__(self, "_views", views)
        return views

    def make(name: str) -> property:
        def get(self: Any) -> Any:
            views = _views(self)
            if name not in views:
                views[name] = derived(self) if name == "derived" else section(self, name)
            return views[name]

        get.__name__ = name
        get.__doc__ = f"The [{name}] section (a frozen view)." if name != "derived" else Derived.__doc__
        return property(get)

    clash = [n for n in [*TRAIN_SECTIONS, "derived"] if n in {f.name for f in dataclasses.fields(cls)}]
    if clash:
        raise TypeError(f"{cls.__name__}: section names {clash} clash with fields")
    for name in [*TRAIN_SECTIONS, "derived"]:
        setattr(cls, name, make(name))

    def __setattr__(self: Any, key: str, value: Any) -> None:
        object.__setattr__(self, key, value)
        self.__dict__.pop("_views", None)

    def __getstate__(self: Any) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_views"}

    def __setstate__(self: Any, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    cls.__setattr__ = __setattr__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[method-assign]
    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
    return cls


# ---------------------------------------------------------------------------------------------- files
#: The shipped ``srpo train`` experiments (package data): the docs' recipes, each named after its ``--out``.
EXPERIMENTS_DIR = Path(__file__).resolve().parent / "experiments"


def experiment_path(name: str | Path) -> Path:
    """``--config NAME``: a file, else a shipped experiment (``learners/experiments/NAME.toml``)."""
    return shipped_experiment(name, EXPERIMENTS_DIR)


def non_default(cfg: TrainConfig) -> dict[str, Any]:
    """The fields of ``cfg`` that differ from ``TrainConfig``'s defaults (what a recipe file states)."""
    from learners.trainer import TrainConfig

    base = config_values(TrainConfig())
    return {k: v for k, v in config_values(cfg).items() if v != base[k]}


@functools.cache
def train_layout() -> Layout:
    """The :class:`srpo_common.config_file.Layout` of ``TrainConfig`` (a field in no section warns, naming it)."""
    from learners.trainer import TrainConfig

    sections = dict(TRAIN_SECTIONS)
    unplaced = unplaced_fields()
    if unplaced:  # a field added without a section: runs keep working (the test names it), the file puts it in [run]
        warnings.warn(
            f"TrainConfig fields in no section: {unplaced}; add each to learners/config.py TRAIN_SECTIONS "
            "(until then experiment files hold them in [run])",
            stacklevel=2,
        )
        sections["run"] = sections["run"] + tuple(unplaced)
    return Layout(TrainConfig, sections, locate=experiment_path)


def unplaced_fields() -> list[str]:
    """``TrainConfig`` fields :data:`TRAIN_SECTIONS` does not place (tests/test_experiment_files.py: none)."""
    from learners.trainer import TrainConfig

    placed = {n for names in TRAIN_SECTIONS.values() for n in names}
    return [f.name for f in dataclasses.fields(TrainConfig) if f.name not in placed]


def config_values(cfg: TrainConfig) -> dict[str, Any]:
    """The flat field values of ``cfg`` (``asdict``: what checkpoints and record hashes hold)."""
    return dataclasses.asdict(cfg)


def dumps_train_config(cfg: TrainConfig) -> str:
    """``cfg`` as an experiment file (TOML in sections)."""
    return train_layout().dumps(
        config_values(cfg),
        header="srpo train experiment file (learners/config.py): srpo train --config THIS [--set section.field=value]",
        imports=plugins.imported(),  # the run's --import plugins: rerunning it needs them again
    )


def write_run_config(cfg: TrainConfig, out_dir: str | Path | None = None) -> Path | None:
    """Write ``cfg`` as ``OUT/config.toml`` (atomically): ``srpo train --config OUT/config.toml`` reruns it.

    A config TOML cannot hold (a ``None`` inside ``env_kwargs``: TOML has no null) warns and writes
    nothing instead of stopping the run; checkpoints keep the config as JSON either way. A previous
    run's ``config.toml`` in the same directory is then removed: left there, it would rerun another run."""
    from srpo_common import atomic_write_text

    path = Path(out_dir or cfg.out_dir) / "config.toml"
    try:
        text = dumps_train_config(cfg)
    except ConfigFileError as exc:
        path.unlink(missing_ok=True)
        warnings.warn(f"config.toml not written: {exc}", stacklevel=2)
        return None
    return atomic_write_text(path, text)


def read_train_config(
    path: str | Path | None = None, sets: tuple[str, ...] | list[str] = (), **overrides: Any
) -> TrainConfig:
    """A ``TrainConfig`` from an experiment file, then ``overrides`` (flat fields), then ``--set`` items."""
    from learners.trainer import TrainConfig

    layout = train_layout()
    values: dict[str, Any] = layout.read(path) if path is not None else {}
    values.update(overrides)
    values.update(layout.parse_sets(sets))
    return TrainConfig(**layout.typed(values))


def flat_to_sections(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat ``TrainConfig`` mapping (e.g. an old checkpoint's ``config.json``) in sections, as plain data."""
    return train_layout().nest(dict(flat))


def reference_page() -> str:
    """The markdown of docs/config-reference.md: every ``TrainConfig`` field by section (name, type, default
    and its docstring, the ``--help`` text), generated from the class (``python -m learners.config``
    rewrites the page; ``tests/test_python_api.py`` fails when the two disagree)."""
    import typing

    from learners.trainer import TrainConfig
    from srpo_common.cli import field_docs

    docs = field_docs(TrainConfig)
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}

    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "&#124;")

    def type_name(tp: Any) -> str:
        return cell(str(tp).replace("typing.", "").replace("<class '", "").replace("'>", ""))

    def default(f: dataclasses.Field[Any]) -> str:
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        return cell(f"`{value!r}`")

    lines = [
        "# Training config reference",
        "",
        "Every field of `learners.TrainConfig`, by the section an experiment file writes it in "
        "([experiment files](experiments.md)): `srpo train --FIELD-NAME VALUE`, `--set SECTION.FIELD=VALUE` or "
        "`[SECTION] FIELD = VALUE`. Generated from the class by `python -m learners.config > "
        "docs/config-reference.md`; `tests/test_python_api.py` fails when this page and the class disagree. "
        "A setting a command leaves out may be filled by the model's class "
        "([settings by model class](experiments.md#settings-by-model-class)).",
    ]
    for sec, names in TRAIN_SECTIONS.items():
        lines += ["", f"## [{sec}]", "", "| field | type | default | what it is |", "|---|---|---|---|"]
        for name in names:
            f = fields[name]
            lines.append(f"| `{name}` | {type_name(hints[name])} | {default(f)} | {cell(docs.get(name, ''))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_page(), end="")

