"""``TrainConfig`` in sections: typed section views, values derived once, and experiment files.

Design. ``TrainConfig`` (defined here; :mod:`learners.trainer` re-exports it) keeps its flat fields: they are the serialised schema
that every checkpoint's ``config.json``, every ``final/`` export and every leaderboard ``config_hash``
already hold (``asdict`` of the flat dataclass), and each field is one ``srpo train --option`` with its
docstring as help. Nesting the dataclass itself would change ``asdict`` (so the hash of every config
that enters a record id) and every flat checkpoint config on disk would need a converter; the
sections are therefore *views* over the flat schema, plus the layout experiment files are written in:

* :data:`TRAIN_SECTIONS` places every field in exactly one section (``tests/learners/test_experiment_files.py``
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

This module imports nothing from :mod:`learners.trainer` (the trainer imports it: an import-linter
contract keeps the order); the layout is built on first use. Validation runs in ``TrainConfig``'s
``__post_init__``: every value against its declared type first (:mod:`srpo_common.fieldcheck`), then
then each section's own checks (:meth:`TrainConfig.validate_sections`: ranges, names looked up in
their registries, the env and its kwargs, and each rule between fields beside the field it constrains).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import srpo_envs
from learners import guard
from learners.advantages import ADV_SCALES, MEMBER_COST_ADVANTAGES, get_adv_estimator
from learners.algorithms import get_algorithm
from learners.distributed import DP_ENGINES
from learners.dynamic_sampling import FILTER_SIGNALS
from learners.losses import AGG_MODES, EVENT_NORMS, get_policy_loss
from learners.scale import BACKENDS, TIS_MODES
from learners.served import SHARED_REFUSAL
from learners.staleness import STALENESS_CORRECTIONS
from learners.tracking import parse_loggers
from srpo_common import atomic_write_text, plugins
from srpo_common.cli import field_docs
from srpo_common.config_file import ConfigFileError, Layout, shipped_experiment
from srpo_common.fieldcheck import check_fields

__all__ = [
    "DTYPES",
    "EXTENDABLE_FIELDS",
    "INF_OK_FIELDS",
    "LAYOUT_FIELDS",
    "SHARING",
    "SRPO_NORMS",
    "TRAIN_SECTIONS",
    "TrainConfig",
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
        "clip_eps_high", "norm", "agg", "adv_scale", "adv_estimator", "member_cost_advantage", "policy_loss", "kl_coef",
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

    base = config_values(TrainConfig())
    return {k: v for k, v in config_values(cfg).items() if v != base[k]}


@functools.cache
def train_layout() -> Layout:
    """The :class:`srpo_common.config_file.Layout` of ``TrainConfig`` (a field in no section warns, naming it)."""

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
    """``TrainConfig`` fields :data:`TRAIN_SECTIONS` does not place (tests/learners/test_experiment_files.py: none)."""

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

    layout = train_layout()
    values: dict[str, Any] = layout.read(path) if path is not None else {}
    values.update(overrides)
    values.update(layout.parse_sets(sets))
    return TrainConfig(**layout.typed(values))


def flat_to_sections(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat ``TrainConfig`` mapping (e.g. an old checkpoint's ``config.json``) in sections, as plain data."""
    return train_layout().nest(dict(flat))


# ------------------------------------------------------------------------------ the config itself
#: SRPO set normalisations (``k1``: every output its own event, a response-level update).
SRPO_NORMS = tuple(EVENT_NORMS)
SHARING = ("shared", "per-role", "lora")
DTYPES = ("float32", "bfloat16", "float64")
#: Where a run executes, not what it computes: a checkpoint resumes under other values of these
#: (and under any world size: checkpoints hold the full state; a moved run directory resumes).
LAYOUT_FIELDS = (
    "rollout_workers", "ray_address", "dp_engine", "out_dir", "vllm_gpu_memory_utilization", "vllm_sleep",
    "vllm_enforce_eager", "dist_timeout", "rollout_timeout", "memory_check", "base_url", "save_every",
    "served_concurrency", "served_timeout", "logprob_tolerance", "logger", "tensorboard",
)  # fmt: skip
#: Where a run stops, not what an iteration computes: a checkpoint at iteration N resumes under any
#: ``iterations`` >= N, so a finished run whose curve still rises is continued instead of restarted
#: (the learning rate schedule is a warmup only and every random draw is seeded from (seed, iteration),
#: so training 128 then resuming to 256 gives, on CPU, the weights and rollouts of training 256 at once).
#: The divergence guard's thresholds (learners.guard) only say where a run stops, too.
EXTENDABLE_FIELDS = (
    "iterations", "guard_max_approx_kl", "guard_max_log_ratio", "guard_max_loss", "guard_max_grad_norm",
    "guard_eval_drop",
)  # fmt: skip


