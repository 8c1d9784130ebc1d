"""The rollout -> update loop: one update path for every algorithm, looked up by name.

Per iteration:

1. sample ``tasks_per_iter`` training tasks and roll out ``group_size`` episodes of each
   (:class:`agents.rollout.RolloutCollector`; one batched generate per round); with ``filter_groups``
   (DAPO's dynamic sampling, :mod:`learners.dynamic_sampling`) groups whose rewards are all equal are
   dropped and further tasks rolled out until ``tasks_per_iter`` groups with a signal remain;
2. build the batch's events once (:func:`learners.batching.build_event_table`: row -> event,
   event -> comparable group / episode, row -> role, the per-event reward terms) and compute one
   advantage per row with the estimator the algorithm names (:data:`learners.advantages.ADV_ESTIMATORS`;
   an algorithm with a critic first gets the critic's per-event values);
3. ``epochs`` passes over event-atomic minibatches (:mod:`learners.batching`), each collated once;
   every minibatch is split into event-atomic micro-batches bounded by ``max_tokens_per_microbatch``,
   each forwarded (per distinct model: shared, per-role or LoRA-per-role), scored by the policy loss
   the algorithm names (:data:`learners.losses.POLICY_LOSSES`) with the *whole minibatch's*
   normaliser, plus optional k3 KL to a frozen reference and an entropy bonus, and back-propagated;
   then one gradient clip and one optimizer step per minibatch (so the gradient equals one big batch's
   while peak memory follows the micro-batch);
4. diagnostics to ``metrics.jsonl`` (and each ``--logger`` backend, :mod:`learners.tracking`), held-out evaluation every ``eval_every``
   iterations, and a checkpoint (weights, optimizer, scheduler, RNG states, iteration) that
   ``resume`` continues from bit-identically on CPU.

The algorithms (:data:`learners.algorithms.ALGORITHMS`: srpo, grpo, dr-grpo, gspo, dr-mas, at-grpo,
rloo, mappo) differ only in the estimator / loss / defaults they name; the loop never branches on
the name. Everything random is seeded from ``(seed, iteration)``, so a resumed run replays exactly
what the uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.hf import (
    HFPolicy,
    adapter_scope,
    default_lora_config,
    enable_gradient_checkpointing,
    lora_policy_map,
)
from agents.model_source import resolve_model
from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutBatch, merge_batches
from learners import checkpoint as ckpt
from learners import config as config_sections
from learners import guard
from learners.advantages import ADV_SCALES, AdvantageConfig, AdvantageResult, get_adv_estimator
from learners.algorithms import ALGORITHMS, Algorithm, get_algorithm  # noqa: F401 (re-exported)
from learners.batching import (
    Batch,
    EventTable,
    MiniBatch,
    build_event_table,
    collate,
    event_minibatches,
    gather_response_logprobs,
    micro_batch_bounds,
    prefix_micro_batches,
)
from learners.critic import ValueCritic
from learners.diagnostics import GradingMonitor, k_stats
from learners.distributed import DP_ENGINES, all_gather_objects, all_reduce_sum, broadcast_object
from learners.dynamic_sampling import FILTER_SIGNALS, FilterStats, informative_groups, select_groups
from learners.losses import (
    AGG_MODES,
    EVENT_NORMS,
    LossConfig,
    entropy_from_logits,
    get_policy_loss,
    kl_k3,
    loss_denominator,
    masked_sum,
    value_loss,
)
from learners.prefix import pack_rows, packed_logprobs
from learners.scale import BACKENDS, TIS_MODES, ScaleOut
from learners.tracking import MultiTracker, flatten_config, open_trackers, parse_loggers

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


@config_sections.with_sections  # cfg.rollout, cfg.update, ... and cfg.derived (learners.config)
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
    guard_max_approx_kl: float = 5.0
    """divergence guard (learners.guard): stop the run (exit 3, this iteration's weights neither checkpointed
    nor exported) when an iteration's actor/approx_kl exceeds this (inf: off)"""
    guard_max_log_ratio: float = 3.0
    """divergence guard: stop when an iteration's actor/mean_abs_log_ratio exceeds this (inf: off)"""
    guard_max_loss: float = 100.0
    """divergence guard: stop when an iteration's |actor/loss| exceeds this (inf: off)"""
    guard_max_grad_norm: float = 1e4
    """divergence guard: stop when an iteration's actor/grad_norm (before clipping) exceeds this (inf: off)"""
    guard_eval_drop: float = 0.9
    """divergence guard: stop when held-out accuracy falls by more than this fraction of iteration 0's
    (checked when evaluated and iteration 0 solved at least 10 samples; 1: off)"""
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
        self.logger = parse_loggers(self.logger)  # a str or list from a file/dict, checked by name
        spec = get_algorithm(self.algo)  # unknown: raises with the known names
        get_adv_estimator(self.adv_estimator or spec.estimator)
        loss = get_policy_loss(self.policy_loss or spec.loss)
        if self.norm not in EVENT_NORMS:
            raise ValueError(f"norm must be one of {sorted(EVENT_NORMS)}, got {self.norm!r}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        agg = self.resolved("agg")
        if agg is not None and agg not in AGG_MODES:
            raise ValueError(f"agg must be one of {sorted(AGG_MODES)}, got {agg!r}")
        scale = self.resolved("adv_scale")
        if scale is not None and scale not in ADV_SCALES:
            raise ValueError(f"adv_scale must be one of {ADV_SCALES}, got {scale!r}")
        if self.dp_engine not in DP_ENGINES:
            raise ValueError(f"dp_engine must be one of {DP_ENGINES}, got {self.dp_engine!r}")
        if self.dp_engine == "fsdp2" and self.sharing == "lora":
            raise ValueError("dp_engine=fsdp2 does not shard LoRA adapters: use sharing=shared or per-role")
        if self.dp_engine == "fsdp2" and self.prefix_tree:  # its packed forward calls the decoder and the
            # head directly, past the root module's FSDP hooks that gather the embeddings and the head
            raise ValueError("dp_engine=fsdp2 does not support prefix_tree: use one or the other")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "openai":
            from learners.served import SHARED_REFUSAL

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
        if self.tis not in TIS_MODES:
            raise ValueError(f"tis must be one of {TIS_MODES}, got {self.tis!r}")
        tis_on = self.tis != "off" and not (self.tis == "auto" and self.backend == "hf")
        if tis_on and not loss.token_weights:
            # TIS weights reach the loss as per-token weights (each row its own); a loss that does not
            # take them would silently train without the correction
            raise ValueError(
                f"tis={self.tis} needs a policy loss that takes per-token weights; {loss.name!r} does "
                "not (register it with token_weights=True), use --tis off"
            )
        if min(self.clip_range()[0], self.clip_range()[1] or 0.0) < 0:
            raise ValueError(f"clip_eps and clip_eps_high must be >= 0, got {self.clip_range()}")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        guard.validate(self)
        if self.tis_cap <= 0 or self.rollout_workers < 0:
            raise ValueError("tis_cap must be > 0 and rollout_workers >= 0")
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
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.filter_signal not in FILTER_SIGNALS:
            raise ValueError(f"filter_signal must be one of {FILTER_SIGNALS}, got {self.filter_signal!r}")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:<i>, got {self.device!r}")
        sizes = (self.iterations, self.tasks_per_iter, self.group_size, self.epochs, self.rows_per_batch)
        if min(*sizes, self.forward_rows, self.pack_len, self.max_gen_batches) < 1:
            raise ValueError(
                "iterations, tasks_per_iter, group_size, epochs, rows_per_batch, forward_rows, pack_len and "
                "max_gen_batches must be >= 1"
            )
        for name in ("minibatches_per_iter", "max_tokens_per_microbatch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or None), got {value}")
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


#: Values of the ``None``-means-algorithm-default fields when the algorithm sets none.
_FALLBACKS: dict[str, Any] = {"agg": "token-mean", "adv_scale": "std", "clip_eps": 0.2}


def _iteration_seed(seed: int, iteration: int, salt: int = 0) -> int:
    return int(np.random.SeedSequence([seed, iteration, salt]).generate_state(1)[0])


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available else ``cpu``; ``cuda[:i]`` must be available."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available (use --device cpu or auto)")
    return dev


