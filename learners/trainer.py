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

Where the parts live (each built here with its own sections of the config, :mod:`learners.config`):
the rollouts of step 1 in :mod:`learners.rollout_phase`, steps 2-3 in :mod:`learners.update` (the
public step is :meth:`Trainer.update`), the forwards and ``pi_old`` in :mod:`learners.forward`, the
metrics file, checkpoints and export of step 4 in :mod:`learners.run_state`, and the process layout
and rollout engine in :mod:`learners.scale` (which sees the trainer only through
:class:`learners.scale.ScaleHost`). This module keeps the config, the wiring and the loop.

The algorithms (:data:`learners.algorithms.ALGORITHMS`: srpo, grpo, dr-grpo, gspo, dr-mas, at-grpo,
rloo, mappo) differ only in the estimator / loss / defaults they name; the loop never branches on
the name. Everything random is seeded from ``(seed, iteration)``, so a resumed run replays exactly
what the uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.hf import HFPolicy, default_lora_config, enable_gradient_checkpointing, lora_policy_map
from agents.model_source import resolve_model
from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutBatch, RolloutCollector
from learners import checkpoint as ckpt
from learners import config as config_sections
from learners import guard
from learners.advantages import ADV_SCALES, get_adv_estimator
from learners.algorithms import ALGORITHMS, Algorithm, get_algorithm  # noqa: F401 (re-exported)
from learners.async_rollout import RolloutPipeline
from learners.critic import ValueCritic
from learners.diagnostics import GradingMonitor
from learners.distributed import DP_ENGINES, broadcast_object
from learners.dynamic_sampling import FILTER_SIGNALS
from learners.forward import PolicyForward, generation_autocast
from learners.losses import AGG_MODES, EVENT_NORMS, get_policy_loss
from learners.rollout_phase import RolloutPhase
from learners.run_state import RunState
from learners.scale import BACKENDS, TIS_MODES, ScaleOut
from learners.staleness import STALENESS_CORRECTIONS
from learners.tracking import flatten_config, open_trackers, parse_loggers
from learners.update import PolicyUpdate
from srpo_common.fieldcheck import check_fields
from srpo_common.interrupt import set_resume_point
from srpo_common.io import atomic_write_json

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
        check_fields(self, allow_inf=INF_OK_FIELDS, names=config_sections.dotted_names())
        self.logger = parse_loggers(self.logger)  # checked by name
        self._check_ranges()
        self._check_env()
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
        self._check_staleness()
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

    def _check_ranges(self) -> None:
        """Numbers that mean something only within a range (the type is already checked)."""
        positive = ("temperature", "max_grad_norm", "vf_clip")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        at_least = {
            "lr": 0, "critic_lr": 0,  # 0: the weights stay put (the exactness tests' frozen updates)
            "warmup": 0, "weight_decay": 0, "kl_coef": 0, "entropy_coef": 0, "eval_every": 0, "save_every": 0,
            "seed": 0, "lora_rank": 1, "max_new_tokens": 1, "critic_max_tokens": 1, "eval_problems": 1, "eval_k": 1,
        }  # fmt: skip
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.seed >= 2**32:
            raise ValueError(f"seed must be < 2**32, got {self.seed}")

    def _check_env(self) -> None:
        """A registered env id whose constructor takes every key of env_kwargs and eval_env_kwargs."""
        import srpo_envs

        try:
            spec = srpo_envs.registry[self.env_id]
        except KeyError:
            raise ValueError(
                f"unknown env id {self.env_id!r}; registered ids: {', '.join(sorted(srpo_envs.registry))}"
            ) from None
        spec.check_kwargs({**self.env_kwargs, **self.eval_env_kwargs})

    def _check_staleness(self) -> None:
        """``max_staleness`` / ``staleness_correction``: what the asynchronous loop supports."""
        n = self.max_staleness
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"max_staleness must be an integer >= 0, got {n!r}")
        if self.staleness_correction not in STALENESS_CORRECTIONS:
            raise ValueError(
                f"staleness_correction must be one of {STALENESS_CORRECTIONS}, got {self.staleness_correction!r}"
            )
        if n and self.backend == "vllm":
            raise ValueError(
                "max_staleness >= 1 generates beside the update, on other hardware than the learner's: the "
                "in-process vLLM engine shares the learner's device (it sleeps while the learner updates); serve "
                "the model (`vllm serve`, learners.served) and train with backend=openai, or use backend=hf (a "
                "copy in this process, or Ray rollout workers)"
            )
        if n and self.staleness_correction == "decoupled" and self.tis == "off":
            raise ValueError(
                "staleness_correction=decoupled weights stale rows by min(pi_prox / pi_behaviour, tis_cap) at the "
                "--tis level; --tis off leaves no level: use --tis auto, or --staleness-correction none"
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


def run_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """What a finished run did to held-out accuracy: first and last evaluation, and a verdict (``better``,
    ``same``, ``worse``, or ``unevaluated`` without two evaluations), written to ``OUT/summary.json`` and
    said in the run's last line: a run that made its model worse says so even when it exits 0."""
    evals = [(int(h["iteration"]), float(h["eval_accuracy"])) for h in history if h.get("eval_accuracy") is not None]
    out: dict[str, Any] = {"iterations": int(history[-1]["iteration"]) if history else 0, "evaluations": len(evals)}
    if len(evals) < 2:
        return {**out, "verdict": "unevaluated", "line": "held-out accuracy: not evaluated at the start and the end"}
    (i0, a0), (i1, a1) = evals[0], evals[-1]
    verdict = "better" if a1 > a0 else "worse" if a1 < a0 else "same"
    line = f"held-out accuracy: {a0:.3f} (iteration {i0}) -> {a1:.3f} (iteration {i1})"
    if verdict == "worse":
        line += f": WORSE than the start by {100 * (a0 - a1):.1f} pt (the trained model in final/ is the worse one)"
    return {
        **out, "start_iteration": i0, "start_accuracy": a0, "final_iteration": i1, "final_accuracy": a1,
        "delta": a1 - a0, "verdict": verdict, "line": line,
    }  # fmt: skip


#: Float fields whose ``inf`` means something (a guard threshold's "off"); every other float must be finite.
INF_OK_FIELDS = ("guard_max_approx_kl", "guard_max_log_ratio", "guard_max_loss", "guard_max_grad_norm")

#: Values of the ``None``-means-algorithm-default fields when the algorithm sets none.
_FALLBACKS: dict[str, Any] = {"agg": "token-mean", "adv_scale": "std", "clip_eps": 0.2}


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available else ``cpu``; ``cuda[:i]`` must be available."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available (use --device cpu or auto)")
    return dev