@with_sections  # cfg.rollout, cfg.update, ... and cfg.derived (below)
@dataclass
class TrainConfig:
    """All knobs of a training run (saved with every checkpoint; hashed into leaderboard records).

    The ``srpo train`` options are generated from these fields; each field's docstring is its
    ``--help`` text. Fields left ``None`` take the algorithm's default (:mod:`learners.algorithms`).
    """

    algo: str = "srpo"
    """algorithm: srpo, grpo, dr-grpo, gspo, dr-mas, at-grpo, rloo, mappo (or any registered one)"""
    model: str = ""
    """model directory or hub id (e.g. from `srpo model sft`)"""
    out_dir: str = "runs/train"
    """run directory: metrics.jsonl, checkpoint, final/"""
    env_id: str = "ProcArith-v0"
    """registered env id"""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """env keyword arguments (the env's own workflow unless `workflow` is given here)"""
    eval_env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    """env keyword arguments overridden for held-out evaluation"""
    sharing: str = "shared"
    """parameter sharing across roles: shared, per-role, lora"""
    iterations: int = 30
    """rollout -> update iterations"""
    tasks_per_iter: int = 8
    """distinct training tasks per iteration"""
    group_size: int = 4
    """rollouts per task (the G of group-relative advantages)"""
    filter_groups: bool = False
    """dynamic sampling (DAPO): drop a task's G rollouts when all their rewards are equal (no
    group-relative signal) and roll out more of the iteration's tasks until tasks_per_iter groups remain"""
    filter_signal: str = "reward"
    """filter_groups: what must differ within a group to keep it: reward (penalties and member costs
    count) or correct (DAPO's rule: some but not all rollouts solved the task)"""
    max_gen_batches: int = 3
    """filter_groups: at most this many rollout batches of tasks_per_iter tasks per iteration (then the
    update takes the groups it has)"""
    epochs: int = 2
    """passes over each rollout batch (more than one: off-policy updates, rho != 1)"""
    rows_per_batch: int = 64
    """rows per minibatch, i.e. per optimizer step (events are never split)"""
    minibatches_per_iter: int | None = None
    """split each rollout batch into this many minibatches (overrides rows_per_batch)"""
    forward_rows: int = 64
    """rows per forward pass inside a micro-batch (length-bucketed; unused with prefix_tree)"""
    max_tokens_per_microbatch: int | None = None
    """prompt+response tokens per micro-batch (with prefix_tree: prefix-tree nodes): backward per
    micro-batch, one optimizer step per minibatch, the gradient equal to the whole minibatch's (None: the
    minibatch is one micro-batch); a critic (MAPPO) chunks its state inputs by the same budget"""
    prefix_tree: bool = False
    """forward each micro-batch as its rows' prefix tree (learners.prefix.pack_rows): every distinct
    prefix (shared prompts, repeated response starts) computed once, log-probs equal to the per-row
    forward up to float rounding; micro-batches group events that share prefixes"""
    pack_len: int = 512
    """prefix_tree: tokens per packed sequence (attention is dense within one: cost ~ pack_len^2)"""
    lr: float = 3e-4
    """policy learning rate (AdamW)"""
    warmup: int = 0
    """linear warm-up steps of the learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""
    max_nonfinite_steps: int = 3
    """stop the run (non-zero exit, last finite checkpoint kept, nothing exported) after this many optimizer
    steps in a row were skipped for a non-finite loss or gradient norm (each is counted in
    actor/nonfinite_steps)"""
    guard_max_approx_kl: float = 1.0
    """divergence guard (learners.guard): stop the run (exit 3, this iteration's weights neither checkpointed
    nor exported) when an iteration's actor/approx_kl exceeds this (inf: off)"""
    guard_max_log_ratio: float = 2.0
    """divergence guard: stop when an iteration's actor/mean_abs_log_ratio exceeds this (inf: off)"""
    guard_max_loss: float = 100.0
    """divergence guard: stop when an iteration's |actor/loss| exceeds this (inf: off)"""
    guard_max_grad_norm: float = 1e4
    """divergence guard: stop when an iteration's actor/grad_norm (before clipping) exceeds this (inf: off)"""
    guard_eval_drop: float = 0.5
    """divergence guard: stop when held-out accuracy falls by more than this fraction of iteration 0's and
    the fall is beyond sampling noise (z >= 3; checked when evaluated and iteration 0 solved at least 10
    samples; 1: off)"""
    clip_eps: float | None = None
    """clip range of the ratio (event ratio for SRPO, token ratio for GRPO/PPO, sequence ratio for GSPO);
    None: the algorithm's (0.2; GSPO 3e-4 with upper 4e-4, its paper's, as its ratio is a per-token mean)"""
    clip_eps_high: float | None = None
    """upper clip range (DAPO clip-higher); None: clip_eps when that is given, else the algorithm's"""
    norm: str = "sqrt"
    """SRPO set normalisation: sqrt, sum, mean, k1"""
    agg: str | None = None
    """token-loss aggregation of GRPO-style losses (None: the algorithm's, token-mean for most)"""
    adv_scale: str | None = None
    """group-relative advantage scale: std or none (None: the algorithm's; dr-grpo uses none)"""
    adv_estimator: str | None = None
    """override the algorithm's advantage estimator (a name in ADV_ESTIMATORS)"""
    member_cost_advantage: str = "in-outcome"
    """an env's member cost in the advantage: in-outcome (part of the reward the estimator normalises) or
    apart (the outcome normalised alone, the cost added centred in its group at its own scale)"""
    policy_loss: str | None = None
    """override the algorithm's policy loss (a name in POLICY_LOSSES)"""
    kl_coef: float = 0.0
    """weight of the k3 KL to the frozen initial policy"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus"""
    temperature: float = 1.0
    """sampling temperature (the log-probs are computed at the same temperature)"""
    top_p: float = 1.0
    """nucleus sampling; must be 1 for training (the behaviour log-probs are full-softmax ones)"""
    max_new_tokens: int = 48
    """generation budget per output; also Dr.GRPO's constant length normaliser"""
    critic_lr: float = 1e-3
    """learning rate of a critic (MAPPO)"""
    critic_max_tokens: int = 256
    """critic input budget: the question (head) plus as much of the latest state (tail) as fits"""
    gamma: float = 1.0
    """GAE discount (MAPPO)"""
    gae_lambda: float = 0.95
    """GAE lambda (MAPPO)"""
    vf_clip: float = 0.2
    """value-loss clip (MAPPO)"""
    lora_rank: int = 8
    """LoRA rank for sharing=lora"""
    device: str = "cpu"
    """auto, cpu, cuda or cuda:<i> (auto: cuda when available)"""
    dtype: str = "float32"
    """float32, bfloat16 (autocast with float32 master weights and float32 log-prob math) or float64"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, ~30% more compute)"""
    memory_check: bool = True
    """GPU runs: print the memory plan (learners.memory_plan: weights, gradients, AdamW moments, vLLM share,
    activations per micro-batch) before the model loads, and refuse a run that does not fit with what would"""
    dp_engine: str = "allreduce"
    """data-parallel learner under torchrun/accelerate: allreduce (replicated weights) or fsdp2 (sharded)"""
    dist_timeout: float = 7200.0
    """torchrun/accelerate: seconds a collective may wait for the other ranks before the run fails
    (init_process_group's timeout); longer than rank 0's longest rollout or evaluation, which the others
    wait for; with Ray rollout workers longer than rollout_timeout (checked), so that rank 0 can declare a
    worker hung, restart it and collect its share again before the waiting ranks give up (default: twice
    rollout_timeout's default)"""
    backend: str = "hf"
    """rollout generation: hf (the learner's model) or vllm (a colocated vLLM engine, weights pushed after
    every update, truncated importance sampling against the learner's recompute), or openai (a vLLM server at
    base_url: exact token ids and log-probs over HTTP, a LoRA adapter per role pushed after every update)"""
    base_url: str | None = None
    """backend=openai: the server's API root, e.g. http://127.0.0.1:8000/v1 (learners.served says how to start
    it: runtime LoRA updating, --logprobs-mode processed_logprobs)"""
    served_sampling: dict[str, Any] = field(default_factory=dict)
    """backend=openai: sampling fields sent instead of the neutral set (top_k=-1, min_p=0, repetition_penalty=1,
    presence/frequency_penalty=0), e.g. top_k=20; the log-prob gate then tells whether the learner's
    softmax(z/T) still describes the server's samples"""
    served_concurrency: int = 8
    """backend=openai: requests in flight at once"""
    served_timeout: float = 120.0
    """backend=openai: seconds one request may take in total (connect, queue, generate, read)"""
    logprob_tolerance: float = 0.05
    """backend=openai: the most mean |server - learner| log-prob per response token allowed, by a probe before
    training and by every iteration's rollout/logprob_abs_diff; beyond it the run stops with the numbers"""
    vllm_gpu_memory_utilization: float = 0.3
    """backend=vllm: share of each GPU the engine reserves for its weights and KV cache (vLLM's
    gpu_memory_utilization; the learner has the rest); on vLLM's CPU build a share of host memory, unless
    VLLM_CPU_KVCACHE_SPACE (GiB) sizes its KV cache"""
    vllm_sleep: bool = True
    """backend=vllm: the engine sleeps during each update (weights to host memory, KV cache freed) and wakes
    for the next weight push, where vLLM supports it (CUDA/ROCm; not its CPU build, where it stays awake)"""
    vllm_enforce_eager: bool = False
    """backend=vllm: run the engine eagerly (no torch.compile, no CUDA graphs): starts in seconds instead of
    minutes, generates slower; for short runs and tests (verl's rollout enforce_eager)"""
    rollout_workers: int = 0
    """Ray actors that collect rollouts, each with its envs and a policy copy (0: this process)"""
    ray_address: str | None = None
    """Ray cluster to join for rollout workers (None: $RAY_ADDRESS, else a local Ray started on demand)"""
    rollout_timeout: float = 3600.0
    """Ray rollout workers: seconds one worker's share of a collection may take before the worker counts as
    hung (it is restarted, given its envs and the latest weights again, and its share collected again)"""
    tis: str = "auto"
    """truncated importance sampling rollout -> training policy: auto (vllm only, at the loss's ratio level:
    token for grpo/ppo/mappo as in verl, sequence-mean for gspo, event for srpo), off, token, sequence,
    sequence-mean (a row's per-token geometric mean: GSPO's length-normalised ratio scale), event (srpo: the
    event's ratio on the scale c(K) of its clipped ratio); each row's weight reaches its own tokens"""
    tis_cap: float = 2.0
    """truncation C of the importance weights min(pi_train / pi_rollout, C) (verl's rollout_is_threshold)"""
    max_staleness: int = 0
    """asynchronous RL: a generator thread with its own policy copy rolls out iterations t+1..t+N while the
    learner updates on t; rows more than N versions behind are dropped (0: the synchronous loop)"""
    staleness_correction: str = "decoupled"
    """max_staleness >= 1: decoupled (AReaL: clip around the recomputed proximal policy, importance weight
    min(proximal / behaviour, tis_cap) at the --tis level, auto: the loss's) or none (plain clip, the ablation)"""
    eval_every: int = 10
    """held-out evaluation every N iterations (0: never)"""
    eval_problems: int = 64
    """held-out tasks per evaluation"""
    eval_k: int = 1
    """samples per held-out task"""
    save_every: int = 5
    """checkpoint every N iterations (0: never)"""
    seed: int = 0
    """seed of everything random"""
    tensorboard: bool = False
    """also log to OUT/tb (the same as adding tensorboard to --logger)"""
    logger: tuple[str, ...] = ("jsonl",)
    """where metrics go: console, jsonl, tensorboard, wandb (offline unless WANDB_MODE is set), mlflow
    (OUT/mlflow.db unless MLFLOW_TRACKING_URI is set); OUT/metrics.jsonl is always written"""

    def __post_init__(self) -> None:
        if isinstance(self.logger, str):  # "jsonl,wandb" from a file or a dict: a list of names
            self.logger = tuple(x.strip() for x in self.logger.split(",") if x.strip())
        # every value has its field's type first (srpo_common.fieldcheck): the checks below compare numbers
        check_fields(self, allow_inf=INF_OK_FIELDS, names=dotted_names())
        self.logger = parse_loggers(self.logger)  # checked by name
        self.validate_sections()

    def validate_sections(self) -> None:
        """Each section's values checked by its own ``_check_<section>`` method, in
        :data:`TRAIN_SECTIONS` order (a rule between fields lives with the field it constrains). The first
        failure is a ``ValueError`` (of its own class, e.g. ``EnvKwargsError``) whose message starts with
        the section, ``[update] clip_eps must be >= 0 ...``: where to look in an experiment file."""
        for name in TRAIN_SECTIONS:
            try:
                getattr(self, f"_check_{name}")()
            except ValueError as exc:
                if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith(f"[{name}] "):
                    exc.args = (f"[{name}] {exc.args[0]}", *exc.args[1:])
                raise

    def _check_run(self) -> None:
        """The algorithm and the env by name (their registries), the env's kwargs, sizes and seed."""
        get_algorithm(self.algo)  # unknown: raises with the known names
        self._check_env()
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        for name in ("seed", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.seed >= 2**32:
            raise ValueError(f"seed must be < 2**32, got {self.seed}")

    def _check_policy(self) -> None:
        """How the policies are held: sharing, LoRA rank, dtype, device."""
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        if self.lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {self.lora_rank}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:<i>, got {self.device!r}")

    def _check_rollout(self) -> None:
        """What one iteration samples: sizes, the sampler, dynamic sampling, staleness."""
        for name in ("tasks_per_iter", "group_size", "max_gen_batches", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.filter_signal not in FILTER_SIGNALS:
            raise ValueError(f"filter_signal must be one of {FILTER_SIGNALS}, got {self.filter_signal!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_p < 1.0:
            # The sampler records log p(token) under the full softmax, but a nucleus sample was drawn
            # from the renormalised truncated distribution, so rho = pi / mu would be off by the
            # nucleus mass on every token (and the trainer's pi is a full-softmax one too).
            raise ValueError(
                "top_p < 1 is not supported for training: the behaviour log-probs are full-softmax "
                "log-probs, not those of the truncated nucleus the tokens were drawn from, so the "
                "importance ratio would be wrong. Use top_p=1 (temperature still applies)."
            )
        n = self.max_staleness
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"max_staleness must be an integer >= 0, got {n!r}")
        if n and self.backend == "vllm":
            raise ValueError(
                "max_staleness >= 1 generates beside the update, on other hardware than the learner's: the "
                "in-process vLLM engine shares the learner's device (it sleeps while the learner updates); serve "
                "the model (`vllm serve`, learners.served) and train with backend=openai, or use backend=hf (a "
                "copy in this process, or Ray rollout workers)"
            )

    def _check_update(self) -> None:
        """Batching, the optimizer, the estimator and loss by name, clipping, TIS and staleness correction."""
        for name in ("epochs", "rows_per_batch", "forward_rows", "pack_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("minibatches_per_iter", "max_tokens_per_microbatch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or None), got {value}")
        # lr 0: the weights stay put (the exactness tests' frozen updates)
        for name in ("lr", "warmup", "weight_decay", "kl_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        spec = get_algorithm(self.algo)
        get_adv_estimator(self.adv_estimator or spec.estimator)
        loss = get_policy_loss(self.policy_loss or spec.loss)
        if self.norm not in EVENT_NORMS:
            raise ValueError(f"norm must be one of {sorted(EVENT_NORMS)}, got {self.norm!r}")
        agg = self.resolved("agg")
        if agg is not None and agg not in AGG_MODES:
            raise ValueError(f"agg must be one of {sorted(AGG_MODES)}, got {agg!r}")
        scale = self.resolved("adv_scale")
        if scale is not None and scale not in ADV_SCALES:
            raise ValueError(f"adv_scale must be one of {ADV_SCALES}, got {scale!r}")
        if self.member_cost_advantage not in MEMBER_COST_ADVANTAGES:
            raise ValueError(
                f"member_cost_advantage must be one of {MEMBER_COST_ADVANTAGES}, got {self.member_cost_advantage!r}"
            )
        if min(self.clip_range()[0], self.clip_range()[1] or 0.0) < 0:
            raise ValueError(f"clip_eps and clip_eps_high must be >= 0, got {self.clip_range()}")
        if self.tis not in TIS_MODES:
            raise ValueError(f"tis must be one of {TIS_MODES}, got {self.tis!r}")
        if self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")
        tis_on = self.tis != "off" and not (self.tis == "auto" and self.backend == "hf")
        if tis_on and not loss.token_weights:
            # TIS weights reach the loss as per-token weights (each row its own); a loss that does not
            # take them would silently train without the correction
            raise ValueError(
                f"tis={self.tis} needs a policy loss that takes per-token weights; {loss.name!r} does "
                "not (register it with token_weights=True), use --tis off"
            )
        if self.staleness_correction not in STALENESS_CORRECTIONS:
            raise ValueError(
                f"staleness_correction must be one of {STALENESS_CORRECTIONS}, got {self.staleness_correction!r}"
            )
        if self.max_staleness and self.staleness_correction == "decoupled" and self.tis == "off":
            raise ValueError(
                "staleness_correction=decoupled weights stale rows by min(pi_prox / pi_behaviour, tis_cap) at the "
                "--tis level; --tis off leaves no level: use --tis auto, or --staleness-correction none"
            )

    def _check_critic(self) -> None:
        """A critic's learning rate, context and GAE coefficients."""
        if self.critic_lr < 0:  # 0: the critic stays put
            raise ValueError(f"critic_lr must be >= 0, got {self.critic_lr}")
        if self.critic_max_tokens < 1:
            raise ValueError(f"critic_max_tokens must be >= 1, got {self.critic_max_tokens}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not self.vf_clip > 0:
            raise ValueError(f"vf_clip must be > 0, got {self.vf_clip}")

    def _check_engine(self) -> None:
        """The generation backend and what a served or vLLM engine needs."""
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "openai":

            if not self.base_url:
                raise ValueError("backend=openai needs base_url (the vLLM server's API root, .../v1)")
            if self.sharing != "lora":
                raise ValueError(SHARED_REFUSAL)
            if self.rollout_workers > 0:
                raise ValueError("backend=openai generates on its server: rollout_workers must be 0")
        if self.served_concurrency < 1 or not self.served_timeout > 0 or not self.logprob_tolerance >= 0:
            raise ValueError(
                "served_concurrency must be >= 1, served_timeout > 0 and logprob_tolerance >= 0, got "
                f"{self.served_concurrency}, {self.served_timeout}, {self.logprob_tolerance}"
            )
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}"
            )

    def _check_scale(self) -> None:
        """Ray workers, the data-parallel engine and the timeouts between them."""
        if self.rollout_workers < 0:
            raise ValueError(f"rollout_workers must be >= 0, got {self.rollout_workers}")
        if self.dp_engine not in DP_ENGINES:
            raise ValueError(f"dp_engine must be one of {DP_ENGINES}, got {self.dp_engine!r}")
        if self.dp_engine == "fsdp2" and self.sharing == "lora":
            raise ValueError("dp_engine=fsdp2 does not shard LoRA adapters: use sharing=shared or per-role")
        if self.dp_engine == "fsdp2" and self.prefix_tree:  # its packed forward calls the decoder and the
            # head directly, past the root module's FSDP hooks that gather the embeddings and the head
            raise ValueError("dp_engine=fsdp2 does not support prefix_tree: use one or the other")
        if not (self.dist_timeout > 0 and self.rollout_timeout > 0):
            raise ValueError(
                f"dist_timeout and rollout_timeout must be > 0 seconds, got {self.dist_timeout}, {self.rollout_timeout}"
            )
        if self.rollout_workers > 0 and self.dist_timeout <= self.rollout_timeout:
            # the other ranks wait in a collective while rank 0 waits for a hung Ray worker: they must
            # outlast rollout_timeout, or they fail before rank 0 can restart the worker and recollect
            raise ValueError(
                f"dist_timeout ({self.dist_timeout:g} s) must be longer than rollout_timeout "
                f"({self.rollout_timeout:g} s) with rollout workers: the other ranks wait in a collective while "
                "rank 0 waits for a hung worker, restarts it and collects its share again (e.g. --dist-timeout "
                f"{2 * self.rollout_timeout:g})"
            )

    def _check_eval(self) -> None:
        """Held-out evaluation: how often and how much (its env kwargs are checked with the run's env)."""
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        for name in ("eval_problems", "eval_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def _check_guard(self) -> None:
        """The divergence guard's thresholds and the non-finite step limit."""
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        guard.validate(self)

    def _check_env(self) -> None:
        """A registered env id whose constructor takes every key of env_kwargs and eval_env_kwargs."""
        try:
            spec = srpo_envs.registry[self.env_id]
        except KeyError:
            raise ValueError(
                f"unknown env id {self.env_id!r}; registered ids: {', '.join(sorted(srpo_envs.registry))}"
            ) from None
        spec.check_kwargs({**self.env_kwargs, **self.eval_env_kwargs})

    def resolved(self, name: str) -> Any:
        """``getattr(self, name)``, or the algorithm's default when the field is None."""
        value = getattr(self, name)
        if value is None:
            return get_algorithm(self.algo).defaults.get(name, _FALLBACKS.get(name))
        return value

    def clip_range(self) -> tuple[float, float | None]:
        """``(clip_eps, clip_eps_high)`` the loss uses: what the user set, else the algorithm's.

        An explicit ``clip_eps`` alone also sets the upper side (``clip_eps_high=None`` means "same as
        clip_eps"): the algorithm's upper default belongs with its lower one, never with the user's.
        """
        low = float(self.resolved("clip_eps"))
        if self.clip_eps_high is not None or self.clip_eps is not None:
            return low, self.clip_eps_high
        return low, self.resolved("clip_eps_high")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        # max_policy_lag (removed): it never had an effect, every row of this synchronous loop comes from
        # the current weights; checkpoints written with it still load
        d = {k: v for k, v in d.items() if k != "max_policy_lag"}
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        return cls(**d)


#: Float fields whose ``inf`` means something (a guard threshold's "off"); every other float must be finite.
INF_OK_FIELDS = ("guard_max_approx_kl", "guard_max_log_ratio", "guard_max_loss", "guard_max_grad_norm")

#: Values of the ``None``-means-algorithm-default fields when the algorithm sets none.
_FALLBACKS: dict[str, Any] = {"agg": "token-mean", "adv_scale": "std", "clip_eps": 0.2}


def reference_page() -> str:
    """The markdown of docs/config-reference.md: every ``TrainConfig`` field by section (name, type, default
    and its docstring, the ``--help`` text), generated from the class (``python -m learners.config``
    rewrites the page; ``tests/learners/test_python_api.py`` fails when the two disagree)."""
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
        "docs/config-reference.md`; `tests/learners/test_python_api.py` fails when this page and the class disagree. "
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