def generation_autocast(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype the learner's own rollouts (``backend=hf``) generate under: bf16 for a
    ``dtype=bfloat16`` run on a GPU (the weights stay float32 masters; decoding in float32 would take
    about twice the time and KV-cache memory), else None. On CPU the rollouts stay float32: bf16 CPU
    kernels are no faster there, and float32 keeps the CPU runs' rollouts as they were."""
    return torch.bfloat16 if dtype == "bfloat16" and device.type == "cuda" else None


@contextmanager
def _train_mode(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """``model.train()`` for the duration when ``on`` (transformers applies gradient checkpointing
    only in training mode); restores every submodule's previous mode.

    Every module, not the root's flag: a freshly wrapped ``PeftModel`` is in training mode around a base
    model in eval mode, and deciding by the root alone left its layers in eval mode, i.e. silently
    without checkpointing until a generation had called ``train()`` on the whole tree."""
    if not on:
        yield
        return
    modules = list(model.modules())
    modes = [m.training for m in modules]
    if all(modes):
        yield
        return
    model.train()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.training = mode


class Trainer:
    """Runs :class:`TrainConfig`; see the module docstring for the loop."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] | None = print) -> None:
        import srpo_envs

        self.cfg = cfg
        self.log = log or (lambda s: None)
        self._quiet = log is None
        self.out = Path(cfg.out_dir)
        self.algorithm: Algorithm = get_algorithm(cfg.algo)
        self.device = resolve_device(cfg.device)
        #: process layout (torchrun / accelerate ranks), Ray workers and the rollout engine
        self.scale = ScaleOut(self)
        self.dist = self.scale.dist
        self.device = self.scale.rank_device(self.device)
        if not self.dist.is_main:  # one rank reports (every rank computes the same numbers)
            self.log, self._quiet = (lambda s: None), True
        #: master-weight dtype: float32 for float32 and bfloat16 (autocast), float64 for exact tests
        self.param_dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)

        def train_env() -> Any:
            return srpo_envs.make(cfg.env_id, **cfg.env_kwargs)

        def eval_env() -> Any:
            return srpo_envs.make(cfg.env_id, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})

        probe = train_env()
        self.roles = sorted({probe.role_of(a) for a in probe.possible_agents})
        self.n_train_tasks = len(probe.unwrapped.tasks)
        self.n_eval_tasks = len(eval_env().unwrapped.tasks)
        self.policies = self._build_policies()
        sampling = SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens
        )
        self.collector, self.eval_collector = self.scale.collectors(train_env, eval_env, sampling)

        self.ref_models: dict[int, torch.nn.Module] = {}  # frozen copies, taken before any sharding
        if cfg.kl_coef > 0:
            for pol in self.policies.policies:
                key = id(pol.model)
                if key not in self.ref_models:
                    ref = copy.deepcopy(pol.model).eval()
                    for p in ref.parameters():
                        p.requires_grad_(False)
                    self.ref_models[key] = ref
        self.scale.shard_models()  # dp_engine=fsdp2: the optimizer below must see the sharded parameters
        params: dict[int, torch.nn.Parameter] = {}
        for pol in self.policies.policies:
            for p in pol.model.parameters():
                if p.requires_grad:
                    params.setdefault(id(p), p)
        self.params = list(params.values())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / cfg.warmup) if cfg.warmup > 0 else 1.0
        )
        self.critic: ValueCritic | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if self.algorithm.critic:
            self.critic = ValueCritic.from_pretrained(
                self.model_path,
                max_tokens=cfg.critic_max_tokens,
                pack_len=cfg.pack_len if cfg.prefix_tree else None,
            )
            self.critic.to(device=self.device, dtype=self.param_dtype)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr)
        #: the critic's values of the current batch's events (its "old" values for the value clip)
        self._event_values: torch.Tensor | None = None
        self.iteration = 0
        self.nonfinite_steps = 0  # optimizer steps skipped for a non-finite loss/gradient (whole run)
        self._nonfinite_streak = 0
        self._tracker: MultiTracker | None = None  # open during train() (learners.tracking)

    # ------------------------------------------------------------------ policies
    def _build_policies(self) -> PolicyMap:
        cfg = self.cfg
        if not cfg.model:
            raise ValueError("TrainConfig.model must name a model directory or hub id")
        #: the local directory of ``cfg.model`` (a hub id is looked up in the hub cache, downloaded
        #: when online; offline and uncached it is a ModelNotAvailable error that says how to fetch it)
        self.model_path = str(resolve_model(cfg.model))
        if self.device.type == "cuda":
            self._memory_plan()

        def load() -> HFPolicy:
            pol = HFPolicy(self.model_path, device=self.device, dtype=self.param_dtype)
            if cfg.gradient_checkpointing:
                enable_gradient_checkpointing(pol.model)
            return pol

        if cfg.sharing == "shared":
            policies = PolicyMap.shared(load(), self.roles)
        elif cfg.sharing == "per-role":
            policies = PolicyMap.per_role({role: load() for role in self.roles})
        else:
            policies = lora_policy_map(load(), self.roles, lora_config=default_lora_config(r=cfg.lora_rank))
            if cfg.gradient_checkpointing:  # again on the PeftModel: the recompute re-enters each role's adapter
                enable_gradient_checkpointing(policies.policies[0].model)
        for pol in policies.policies:  # rollouts in the training dtype (bf16 autocast on a GPU)
            pol.autocast_dtype = generation_autocast(cfg.dtype, self.device)
        return policies

    def _memory_plan(self) -> None:
        """GPU runs: the memory plan of this run on this rank's GPU, logged before the model loads; one
        that does not fit is a :class:`learners.memory_plan.MemoryPlanError` (unless not ``memory_check``)
        that lists what would fit, instead of an out-of-memory error minutes in."""
        from learners.memory_plan import PlanOptions, check_memory, load_model_shape, plan_memory

        options = PlanOptions.from_train_config(
            self.cfg, len(self.roles), self.dist.world_size, critic=self.algorithm.critic
        )
        try:
            shape = load_model_shape(self.model_path)
        except ValueError as exc:
            # a config the plan cannot read (not a decoder LM's keys): no plan, no refusal
            self.log(f"memory plan unavailable: {exc}")
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        self.log(check_memory(plan_memory(shape, options, total), refuse=self.cfg.memory_check))

    def _distinct_models(self) -> list[HFPolicy]:
        """One policy per distinct model object (LoRA views of one base count once)."""
        seen: dict[int, HFPolicy] = {}
        for pol in self.policies.policies:
            seen.setdefault(id(pol.model), pol)
        return list(seen.values())

    def _model_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Weights of every distinct model (``model<i>`` in :meth:`_distinct_models` order)."""
        return {
            f"model{i}": {k: v.detach().clone() for k, v in pol.model.state_dict().items()}
            for i, pol in enumerate(self._distinct_models())
        }

    # ------------------------------------------------------------------ advantages
    def _advantages(self, table: EventTable) -> AdvantageResult:
        """Per-row advantages from the estimator the algorithm names (critic values if it has one)."""
        cfg = self.cfg
        values = None
        if self.critic is not None:
            texts = [r.state_text for r in table.first_rows()]
            values = torch.zeros(len(texts), dtype=torch.float64)
            with torch.no_grad():
                for idx in self.critic.token_chunks(texts, cfg.max_tokens_per_microbatch):
                    values[idx] = self.critic([texts[i] for i in idx]).double().cpu()
        self._event_values = values
        estimator = get_adv_estimator(cfg.derived.adv_estimator)
        adv_cfg = AdvantageConfig(scale=cfg.derived.adv_scale, gamma=cfg.critic.gamma, gae_lambda=cfg.critic.gae_lambda)
        return estimator(table, adv_cfg, values)

    def _loss_config(self, denominator: float | None = None) -> LossConfig:
        update = self.cfg.update  # the [update] section with its resolved clip range and aggregation
        return LossConfig(
            clip_eps=update.clip_range[0],
            clip_eps_high=update.clip_range[1],
            norm=update.norm,
            agg=update.agg,
            norm_len=self.cfg.rollout.max_new_tokens,
            denominator=denominator,
        )

    # ------------------------------------------------------------------ update
    def _autocast(self) -> Any:
        if self.cfg.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _policy_logprobs(
        self, rows: list[Any], batch: Batch, extras: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``[R, T]`` log-probs of ``batch`` under the current policies, entropy and reference
        log-probs (None unless the entropy bonus / KL is on and ``extras``). ``rows`` are ``batch``'s rows."""
        cfg = self.cfg
        batch_t = batch.response_width
        groups: dict[int, tuple[HFPolicy, list[int]]] = {}
        for i, r in enumerate(rows):
            pol = self.policies[r.role]
            groups.setdefault(id(pol), (pol, []))[1].append(i)
        chunks: list[tuple[HFPolicy, list[int]]] = []
        for pol, idx in groups.values():
            # Length-sorted chunks: proposer prompts are short, aggregator prompts hold every candidate;
            # padding them to one width would multiply the forward cost (and memory) by the ratio.
            idx = sorted(idx, key=lambda i: (len(rows[i].prompt_ids), len(rows[i].response_ids)))
            step = len(idx) if cfg.prefix_tree else cfg.forward_rows  # a tree packs its own sequences
            chunks.extend((pol, idx[j : j + step]) for j in range(0, len(idx), step))
        logprobs = entropy = ref = pad = None
        shape = (len(rows), batch_t)
        for pol, idx in self.scale.forward_plan(chunks):  # FSDP2: padded to the ranks' common plan
            if idx is None:
                lock = self._lockstep_forward(pol)
                pad = lock if pad is None else pad + lock
                continue
            if cfg.prefix_tree:
                lp, ent, ref_lp = self._tree_logprobs(pol, [rows[i] for i in idx], extras)
            else:
                lp, ent, ref_lp = self._chunk_logprobs(pol, batch.take(idx), extras)
            t = lp.shape[1]
            index = torch.tensor(idx, device=lp.device)
            if logprobs is None:
                logprobs = torch.zeros(shape, dtype=lp.dtype, device=lp.device)
            logprobs = logprobs.index_put((index,), torch.nn.functional.pad(lp, (0, batch_t - t)))
            if ent is not None:
                if entropy is None:
                    entropy = torch.zeros(shape, dtype=ent.dtype, device=ent.device)
                entropy = entropy.index_put((index,), torch.nn.functional.pad(ent, (0, batch_t - t)))
            if ref_lp is not None:
                if ref is None:
                    ref = torch.zeros(shape, dtype=ref_lp.dtype, device=ref_lp.device)
                ref = ref.index_put((index,), torch.nn.functional.pad(ref_lp, (0, batch_t - t)))
        assert logprobs is not None
        if pad is not None:  # + 0: ties the lockstep forwards into this micro-batch's backward
            logprobs = logprobs + pad
        return logprobs, entropy, ref

    def _chunk_logprobs(
        self, pol: HFPolicy, sub: Batch, extras: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One padded per-row forward: ``[n, t]`` log-probs, entropy and reference log-probs (or None)."""
        cfg = self.cfg
        t = sub.response_width
        with (
            adapter_scope(pol.model, pol.adapter_name),
            self._autocast(),
            _train_mode(pol.model, cfg.gradient_checkpointing),
        ):
            logits = pol.model(**sub.model_inputs(), logits_to_keep=t + 1).logits
        lp = gather_response_logprobs(logits, sub, cfg.temperature)
        ent = ref_lp = None
        if cfg.entropy_coef > 0 and extras:
            ent = entropy_from_logits(logits[:, -t - 1 : -1] / max(cfg.temperature, 1e-6))
        if cfg.kl_coef > 0 and extras:
            with torch.no_grad(), adapter_scope(pol.model, pol.adapter_name), self._autocast():
                ref_logits = self.ref_models[id(pol.model)](**sub.model_inputs(), logits_to_keep=t + 1).logits
            ref_lp = gather_response_logprobs(ref_logits, sub, cfg.temperature)
        return lp, ent, ref_lp

    def _tree_logprobs(
        self, pol: HFPolicy, rows: list[Any], extras: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`_chunk_logprobs` through one prefix-tree forward of ``rows`` (``prefix_tree``):
        ``[n, t]`` with ``t`` their longest response, 0 past each row's response."""
        cfg = self.cfg
        packed = pack_rows(
            [r.prompt_ids for r in rows], [r.response_ids for r in rows], pol.pad_id, cfg.pack_len
        )
        with (
            adapter_scope(pol.model, pol.adapter_name),
            self._autocast(),
            _train_mode(pol.model, cfg.gradient_checkpointing),
        ):
            lp, _, ent = packed_logprobs(
                pol.model,
                [],
                [],
                cfg.temperature,
                with_entropy=cfg.entropy_coef > 0 and extras,
                packed=packed,
            )
        ref_lp = None
        if cfg.kl_coef > 0 and extras:
            with torch.no_grad(), adapter_scope(pol.model, pol.adapter_name), self._autocast():
                ref_lp = packed_logprobs(
                    self.ref_models[id(pol.model)], [], [], cfg.temperature, packed=packed
                )[0]
        return lp, ent, ref_lp

    def old_logprobs(self, rows: list[Any]) -> list[list[float]]:
        """``pi_old``: each row's response-token log-probs under the current weights, computed by the
        training forward itself (:meth:`_policy_logprobs`: the same autocast, temperature, length
        bucketing and prefix packing), without gradient, in chunks of ``max_tokens_per_microbatch``.

        Why not the sampler's log-probs or a separate float32 pass: the PPO ratio divides the training
        forward's log-probs by these, so any numerical difference (another engine, bf16 autocast vs the
        float32 sampler) would show up as a ratio != 1 before the first optimizer step and be clipped
        as if the policy had moved; computed this way the first ratio is exactly 1 wherever a training
        micro-batch forwards the same rows as a chunk here (bit-identical kernels and inputs).
        """
        pad_id = self.policies.policies[0].pad_id
        out: list[list[float]] = [[] for _ in rows]
        bounds = micro_batch_bounds(rows, torch.arange(len(rows)), self.cfg.max_tokens_per_microbatch)
        with torch.no_grad():
            for a, b in bounds:
                part = list(rows[a:b])
                if not any(r.response_ids for r in part):  # nothing to score (collate needs a token)
                    continue
                batch = collate(part, pad_id, dtype=self.param_dtype).to(self.device)
                lp = self._policy_logprobs(part, batch, extras=False)[0].double().cpu()
                for i, r in enumerate(part):
                    out[a + i] = lp[i, : len(r.response_ids)].tolist()
        return out

    def _lockstep_forward(self, pol: HFPolicy) -> torch.Tensor:
        """A forward FSDP2 needs from this rank to match the others (:meth:`ScaleOut.forward_plan`):
        a one-token input under the same contexts as a real chunk, returned as ``0 * logits.sum()``
        so that its backward issues the model's collectives and adds exactly zero gradient."""
        with (
            adapter_scope(pol.model, pol.adapter_name),
            self._autocast(),
            _train_mode(pol.model, self.cfg.gradient_checkpointing),
        ):
            logits = pol.model(**self.scale.dummy_inputs(), logits_to_keep=1).logits
        return logits.sum() * 0

    def _rows_per_batch(self, table: EventTable) -> int:
        """``rows_per_batch``, or the size that splits the batch into ``minibatches_per_iter``."""
        rows = sum(len(r) for r, ok in zip(table.event_rows, table.complete, strict=True) if ok)
        return self.cfg.update.rows_per_minibatch(rows)

    def _rollouts(self, it: int) -> tuple[RolloutBatch, RolloutBatch, FilterStats | None]:
        """Iteration ``it``'s rollouts: (every episode generated, the batch the update trains on, what
        dynamic sampling did). Without ``filter_groups`` both batches are the one collected batch; with
        it, batches of ``tasks_per_iter`` further tasks of the iteration's pool (drawn without
        replacement) are rolled out until ``tasks_per_iter`` informative groups are kept or
        ``max_gen_batches`` batches were generated."""
        rollout, seed = self.cfg.rollout, self.cfg.seed  # the [rollout] section alone, and the run's seed
        rng = np.random.default_rng(_iteration_seed(seed, it, 0))
        if not rollout.filter_groups:
            tasks = rng.choice(
                self.n_train_tasks, size=min(rollout.tasks_per_iter, self.n_train_tasks), replace=False
            )
            batch = self.scale.collect(
                self.collector,
                sorted(int(t) for t in tasks),
                rollout.group_size,
                _iteration_seed(seed, it, 99),
            )
            return batch, batch, None
        pool = rng.permutation(self.n_train_tasks)[: rollout.tasks_per_iter * rollout.max_gen_batches]
        generated: list[RolloutBatch] = []
        kept: list[RolloutBatch] = []
        filtered = FilterStats()
        for b in range(rollout.max_gen_batches):
            tasks = pool[b * rollout.tasks_per_iter : (b + 1) * rollout.tasks_per_iter]
            if len(tasks) == 0 or filtered.groups_kept >= rollout.tasks_per_iter:
                break
            batch = self.scale.collect(
                self.collector,
                sorted(int(t) for t in tasks),
                rollout.group_size,
                _iteration_seed(seed, it, 99 + b),
            )
            generated.append(batch)
            groups = informative_groups(batch, rollout.filter_signal)[: rollout.tasks_per_iter - filtered.groups_kept]
            kept.append(select_groups(batch, groups))
            filtered.gen_batches += 1
            filtered.groups_generated += len({r.group_id for r in batch.rows})
            filtered.groups_kept += len(groups)
        return merge_batches(generated), merge_batches(kept), filtered

    def _update(self, batch: RolloutBatch, iteration: int) -> dict[str, Any]:
        """Advantages once, then ``epochs`` x minibatches of (micro-batched) loss and one step each."""
        cfg = self.cfg
        loss_fn = get_policy_loss(cfg.derived.policy_loss)
        unit = loss_fn.unit(self._loss_config())
        # [R, T] TIS weights (per token, or a row's / an event's weight on its tokens) reach the loss as
        # LossConfig.token_weights: each row its own, in every loss; an event weight of an event loss
        # (SRPO) on the scale of its clipped ratio, c(K) of its set normalisation
        batch, token_weights, prep_stats = self.scale.prepare(
            batch,
            ratio_level=loss_fn.ratio_level(self._loss_config()),
            norm=cfg.norm if unit in ("events", "members") else "sum",
            pi_old=lambda rows: self._composed_old_logprobs(rows, iteration),
        )
        table = build_event_table(batch.rows)
        adv = self._advantages(table)
        stats: dict[str, list[float]] = {}
        dropped = 0
        skipped_before = self.nonfinite_steps
        for epoch in range(cfg.epochs):
            mbs = event_minibatches(
                table,
                rows_per_batch=self._rows_per_batch(table),
                seed=_iteration_seed(cfg.seed, iteration, 1 + epoch),
            )
            dropped = mbs.dropped_events
            for mb in mbs:
                st = self._minibatch_step(mb, table, adv, loss_fn, unit, token_weights)
                if self.critic is not None:
                    st.update(self._critic_step(mb, table, adv))
                for k, v in st.items():
                    stats.setdefault(k, []).append(float(v))
        for pol in self.policies.policies:
            pol.bump_version()
        # Per-minibatch diagnostics averaged over the iteration's optimizer steps, namespaced by who
        # produced them; K statistics describe the rollout batch (not a minibatch).
        out: dict[str, Any] = {}
        for k, v in stats.items():
            if k in ("mean_k", "max_k"):
                continue
            out[k if "/" in k else f"actor/{k}"] = float(np.mean(v))
        out.update(adv.stats)
        out.update(prep_stats)
        out.update(k_stats(table))  # mean_k, max_k, k_hist, and the multi-member-only view
        out["rollout/events_dropped"] = float(dropped)
        out["actor/nonfinite_steps"] = float(self.nonfinite_steps - skipped_before)
        return out

    def _micro_batches(
        self, mb: MiniBatch, full: Batch, collate: Callable[[MiniBatch], Batch]
    ) -> tuple[MiniBatch, Batch, list[list[int]], int]:
        """The composition one minibatch trains in: ``(this rank's shard, its collated batch, its
        micro-batches as row indices into the shard, the number of micro-batches every rank runs)``.
        ``full``: ``collate(mb)``. One function for :meth:`_minibatch_step` and :meth:`_composed_old_logprobs`,
        so ``pi_old`` is computed in exactly the forwards training makes."""
        if self.dist.enabled:  # normalisers span the whole minibatch; this rank computes its shard
            mb = self.scale.shard(mb)
            if mb.num_rows:  # a rank without an event still joins the gradient all-reduce (zeros)
                full = collate(mb)
        budget = self.cfg.max_tokens_per_microbatch
        if self.cfg.prefix_tree:  # events sharing prefixes together, the budget in prefix-tree nodes
            bounds = prefix_micro_batches(mb.rows, mb.event_index, budget)
        else:
            bounds = [list(range(a, b)) for a, b in micro_batch_bounds(mb.rows, mb.event_index, budget)]
        bounds = bounds if mb.num_rows else []
        n_micro = self.scale.agree_count(len(bounds))  # FSDP2: every rank runs the most any rank has
        return mb, full, bounds, n_micro

    def _composed_old_logprobs(self, rows: list[Any], iteration: int) -> list[list[float]]:
        """``pi_old`` of ``rows`` (the update's batch) from the very forwards that training will make in
        its first epoch: the same shuffled event minibatches, data-parallel shard, micro-batches, prefix
        packing, per-policy chunks and padding widths, without gradient, before any optimizer step.

        Why: the ratio divides the training forward's log-probs by these. Recomputed in another
        composition (batch order, other chunk widths, other packed sequences) they differ from the
        training forward's by rounding (bf16 autocast: ~1e-3), so the first on-policy ratio was only
        about 1 and SRPO summed that noise over an event's tokens. Computed here, every minibatch of
        epoch 0 divides a forward by a bit-identical forward of the same weights: the first minibatch's
        ratio is exactly 1, and a later one's moves only by the optimizer steps before it. Each rank
        scores its shards; the results are gathered so that every rank has every row (later epochs
        shard differently). Rows of events that no minibatch holds (incomplete ones) are scored in batch
        order (:meth:`ScaleOut.old_logprobs`); they are never trained on.
        """
        cfg = self.cfg
        table = build_event_table(rows)
        pad_id = self.policies.policies[0].pad_id

        def collate(part: MiniBatch) -> Batch:
            return part.collate(pad_id, dtype=self.param_dtype, table=table).to(self.device)

        # the minibatches of epoch 0 exactly as _update draws them (same table, size and seed)
        mbs = event_minibatches(
            table, rows_per_batch=self._rows_per_batch(table), seed=_iteration_seed(cfg.seed, iteration, 1)
        )
        mine: dict[int, list[float]] = {}
        with torch.no_grad():
            for whole in mbs:
                mb, full, bounds, n_micro = self._micro_batches(whole, collate(whole), collate)
                assert mb.row_index is not None
                for idx in bounds:
                    sub = full if idx == list(range(full.num_rows)) else full.take(idx)
                    lp = self._policy_logprobs([mb.rows[i] for i in idx], sub, extras=False)[0]
                    lp = lp.double().cpu()
                    for j, i in enumerate(idx):
                        mine[int(mb.row_index[i])] = lp[j, : len(mb.rows[i].response_ids)].tolist()
                for _ in range(n_micro - len(bounds)):  # FSDP2 lockstep, as in _minibatch_step
                    for pol, _ in self.scale.forward_plan([]):
                        self._lockstep_forward(pol)
        if self.dist.enabled:
            mine = {i: lp for part in all_gather_objects(mine, self.dist) for i, lp in part.items()}
        rest = [i for i in range(len(rows)) if i not in mine]  # the same on every rank (same table)
        if rest:
            mine.update(zip(rest, self.scale.old_logprobs([rows[i] for i in rest]), strict=True))
        return [mine[i] for i in range(len(rows))]

    def _minibatch_step(
        self,
        mb: MiniBatch,
        table: EventTable,
        adv: AdvantageResult,
        loss_fn: Any,
        unit: str,
        token_weights: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Collate once, backward per event-atomic micro-batch with the whole minibatch's
        normaliser (so the accumulated gradient equals the one-big-batch gradient), one step.
        ``token_weights``: table-wide ``[R, T]`` per-token loss weights (token-level TIS) or None."""
        cfg = self.cfg
        pad_id = self.policies.policies[0].pad_id

        def collate(part: MiniBatch) -> Batch:
            return part.collate(
                pad_id,
                dtype=self.param_dtype,
                table=table,
                advantages=adv.advantages,
                token_weights=token_weights,
            ).to(self.device)

        full = collate(mb)
        loss_cfg = self._loss_config(loss_denominator(unit, full.response_mask, full.event_index))
        tokens = loss_denominator("tokens", full.response_mask)
        mb, full, bounds, n_micro = self._micro_batches(mb, full, collate)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        micro: list[dict[str, float]] = []
        for idx in bounds:
            sub = full if idx == list(range(full.num_rows)) else full.take(idx)
            lp, ent, ref = self._policy_logprobs([mb.rows[i] for i in idx], sub)
            mask = sub.response_mask
            assert sub.advantages is not None and sub.event_index is not None
            sub_cfg = (
                loss_cfg if sub.token_weights is None else replace(loss_cfg, token_weights=sub.token_weights)
            )
            loss, st = loss_fn(lp, sub.old_logprobs, mask, sub.advantages, sub.event_index, sub_cfg)
            if ref is not None:
                kl = masked_sum(kl_k3(lp, ref), mask) / max(tokens, 1.0)
                loss = loss + cfg.kl_coef * kl
                st["kl_ref"] = float(kl.detach())
            if ent is not None:
                entropy = masked_sum(ent, mask) / max(tokens, 1.0)
                loss = loss - cfg.entropy_coef * entropy
                st["entropy"] = float(entropy.detach())
            loss.backward()
            total += float(loss.detach())
            micro.append(st)
        for _ in range(n_micro - len(bounds)):  # FSDP2 lockstep: zero-weight micro-batches
            sum(self._lockstep_forward(pol) for pol, _ in self.scale.forward_plan([])).backward()
        self.scale.reduce_gradients(self.params)  # sum of the ranks' shard gradients (no-op on one)
        total = all_reduce_sum(total, self.dist)
        grad_norm = self.scale.clip_gradients(self.params, cfg.max_grad_norm)
        if math.isfinite(total) and math.isfinite(float(grad_norm)):
            self.optimizer.step()
            self.scheduler.step()  # the schedule counts steps taken; a skipped one is not
            self._nonfinite_streak = 0
        else:  # never let a NaN/inf reach the weights: skip the step, count it, stop if it persists
            self._skip_nonfinite_step(total, float(grad_norm))
        out = {k: float(np.mean([m[k] for m in micro if k in m])) for k in (micro[0] if micro else {})}
        if "max_k" in out:
            out["max_k"] = float(max(m["max_k"] for m in micro))
        out.update(loss=total, grad_norm=float(grad_norm))
        return out

    def _critic_step(self, mb: MiniBatch, table: EventTable, adv: AdvantageResult) -> dict[str, float]:
        """One value-loss step on the minibatch's events (their states, old values and returns)."""
        assert self.critic is not None and self.critic_optimizer is not None
        assert mb.event_pos is not None and adv.returns is not None and self._event_values is not None
        pos = mb.event_pos
        texts = [table.event_row(e).state_text for e in pos.tolist()]
        self.critic_optimizer.zero_grad(set_to_none=True)
        total = 0.0
        stats: dict[str, float] = {}
        # backward per token-budget chunk, each chunk's mean weighted by its share of the events: the
        # accumulated gradient and the stats are those of the whole minibatch's mean value loss
        for idx in self.critic.token_chunks(texts, self.cfg.max_tokens_per_microbatch):
            values = self.critic([texts[i] for i in idx])
            sel = pos[idx]
            old = self._event_values[sel].to(device=values.device, dtype=values.dtype)
            ret = adv.returns[sel].to(device=values.device, dtype=values.dtype)
            vloss, vstats = value_loss(values, old, ret, clip_eps=self.cfg.vf_clip)
            share = len(idx) / len(texts)
            (vloss * share if share != 1 else vloss).backward()
            total += float(vloss.detach()) * share
            for k, v in vstats.items():
                stats[k] = stats.get(k, 0.0) + float(v) * share
        critic_norm = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.max_grad_norm))
        if math.isfinite(total) and math.isfinite(critic_norm):
            self.critic_optimizer.step()
        else:  # as for the policy: a non-finite value loss never reaches the critic's weights
            self.critic_optimizer.zero_grad(set_to_none=True)
        return {"critic/value_loss": total, **{f"critic/{k}": v for k, v in stats.items()}}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, n: int | None = None, k: int | None = None, seed: int = 10_007) -> float:
        """Held-out team accuracy: ``n`` eval-split tasks x ``k`` samples, fixed sampling seeds."""
        self.scale.sync_weights()  # every rank: under FSDP2 gathering the weights is collective
        if not self.dist.is_main:  # rank 0 evaluates; every rank returns its number
            return broadcast_object(None, self.dist)
        n = min(n or self.cfg.eval_problems, self.n_eval_tasks)
        batch = self.eval_collector.collect(list(range(n)), group_size=k or self.cfg.eval_k, seed=seed)
        return broadcast_object(batch.accuracy, self.dist)

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        """Run :meth:`_train_loop` with the run's trackers open (closed however the loop ends)."""
        self._tracker = open_trackers(
            (*self.cfg.logger, *(("tensorboard",) if self.cfg.tensorboard else ())), self.out,
            resume=self.iteration > 0, echo=None if self._quiet else self.log, main=self.dist.is_main,
        )  # fmt: skip
        try:
            # `section.field` keys, the paths `--set` and experiment files use; a resumed run's backends skip it
            self._tracker.log_hparams(flatten_config(config_sections.flat_to_sections(asdict(self.cfg))))
            return self._train_loop()
        finally:
            self._tracker.close()
            self._tracker = None

    def _train_loop(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:  # the resolved config: `srpo train --config OUT/config.toml` reruns this run
            config_sections.write_run_config(cfg, self.out)
        history = self._start_metrics()
        grading = GradingMonitor()  # grading/... deltas per record (the first includes iteration 0's eval)
        if cfg.eval_every and self.iteration == 0 and not history:
            acc = self.evaluate()
            self._append_metrics({"iteration": 0, "eval_accuracy": acc})
            history.append({"iteration": 0, "eval_accuracy": acc})
            self.log(f"[{cfg.algo}] iteration 0: held-out accuracy {acc:.3f}")
        try:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=cfg.iterations,
                initial=self.iteration,
                desc=f"{cfg.algo} train",
                disable=self._quiet,
            )
        except ImportError:  # pragma: no cover - tqdm is a core dependency
            bar = None
        while self.iteration < cfg.iterations:
            it = self.iteration + 1
            t0 = time.perf_counter()
            generated, batch, filtered = self._rollouts(it)
            t1 = time.perf_counter()
            stats = self._update(batch, it) if batch.rows else {}
            t2 = time.perf_counter()
            # what the policy did: every episode rolled out this iteration, kept for the update or not
            rewards = np.array([e.reward for e in generated.episodes])
            record: dict[str, Any] = {
                "iteration": it,
                "train_accuracy": generated.accuracy,
                "reward_mean": float(rewards.mean()),
                "reward_std": float(rewards.std()),
                "mean_response_len": float(np.mean([len(r.response_ids) for r in generated.rows])),
                "team_tokens": int(sum(e.team_tokens for e in generated.episodes)),
                "rows": len(batch.rows),
                "rollout_s": round(t1 - t0, 3),
                "update_s": round(t2 - t1, 3),
                **(filtered.metrics() if filtered is not None else {}),
                **stats,
            }
            if cfg.eval_every and (it % cfg.eval_every == 0 or it == cfg.iterations):
                record["eval_accuracy"] = self.evaluate()
            record.update(grading.delta())
            self.iteration = it
            self._append_metrics(record)
            history.append(record)
            self._check_divergence(record, history)  # before this iteration's weights are saved
            if cfg.save_every and (it % cfg.save_every == 0 or it == cfg.iterations):
                self.save_checkpoint()
            if bar is not None:
                bar.update(1)
                loss = stats.get("actor/loss", float("nan"))
                bar.set_postfix(acc=f"{batch.accuracy:.2f}", loss=f"{loss:.3f}")
        if bar is not None:
            bar.close()
        if self.dist.is_main or self.scale.fsdp:  # FSDP2: every rank helps gather, rank 0 writes
            self.export(self.out / "final")
        self.scale.close()
        return history

    # ------------------------------------------------------------------ persistence
    # Formats, atomic publishing, hashing and the distributed contract live in learners.checkpoint.
    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def _read_metrics(self) -> list[dict[str, Any]]:
        return ckpt.read_metrics(self.metrics_path)

    def _start_metrics(self) -> list[dict[str, Any]]:
        """Metrics history at the start of :meth:`train`: empty for a fresh run, else cut to the iteration.

        A fresh run (iteration 0) deletes a stale ``metrics.jsonl`` instead of appending to it, so an
        iteration is never logged twice; a resumed run keeps only rows its checkpoint covers.
        """
        if self.iteration == 0:
            stale = ckpt.reset_metrics(self.metrics_path)
            if stale:
                self.log(f"fresh start: removed {stale} stale rows of {self.metrics_path}")
            return []
        return ckpt.trim_metrics(self.metrics_path, self.iteration)

    def _append_metrics(self, record: dict[str, Any]) -> None:
        """One row to metrics.jsonl and the other --logger backends (outside train(): metrics.jsonl)."""
        if self._tracker is None:
            ckpt.append_metrics(self.metrics_path, record)
        else:
            self._tracker.log(record, step=int(record["iteration"]))

    @property
    def checkpoint_path(self) -> Path:
        """The run's checkpoint directory (see :mod:`learners.checkpoint` for its files)."""
        return self.out / ckpt.CHECKPOINT_DIR

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: full weights, optimizer, scheduler, RNGs."""
        return {
            "iteration": self.iteration,
            "config": asdict(self.cfg),
            "models": self.scale.model_states(),  # full tensors (gathered under FSDP2: collective)
            "policy_versions": [p.policy_version for p in self.policies.policies],
            "optimizer": self.scale.optimizer_state(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": self.critic_optimizer.state_dict()
            if self.critic_optimizer is not None
            else None,
            "rng": ckpt.capture_rng_state(),
        }

    def save_checkpoint(self) -> Path | None:
        """Publish :meth:`checkpoint_state` atomically (rank 0 writes under torch.distributed); weights
        that are not finite are never written (:class:`~learners.checkpoint.NonFiniteError`)."""
        state = self.checkpoint_state()
        for name, tensors in state["models"].items():
            if ckpt.nonfinite_tensors(tensors):
                raise ckpt.NonFiniteError(
                    f"{name} has non-finite weights; not checkpointed (the last checkpoint is kept)"
                )
        return ckpt.save_checkpoint(self.out, state)

    def _skip_nonfinite_step(self, loss: float, grad_norm: float) -> None:
        """Drop this minibatch's gradients instead of stepping; after ``max_nonfinite_steps`` in a row
        raise :class:`~learners.checkpoint.NonFiniteError` (the run stops before it saves or exports)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_steps += 1
        self._nonfinite_streak += 1
        if self._nonfinite_streak >= self.cfg.max_nonfinite_steps:
            raise ckpt.NonFiniteError(
                f"training diverged: {self._nonfinite_streak} optimizer steps in a row had a non-finite loss "
                f"or gradient (last: loss {loss}, grad norm {grad_norm}) at iteration {self.iteration + 1}; "
                f"stopped without exporting; the last checkpoint in {self.out} is kept (lower --lr?)"
            )

    def _check_divergence(self, record: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """:mod:`learners.guard` on this iteration's record: a :class:`~learners.guard.DivergenceError`
        (exit 3) before the diverged weights are checkpointed or exported."""
        kept = ckpt.find_checkpoint(self.out)
        guard.check(
            record,
            guard.GuardLimits.from_config(self.cfg),
            start=guard.start_accuracy(history),
            eval_samples=min(self.cfg.eval_problems, self.n_eval_tasks) * self.cfg.eval_k,
            where=f"the last checkpoint ({kept}) is kept" if kept else f"no checkpoint was written in {self.out}",
        )

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None) -> None:
        """Restore a checkpoint (run or checkpoint directory) and drop metrics logged after it.

        Every sha256 is checked before anything is restored, so a corrupt checkpoint raises
        :class:`learners.checkpoint.CheckpointError` and leaves this trainer untouched.
        """
        state = ckpt.load_checkpoint(path or self.out)
        ckpt.validate_train_state(state)  # junk values: one CheckpointError, before anything is touched
        try:
            saved = TrainConfig.from_dict(dict(state["config"]))
        except (TypeError, ValueError) as exc:
            where = path or self.out
            raise ckpt.CheckpointError(f"checkpoint in {where} has an invalid config: {exc}") from None
        old, new = (
            {k: v for k, v in asdict(c).items() if k not in LAYOUT_FIELDS + EXTENDABLE_FIELDS}
            for c in (saved, self.cfg)
        )
        if old != new:
            diff = {k for k in old if old[k] != new[k]}
            raise ckpt.CheckpointConfigError(
                f"checkpoint in {path or self.out} was written with a different config (differs in "
                f"{sorted(diff)}); resume with the same options, or train without --resume"
            )
        if self.cfg.iterations < int(state["iteration"]):
            raise ckpt.CheckpointConfigError(
                f"checkpoint in {path or self.out} is at iteration {state['iteration']}, past --iterations "
                f"{self.cfg.iterations}; resume with --iterations >= {state['iteration']}"
            )
        self.scale.load_model_states(state["models"])  # full weights; each FSDP2 rank keeps its shard
        for pol, version in zip(self.policies.policies, state["policy_versions"], strict=True):
            pol.policy_version = version
        self.scale.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])  # type: ignore[union-attr]
        ckpt.restore_rng_state(state["rng"])
        self.iteration = int(state["iteration"])
        ckpt.trim_metrics(self.metrics_path, self.iteration)

    def export(self, out: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` of the trained policy (one folder per distinct model)."""
        out = Path(out)
        models = self.scale.full_policies()  # FSDP2: unsharded copies on rank 0 (collective), else ours
        for i, pol in enumerate(models):
            if ckpt.nonfinite_tensors(pol.model.state_dict()):
                raise ckpt.NonFiniteError(f"model{i} has non-finite weights; not exported to {out}")
        for i, pol in enumerate(models):
            target = out if len(models) == 1 else out / f"model{i}"
            pol.model.save_pretrained(target)
            pol.tokenizer.save_pretrained(target)
        return out


def train(
    cfg: TrainConfig, resume: bool = False, log: Callable[[str], None] | None = print
) -> list[dict[str, Any]]:
    """Build a :class:`Trainer` and run it; ``resume`` continues from ``out_dir/checkpoint/``.

    ``resume`` with no checkpoint (none written yet, or the run was killed during its first write) is a
    :class:`learners.checkpoint.CheckpointError`, raised before the model is built, never a silent
    fresh start. Without ``resume`` a stale checkpoint and stale metrics in ``out_dir`` are removed.
    """
    if resume:
        ckpt.require_checkpoint(cfg.out_dir)
    trainer = Trainer(cfg, log=log)
    if resume:
        trainer.load_checkpoint()
        if log:
            log(f"resumed {cfg.algo} from iteration {trainer.iteration}")
    elif ckpt.remove_checkpoints(cfg.out_dir) and log:
        log(f"fresh start: removed the previous checkpoint in {cfg.out_dir}")
    return trainer.train()