class Trainer:
    """Runs :class:`TrainConfig`; see the module docstring for the loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        log: Callable[[str], None] | None = print,
        start_from: str | os.PathLike[str] | None = None,
    ) -> None:
        """Build the run of ``cfg``; ``start_from``: a run or checkpoint directory whose checkpoint this
        trainer continues (:meth:`resume_from`), else iteration 0 (see also :meth:`continue_from`)."""
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
        self.iteration = 0
        # The rooms, each with its own sections of the config (learners.config), never the whole of it:
        #: the training forwards and pi_old ([policy], [update], the rollouts' temperature)
        self.forward = PolicyForward(
            self.policies, self.scale, self.device, self.param_dtype,
            cfg.policy, cfg.update, cfg.rollout.temperature, ref_models=self.ref_models,
        )  # fmt: skip
        #: the update step ([update], [critic], [guard], the run's seed)
        self.updater = PolicyUpdate(
            self.forward, self.scale, self.policies, self.params, self.optimizer, self.scheduler,
            self.critic, self.critic_optimizer, update=cfg.update, critic_cfg=cfg.critic, guard=cfg.guard,
            seed=cfg.seed, norm_len=cfg.rollout.max_new_tokens, out_dir=str(self.out),
        )  # fmt: skip
        #: an iteration's rollouts incl. dynamic sampling ([rollout], the run's seed)
        self.rollout_phase = RolloutPhase(self.scale, self.collector, self.n_train_tasks, cfg.rollout, cfg.seed)
        #: metrics file, checkpoints and export of out_dir
        self.run_state = RunState(
            self.out, self.scale, self.policies, self.optimizer, self.scheduler,
            self.critic, self.critic_optimizer, log=self.log,
        )  # fmt: skip
        #: max_staleness >= 1: the generator thread while training, and the weight snapshots a resumed
        #: checkpoint carried for the batches that were in flight (learners.async_rollout)
        self._pipeline: RolloutPipeline | None = None
        self._carried_snapshots: dict[int, Any] = {}
        if start_from is not None:
            self.resume_from(start_from)

    def reconfigure(self, **changes: Any) -> None:
        """Change config fields of a built trainer (tests, experiments): the config is re-validated and
        every part gets its new sections. Only fields its parts read after construction take effect
        (batching, loss, forward and TIS settings); the model, sharing and optimizers stay as built."""
        self.cfg = replace(self.cfg, **changes)
        self._hand_out_sections()

    def _hand_out_sections(self) -> None:
        """Give every part its current sections (after :meth:`reconfigure`, or a field assigned on
        ``self.cfg``: its section views are then rebuilt, so a part holding an old one is found by identity)."""
        cfg = self.cfg
        self.scale.configure(cfg)
        self.forward.configure(cfg.policy, cfg.update, cfg.rollout.temperature)
        self.updater.configure(cfg.update, cfg.critic, cfg.guard, cfg.rollout.max_new_tokens)
        self.rollout_phase.rollout = cfg.rollout

    def distinct_models(self) -> list[HFPolicy]:
        """One policy per distinct model object (LoRA views of one base count once), in the order weight
        snapshots and Ray workers name them (``model<i>``: :func:`agents.ray_rollout.distinct_models`)."""
        from agents.ray_rollout import distinct_models

        return distinct_models(self.policies)

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

    def _model_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Weights of every distinct model (``model<i>`` in :meth:`distinct_models` order)."""
        return {
            f"model{i}": {k: v.detach().clone() for k, v in pol.model.state_dict().items()}
            for i, pol in enumerate(self.distinct_models())
        }

    # ------------------------------------------------------------------ forwards and the update
    def old_logprobs(self, rows: list[Any]) -> list[list[float]]:
        """``pi_old`` of ``rows`` in batch order by the training forward (:meth:`PolicyForward.old_logprobs`)."""
        return self.forward.old_logprobs(rows)

    def rollout(self, iteration: int | None = None) -> RolloutBatch:
        """One iteration's rollouts, as the training loop collects them: ``tasks_per_iter`` tasks x
        ``group_size`` episodes with the current weights, seeded by ``(seed, iteration)`` (default: the
        next iteration, ``self.iteration + 1``), dynamic sampling applied, events missing a member dropped.
        The batch holds one row per agent output (``batch.rows``) and the episodes' outcomes; pass it to
        :meth:`update`."""
        it = self.iteration + 1 if iteration is None else int(iteration)
        _, batch, _ = self.rollout_phase.run(it)
        return batch

    def update(self, batch: RolloutBatch, iteration: int | None = None) -> dict[str, Any]:
        """Train on ``batch`` as iteration ``iteration`` (default: the next, ``self.iteration + 1``):
        advantages once, then ``epochs`` x minibatches of (micro-batched) loss and one optimizer step each
        (:meth:`learners.update.PolicyUpdate.update`); returns the iteration's ``actor/...``,
        ``critic/...`` and ``rollout/...`` metrics. ``iteration`` seeds the minibatch shuffles (what the
        loop passes: the iteration being trained, from 1); after it the trainer is at ``iteration`` (a
        checkpoint saved then records it)."""
        iteration = self.iteration + 1 if iteration is None else int(iteration)
        if self.updater.section is not self.cfg.update:  # a field was assigned on self.cfg since the parts got theirs
            self._hand_out_sections()
        stats = self.updater.update(batch, iteration)
        self.iteration = iteration
        return stats

    @property
    def nonfinite_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient (whole run)."""
        return self.updater.nonfinite_steps

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, n: int | None = None, k: int | None = None, seed: int = 10_007) -> float:
        """Held-out team accuracy: ``n`` eval-split tasks x ``k`` samples, fixed sampling seeds."""
        with self.scale.generation_lock:  # async + Ray workers: not while the generator holds them
            self.scale.sync_weights()  # every rank: under FSDP2 gathering the weights is collective
            if not self.dist.is_main:  # rank 0 evaluates; every rank returns its number
                return broadcast_object(None, self.dist)
            n = min(n or self.cfg.eval_problems, self.n_eval_tasks)
            batch = self.eval_collector.collect(list(range(n)), group_size=k or self.cfg.eval_k, seed=seed)
            return broadcast_object(batch.accuracy, self.dist)

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        """Run :meth:`_train_loop` with the run's trackers open (closed however the loop ends)."""
        self.run_state.tracker = open_trackers(
            (*self.cfg.logger, *(("tensorboard",) if self.cfg.tensorboard else ())), self.out,
            resume=self.iteration > 0, echo=None if self._quiet else self.log, main=self.dist.is_main,
        )  # fmt: skip
        try:
            # `section.field` keys, the paths `--set` and experiment files use; a resumed run's backends skip it
            self.run_state.tracker.log_hparams(flatten_config(config_sections.flat_to_sections(asdict(self.cfg))))
            return self._train_loop()
        finally:
            self.run_state.tracker.close()
            self.run_state.tracker = None

    def _train_loop(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:  # the resolved config: `srpo train --config OUT/config.toml` reruns this run
            config_sections.write_run_config(cfg, self.out)
        history = self.run_state.start_metrics(self.iteration)
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
        pipeline = self._pipeline = self._start_pipeline() if cfg.max_staleness else None
        try:
            history = self._iterations(history, grading, bar, pipeline)
        finally:
            if pipeline is not None:
                pipeline.close()
                self._pipeline = None
                self.scale.pinned_weights = False
                torch.set_num_threads(self._learner_threads)
        if bar is not None:
            bar.close()
        if self.dist.is_main or self.scale.fsdp:  # FSDP2: every rank helps gather, rank 0 writes
            self.export(self.out / "final")
        if self.dist.is_main:
            summary = run_summary(history)
            atomic_write_json(self.out / "summary.json", summary)  # `srpo train` prints its line last
        self.scale.close()
        return history

    def _iterations(
        self, history: list[dict[str, Any]], grading: GradingMonitor, bar: Any, pipeline: RolloutPipeline | None
    ) -> list[dict[str, Any]]:
        """The loop's iterations: rollouts (here, or from the generator thread with ``max_staleness``),
        update, metrics, guard, checkpoint."""
        cfg = self.cfg
        while self.iteration < cfg.iterations:
            it = self.iteration + 1
            t0 = time.perf_counter()
            timing: dict[str, Any] = {}
            if pipeline is None:
                generated, batch, filtered = self.rollout_phase.run(it)
                t1 = time.perf_counter()
                rollout_s = t1 - t0
            else:  # generated beside the previous updates: rollout_s is the generator's time on it
                produced = pipeline.take(it)
                generated, batch, filtered = produced.result
                t1 = time.perf_counter()
                rollout_s = produced.gen_s
                timing = {"rollout_wait_s": round(produced.wait_s, 3), "rollout/weights_of": produced.weights_of}
            stats = self.update(batch, it) if batch.rows else {}
            if pipeline is not None:  # the weights the generator's next batches need (it may be waiting)
                pipeline.publish(it, self._snapshot())
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
                "rollout_s": round(rollout_s, 3),
                "update_s": round(t2 - t1, 3),
                **timing,
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
        return history

    # ------------------------------------------------------------------ asynchronous rollouts
    def _snapshot(self) -> tuple[list[int], dict[str, dict[str, torch.Tensor]]]:
        """The policies' versions and a clone of the weights now: what the generator loads."""
        return [int(p.policy_version) for p in self.policies.policies], self._model_states()

    def _start_pipeline(self) -> RolloutPipeline:
        """``max_staleness >= 1``: the generator thread (:mod:`learners.async_rollout`) with its own copy of
        the policies and its own rollout phase, started from the current weights and, on resume, from the
        older ones the checkpoint carried. The generator uses one torch thread, the learner the rest."""
        from agents.ray_rollout import load_model_states

        if self.dist.enabled:
            raise ValueError("max_staleness >= 1 runs in one process; under torchrun train with max_staleness 0")
        snapshots = {**self._carried_snapshots, self.iteration: self._snapshot()}
        self._carried_snapshots = {}
        self._learner_threads = torch.get_num_threads()
        if self.scale.pool is not None or self.cfg.backend == "openai":  # each batch's weights pushed there first
            if self.cfg.backend == "openai":  # the probe compares with the learner's current weights: before
                # the generator serves older ones (the task and seed of the synchronous loop's first probe)
                first = self.rollout_phase.first_collect(self.iteration + 1)
                with self.scale.generation_lock:
                    self.scale.probe_once(self.collector, *first)
            return self._engine_pipeline(snapshots)
        copy = self.scale.policy_copy()
        for pol in copy.policies:
            pol.autocast_dtype = generation_autocast(self.cfg.dtype, self.device)
        c = self.collector
        phase = RolloutPhase(
            self.scale, RolloutCollector(c.env_fn, copy, c.sampling, c.prompts), self.n_train_tasks,
            self.cfg.rollout, self.cfg.seed,
        )  # fmt: skip

        def load(done: int, snap: tuple[list[int], dict[str, dict[str, torch.Tensor]]]) -> None:
            load_model_states(copy, snap[1], snap[0])

        torch.set_num_threads(max(1, self._learner_threads - 1))
        return RolloutPipeline(
            phase.run, load, self.cfg.max_staleness, self.iteration + 1, self.cfg.iterations, snapshots, gen_threads=1
        )

    def _engine_pipeline(self, snapshots: dict[int, Any]) -> RolloutPipeline:
        """The generator thread driving the Ray rollout workers or the served model (:meth:`ScaleOut.collect`
        is the seam): it pushes the batch's snapshot to the engine (:meth:`ScaleOut.push_weights`: the
        workers' weights, or each role's adapter of that version on the server) and collects under
        ``scale.generation_lock`` (evaluation, which pushes the learner's current weights, takes it too), so
        every batch is generated with exactly its weights; a Ray worker lost mid-flight is restarted with
        them and its share re-run, as today."""
        held: dict[str, Any] = {}

        def load(done: int, snap: tuple[list[int], dict[str, dict[str, torch.Tensor]]]) -> None:
            held["snap"] = snap

        def generate(it: int) -> Any:
            versions, states = held["snap"]
            with self.scale.generation_lock:
                self.scale.push_weights(states, versions)
                return self.rollout_phase.run(it)

        self.scale.pinned_weights = True
        return RolloutPipeline(
            generate, load, self.cfg.max_staleness, self.iteration + 1, self.cfg.iterations, snapshots, gen_threads=1
        )

    def _async_state(self) -> dict[str, Any]:
        """max_staleness >= 1: the weight snapshots the in-flight batches are generated with, so that a
        resumed run regenerates exactly them (the batches themselves are discarded: learners.async_rollout)."""
        if self._pipeline is None:
            return {}
        snaps = self._pipeline.checkpoint_snapshots(self.iteration)
        return {"async_snapshots": {str(k): {"versions": v, "models": m} for k, (v, m) in snaps.items()}}

    # ------------------------------------------------------------------ run state
    # The metrics file, checkpoints and export live in learners.run_state (formats in learners.checkpoint).
    @property
    def metrics_path(self) -> Path:
        return self.run_state.metrics_path

    def _append_metrics(self, record: dict[str, Any]) -> None:
        """One row to metrics.jsonl and the other --logger backends (outside train(): metrics.jsonl)."""
        self.run_state.append_metrics(record)

    @property
    def checkpoint_path(self) -> Path:
        """The run's checkpoint directory (see :mod:`learners.checkpoint` for its files)."""
        return self.run_state.checkpoint_path

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: full weights, optimizer, scheduler, RNGs."""
        return {**self.run_state.state(self.iteration, asdict(self.cfg)), **self._async_state()}

    def save_checkpoint(self) -> Path | None:
        """Publish :meth:`checkpoint_state` atomically (rank 0 writes under torch.distributed); weights
        that are not finite are never written (:class:`~learners.checkpoint.NonFiniteError`)."""
        saved = self.run_state.save(self.checkpoint_state())
        if saved is not None:
            set_resume_point(
                f"the last checkpoint is {self.checkpoint_path} (iteration {self.iteration}); rerun the same "
                "command with --resume to continue from it"
            )
        return saved

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
        self.iteration = self.run_state.restore(state)  # weights, optimizers, RNGs; metrics cut to it
        self._carried_snapshots = {  # max_staleness >= 1: the in-flight batches' weights
            int(k): ([int(v) for v in snap["versions"]], snap["models"])
            for k, snap in state.get("async_snapshots", {}).items()
        }

    def export(self, out: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` of the trained policy (one folder per distinct model)."""
        return self.run_state.export(out)

    # ------------------------------------------------------------------ where a run starts
    def resume_from(self, path: str | os.PathLike[str] | None = None) -> None:
        """Continue a checkpointed run: :meth:`load_checkpoint` of ``path`` (a run or checkpoint
        directory; by default this run's ``out_dir``); :meth:`train` then goes on from its iteration."""
        self.load_checkpoint(path)

    def start_fresh(self) -> None:
        """A fresh run in ``out_dir``: a previous checkpoint and metrics file there are removed, so neither
        is resumed nor appended to later (what ``srpo train`` without ``--resume`` does)."""
        self.iteration = 0
        self.run_state.clear()

    def continue_from(self, run_dir: str | os.PathLike[str], iteration: int) -> None:
        """Go on from another run's exported weights as if this run had trained its first ``iteration``
        iterations: this trainer was built from them (``cfg.model`` = ``run_dir/final``), its curve starts
        with ``run_dir``'s metrics rows up to ``iteration`` and :meth:`train` trains iterations
        ``iteration + 1 .. cfg.iterations`` (their seeds are those of the uninterrupted run's; the optimizer
        starts afresh: an export holds no optimizer state). ``bench compare --continue-from`` uses it."""
        if not 0 <= int(iteration) <= self.cfg.iterations:
            raise ValueError(f"continue_from: iteration {iteration} outside 0..{self.cfg.iterations} (--iterations)")
        self.start_fresh()
        self.run_state.adopt_metrics(run_dir, int(iteration))
        self.iteration = int(iteration)


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
    trainer = Trainer(cfg, log=log, start_from=cfg.out_dir if resume else None)
    if resume:
        if log:
            log(f"resumed {cfg.algo} from iteration {trainer.iteration}")
    elif ckpt.remove_checkpoints(cfg.out_dir) and log:
        log(f"fresh start: removed the previous checkpoint in {cfg.out_dir}")
    return trainer.train()
