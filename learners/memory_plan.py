"""GPU memory plan of a training run: what the learner and a colocated vLLM engine hold, and whether it fits.

Why a plan: a run that does not fit fails minutes in (after the model loaded and the engine started),
often in the first backward, with an out-of-memory error that says nothing about which option to
change. The static part of the learner's memory is arithmetic on the model's ``config.json`` and the
run's options, so it is computed here before anything is loaded (:func:`plan_memory`), printed before
the first rollout on GPU runs, and a plan that does not fit is refused with the numbers and the
changes that would fit (:attr:`MemoryPlan.suggestions`).

What is counted, per GPU (bytes; ``P`` parameters of one model, ``b`` bytes of the master dtype:
float32 = 4 for float32 and bfloat16 runs, whose autocast keeps float32 master weights, 8 for float64):

* weights: ``P b`` per distinct model (one for ``shared`` and ``lora``, one per role for ``per-role``);
  under FSDP2 divided by the number of GPUs, plus the two largest layers gathered at a time;
* LoRA adapters (``sharing=lora``): their parameters, and then gradients and AdamW moments of the
  adapters only (the base is frozen);
* gradients ``P b`` and AdamW moments ``2 P b`` of everything trained (moments follow the parameter
  dtype), sharded under FSDP2;
* a KL reference model (``kl_coef > 0``: a frozen full copy per model, taken before sharding), a
  critic (MAPPO: a full model with its gradients and moments), and the unsharded rollout copy FSDP2
  keeps for in-process HF generation;
* the vLLM engine (``backend=vllm``): ``gpu_memory_utilization`` of the card, which must hold its
  bf16 weights ``2 P`` and some KV cache;
* a fixed allowance for the CUDA context, kernels' workspaces and allocator fragmentation.

Transient parts, one *phase* at a time (the learner needs the largest phase on top of the above;
gradients stay allocated from the last backward until the next step's ``zero_grad``):

* train (a micro-batch's forward and backward): activations of one micro-batch of ``T`` tokens
  (``max_tokens_per_microbatch``): per token and layer about ``32 H + 10 I`` bytes under bf16 autocast
  with a float32 residual stream (``48 H + 20 I`` in float32; ``H`` hidden size, ``I`` MLP width; the
  tensors a Llama/Qwen2 decoder layer saves for backward), or with gradient checkpointing each layer's
  float32 input ``4 H`` plus one layer recomputed; the logits of the response tokens (``response_share``
  of ``T``: long math answers ~85%, :meth:`PlanOptions.from_train_config` estimates it from
  ``max_new_tokens``) over the vocabulary ``V``: the logits, their float32 upcast, logsumexp's
  exponentials, their gradient and the gather's, 16 bytes per ``V``; under bf16 autocast the bf16 copy
  of every matmul's weight (autocast casts each float32 weight and the copy is saved for backward: all
  of them, or with checkpointing one layer's and the head's);
* step: AdamW's temporaries: the foreach (multi-tensor) implementation, torch's default on GPU, takes
  ``sqrt(v)`` of every trained tensor at once (``P b``: 11.5 GiB for a 3B full fine-tuning); the
  per-tensor loop (CPU's default) two temporaries of the largest tensor;
* generate (``backend=hf``): the KV cache of the rows generated at once, ``2 L kv_heads head_dim``
  values per token in the master dtype.

Checked against measurement (``python -m benchmarks.perf.bench_memory_plan``: a 45M-parameter Qwen2
on CPU, full and LoRA, checkpointing on and off, two micro-batch budgets, peaks counted from the
allocator by ``torch.profiler``): weights, gradients, moments and the step's temporaries exactly, the
train phase within 15%. GPU-only estimates, not checked on CPU: the CUDA context / fragmentation
allowance, the vLLM share, FSDP2's gathered layers and sharded autocast copies, the foreach step on
GPU (the same arithmetic is measured on CPU with ``--foreach``), the KV cache's allocator rounding,
and attention kernels' workspaces (SDPA/flash on GPU save less than CPU's attention). Pure functions:
no torch, no model loading.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "GIB",
    "MemoryPlan",
    "MemoryPlanError",
    "check_memory",
    "ModelShape",
    "PlanOptions",
    "lora_parameters",
    "load_model_shape",
    "plan_memory",
]

GIB = 1024**3
#: prompt tokens of a typical task (a math question with its chat template) where the plan must guess
PROMPT_TOKENS = 192
#: item-name prefixes of the transient phases: at most one of them is alive at a time (see the docstring)
TRAIN_PHASE = ("activations", "logits", "autocast")
STEP_PHASE = ("AdamW step",)
GENERATE_PHASE = ("KV cache",)
#: GPU-only items: not on a CPU run (``MemoryPlan.phase_peaks(cpu=True)``)
GPU_ONLY = ("CUDA context", "vLLM")
#: CUDA context, cuBLAS/attention workspaces and allocator fragmentation (a measured-order allowance)
RUNTIME_OVERHEAD = int(2.0 * GIB)
#: KV cache the vLLM engine needs at least beside its weights (a few thousand tokens of a 7B model)
MIN_KV_CACHE = int(1.0 * GIB)
#: the modules :func:`agents.lora.default_lora_config` adapts (attention and MLP projections)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class MemoryPlanError(ValueError):
    """The run does not fit its GPU(s); the message holds the plan and what would fit."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder-only model's ``config.json`` (Llama/Qwen2/Mistral keys)."""

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    tied_embeddings: bool
    attention_bias: bool = False
    name: str = ""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], name: str = "") -> ModelShape:
        """From a ``config.json`` dict; a missing size is an error naming the key."""
        try:
            hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
            vocab, heads = int(cfg["vocab_size"]), int(cfg["num_attention_heads"])
        except KeyError as exc:
            raise ValueError(f"config of {name or 'the model'} has no {exc.args[0]!r}: not a decoder LM config") from None
        return cls(
            hidden=hidden,
            layers=layers,
            vocab=vocab,
            intermediate=int(cfg.get("intermediate_size") or 4 * hidden),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 has q/k/v biases without saying so in its config
            attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            name=name,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q/k/v/o projections (biases if any), the gated MLP and two norms."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.attention_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def layer_linear_parameters(self) -> int:
        """The weights of one layer's matmuls (q/k/v/o and the gated MLP; no biases or norms)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kv + 3 * h * self.intermediate

    @property
    def parameters(self) -> int:
        embed = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return embed + head + self.layers * self.layer_parameters + self.hidden


def lora_parameters(shape: ModelShape, rank: int, targets: Sequence[str] = LORA_TARGETS) -> int:
    """Parameters of one LoRA adapter of ``rank`` on ``targets`` (``r (d_in + d_out)`` per module)."""
    h, kv, i = shape.hidden, shape.kv_heads * shape.head_dim, shape.intermediate
    dims = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    return shape.layers * sum(rank * sum(dims[t]) for t in targets if t in dims)


def load_model_shape(model: str | Path) -> ModelShape:
    """The shape of ``model``: a directory with ``config.json``, a ``config.json`` path, or a hub id
    whose config is in the local hub cache (``AutoConfig`` with ``local_files_only``: a plan never
    downloads). Not found: a ValueError that says so."""
    path = Path(model)
    if path.is_file():
        return ModelShape.from_config(json.loads(path.read_text()), name=str(model))
    if (path / "config.json").is_file():
        return ModelShape.from_config(json.loads((path / "config.json").read_text()), name=str(model))
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(model), local_files_only=True)
    except Exception as exc:  # OSError / ValueError from the hub cache lookup
        raise ValueError(
            f"no config.json for {model!r} (not a directory, a config file, or a cached hub id): "
            f"fetch it first (huggingface-cli download {model} config.json) ({type(exc).__name__})"
        ) from None
    text = getattr(cfg, "text_config", None) or cfg  # multimodal configs nest the LM's
    return ModelShape.from_config(text.to_dict(), name=str(model))


@dataclass(frozen=True)
class PlanOptions:
    """The run options the plan depends on (:meth:`from_train_config` reads them off a TrainConfig)."""

    sharing: str = "shared"
    roles: int = 1
    lora_rank: int = 8
    dtype: str = "float32"
    gpus: int = 1
    fsdp: bool = False
    backend: str = "hf"
    vllm_gpu_memory_utilization: float = 0.3
    gradient_checkpointing: bool = False
    microbatch_tokens: int = 4096
    #: response tokens / all tokens of a micro-batch (only response tokens get logits): long math answers
    #: are ~85% (:meth:`from_train_config` estimates it from ``max_new_tokens``)
    response_share: float = 0.85
    kl_reference: bool = False
    critic: bool = False
    #: AdamW's multi-tensor (foreach) step, torch's default on GPU: temporaries of every trained parameter
    #: at once; False: the per-tensor loop (CPU's default), one parameter's temporaries at a time
    foreach: bool = True
    #: backend=hf: rows the learner's model generates at once (``HFPolicy.max_batch_size``) and tokens each
    #: holds in its KV cache (prompt + ``max_new_tokens``); 0 tokens: no generation term
    generation_rows: int = 64
    generation_tokens: int = 0

    @classmethod
    def from_train_config(
        cls, cfg: Any, roles: int, gpus: int = 1, critic: bool = False, response_share: float | None = None
    ) -> PlanOptions:
        """From a :class:`learners.config.TrainConfig`; a micro-batch without a token budget is the
        whole minibatch, estimated as ``rows_per_batch`` rows of 512 prompt tokens plus
        ``max_new_tokens``; ``response_share`` None: ``max_new_tokens / (PROMPT_TOKENS + max_new_tokens)``
        (1024 new tokens: 0.84)."""
        tokens = cfg.max_tokens_per_microbatch or cfg.rows_per_batch * (512 + cfg.max_new_tokens)
        if response_share is None:  # a math prompt with its chat template: ~PROMPT_TOKENS tokens
            response_share = cfg.max_new_tokens / (PROMPT_TOKENS + cfg.max_new_tokens)
        return cls(
            sharing=cfg.sharing,
            roles=roles,
            lora_rank=cfg.lora_rank,
            dtype=cfg.dtype,
            gpus=gpus,
            fsdp=cfg.dp_engine == "fsdp2" and gpus > 1,
            backend=cfg.backend,
            vllm_gpu_memory_utilization=getattr(cfg, "vllm_gpu_memory_utilization", 0.3),
            gradient_checkpointing=cfg.gradient_checkpointing,
            microbatch_tokens=int(tokens),
            kl_reference=cfg.kl_coef > 0,
            critic=critic,
            response_share=min(1.0, max(response_share, 1e-3)),
            generation_tokens=PROMPT_TOKENS + cfg.max_new_tokens if cfg.backend == "hf" else 0,
        )


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU of every part (``items``), the card's size, and the verdict."""

    shape: ModelShape
    options: PlanOptions
    gpu_bytes: int
    items: tuple[tuple[str, int], ...]
    #: the learner's share of the card (all of it without vLLM)
    learner_budget: int
    #: bytes one more micro-batch token costs (activations + its share of the logits)
    per_token: int
    vllm_problem: str | None = None
    suggestions: tuple[str, ...] = field(default=())

    def _phase(self, prefixes: tuple[str, ...]) -> int:
        return sum(b for name, b in self.items if name.startswith(prefixes))

    @property
    def static_bytes(self) -> int:
        """What the learner holds throughout: weights, adapters, gradients, moments, copies, overhead."""
        transient = (*TRAIN_PHASE, *STEP_PHASE, *GENERATE_PHASE, "vLLM")
        return sum(b for name, b in self.items if not name.startswith(transient))

    def phase_peaks(self, cpu: bool = False) -> dict[str, int]:
        """The learner's bytes in each phase: ``train`` (a micro-batch's forward and backward), ``step``
        (the optimizer step) and ``generate`` (HF rollouts); ``cpu``: without the GPU-only items."""
        base = self.static_bytes - (self._phase(("CUDA context",)) if cpu else 0)
        return {
            "train": base + self._phase(TRAIN_PHASE),
            "step": base + self._phase(STEP_PHASE),
            "generate": base + self._phase(GENERATE_PHASE),
        }

    @property
    def learner_bytes(self) -> int:
        """The largest phase: gradients stay allocated from one backward to the next step's zero_grad,
        activations are gone at the step, and AdamW's temporaries at the next rollout."""
        return max(self.phase_peaks().values())

    @property
    def fits(self) -> bool:
        return self.learner_bytes <= self.learner_budget and self.vllm_problem is None

    @property
    def max_microbatch_tokens(self) -> int:
        """The largest ``--max-tokens-per-microbatch`` whose activations fit beside the static part."""
        fixed = self.static_bytes + self._phase(("autocast",))
        return max(0, (self.learner_budget - fixed) // max(self.per_token, 1))

    def table(self) -> str:
        """The plan as text: one line per part, the total against the budget, the verdict."""
        o, s = self.options, self.shape
        gib = lambda b: f"{b / GIB:8.1f} GiB"  # noqa: E731
        head = (
            f"memory plan per GPU: {s.name or 'model'} ({s.parameters / 1e9:.2f} B parameters, H={s.hidden}, "
            f"L={s.layers}, V={s.vocab}), sharing={o.sharing}, dtype={o.dtype}, {o.gpus} GPU(s)"
            f"{' FSDP2' if o.fsdp else ''}, backend={o.backend}, card {self.gpu_bytes / GIB:.1f} GiB"
        )
        lines = [head] + [f"  {name:<58s}{gib(b)}" for name, b in self.items]
        peaks = self.phase_peaks()
        lines.append(
            f"  {'learner total (largest phase)':<58s}{gib(self.learner_bytes)}  of {gib(self.learner_budget).strip()}"
            f"  (train {peaks['train'] / GIB:.1f}, step {peaks['step'] / GIB:.1f}"
            + (f", generate {peaks['generate'] / GIB:.1f}" if self._phase(GENERATE_PHASE) else "")
            + " GiB)"
        )
        lines.append(
            f"  largest micro-batch that fits: {self.max_microbatch_tokens} tokens "
            f"({self.per_token / 2**20:.2f} MiB per token)"
        )
        if self.vllm_problem:
            lines.append(f"  vLLM: {self.vllm_problem}")
        lines.append("  fits" if self.fits else "  DOES NOT FIT")
        lines += [f"  would fit: {tip}" for tip in self.suggestions]
        return "\n".join(lines)


def _parts(shape: ModelShape, o: PlanOptions, gpu_bytes: int) -> tuple[list[tuple[str, int]], int, int, str | None]:
    """The plan's items, the learner's budget, the per-token bytes and a vLLM problem (or None)."""
    if o.sharing not in ("shared", "per-role", "lora"):
        raise ValueError(f"sharing must be shared, per-role or lora, got {o.sharing!r}")
    if o.gpus < 1 or o.microbatch_tokens < 1 or not 0 < o.response_share <= 1:
        raise ValueError("gpus and microbatch_tokens must be >= 1, response_share in (0, 1]")
    b = 8 if o.dtype == "float64" else 4
    p = shape.parameters
    models = o.roles if o.sharing == "per-role" else 1
    shard = o.gpus if o.fsdp else 1
    items: list[tuple[str, int]] = []
    what = f"{models} model(s)" if models > 1 else "model"
    items.append((f"weights ({what}, {'float64' if b == 8 else 'float32'} master{', FSDP2 shard' if o.fsdp else ''})",
                  models * p * b // shard))  # fmt: skip
    if o.fsdp:
        items.append(("FSDP2: two layers gathered at a time", 2 * shape.layer_parameters * b))
    if o.sharing == "lora":
        trained = o.roles * lora_parameters(shape, o.lora_rank)
        items.append((f"LoRA adapters ({o.roles} x rank {o.lora_rank})", trained * b))
    else:
        trained = models * p
    items.append(("gradients", trained * b // shard))
    items.append(("AdamW moments (2 per trained parameter)", 2 * trained * b // shard))
    if o.kl_reference:
        items.append(("KL reference (frozen full copy)", models * p * b))
    if o.critic:
        items.append(("critic (weights, gradients, moments)", 4 * p * b))
    if o.fsdp and o.backend == "hf":
        items.append(("rollout copy (FSDP2 + HF generation: unsharded)", models * p * b))
    act = 2 if o.dtype == "bfloat16" else b
    residual = b  # the residual stream stays in the master dtype under autocast
    h, i, layers = shape.hidden, shape.intermediate, shape.layers
    per_layer = (32 * h + 10 * i) if act == 2 else (12 * h * act + 5 * i * act)
    per_token_act = layers * residual * h + per_layer if o.gradient_checkpointing else layers * per_layer
    # logits, their float32 upcast, logsumexp's exp, its gradient and the gather's: 16 bytes per V (measured,
    # bf16 and float32 alike; float64: 32)
    per_token_logits = int(o.response_share * (32 if b == 8 else 16) * shape.vocab)
    per_token = per_token_act + per_token_logits
    items.append(
        (f"activations: {o.microbatch_tokens} tokens/micro-batch{' (checkpointed)' if o.gradient_checkpointing else ''}",
         o.microbatch_tokens * per_token_act)
    )  # fmt: skip
    items.append((f"logits: {o.response_share:.0%} response tokens x V", o.microbatch_tokens * per_token_logits))
    if o.dtype == "bfloat16":  # each matmul's bf16 cast of its float32 weight, held until backward
        layer_lin, head = shape.layer_linear_parameters, shape.vocab * h
        held = layers * layer_lin + head
        if o.gradient_checkpointing:  # the layers' copies go with the forward; the head's stays for backward
            held = layer_lin + head
        label = "one layer + head" if o.gradient_checkpointing else "all matmuls"
        if o.fsdp:  # casts of gathered layers: this rank's shard of them, plus the two layers gathered
            held, label = held // shard + 2 * layer_lin, label + ", FSDP2 shard"
        items.append((f"autocast: bf16 weight copies ({label})", 2 * models * held))
    largest = max(shape.vocab * h, i * h) if o.sharing != "lora" else max(i, h) * o.lora_rank
    # foreach: sqrt(v) of every trained tensor at once; per-tensor: sqrt(v) and its quotient of the largest
    step_tmp = trained * b // shard if o.foreach else 2 * largest * b
    items.append((f"AdamW step: {'foreach' if o.foreach else 'per-tensor'} temporaries", step_tmp))
    if o.backend == "hf" and o.generation_tokens > 0:
        kv = o.generation_rows * o.generation_tokens * layers * 2 * shape.kv_heads * shape.head_dim * b
        items.append((f"KV cache: HF generation, {o.generation_rows} rows x {o.generation_tokens} tokens", models * kv))
    items.append(("CUDA context, workspaces, fragmentation", RUNTIME_OVERHEAD))
    budget, problem = gpu_bytes, None
    if o.backend == "vllm":
        share = int(o.vllm_gpu_memory_utilization * gpu_bytes)
        items.append((f"vLLM engine (gpu_memory_utilization {o.vllm_gpu_memory_utilization:g})", share))
        budget = gpu_bytes - share
        need = 2 * models * p + MIN_KV_CACHE
        if share < need:
            problem = (
                f"its share {share / GIB:.1f} GiB is below its bf16 weights + 1 GiB of KV cache "
                f"({need / GIB:.1f} GiB): --vllm-gpu-memory-utilization {math.ceil(100 * need / gpu_bytes) / 100:.2f} at least"
            )
    return items, budget, per_token, problem


def check_memory(plan: MemoryPlan, refuse: bool = True) -> str:
    """The plan's table; a plan that does not fit raises :class:`MemoryPlanError` with it when ``refuse``."""
    text = plan.table()
    if refuse and not plan.fits:
        raise MemoryPlanError(f"this run does not fit its GPU (--no-memory-check runs it anyway):\n{text}")
    return text


def plan_memory(shape: ModelShape, options: PlanOptions, gpu_bytes: int, suggest: bool = True) -> MemoryPlan:
    """The memory plan of ``options`` on GPUs of ``gpu_bytes`` each, with what would fit when it does not.

    Suggestions, each checked by planning it (in this order, every one that fits is listed): a smaller
    ``--max-tokens-per-microbatch`` (when the static part fits), ``--gradient-checkpointing``,
    ``--sharing lora``, FSDP2 over 2, 4 or 8 GPUs (the fewest that fits), a smaller vLLM share.
    """
    items, budget, per_token, problem = _parts(shape, options, gpu_bytes)
    plan = MemoryPlan(shape, options, gpu_bytes, tuple(items), budget, per_token, problem)
    if plan.fits or not suggest:
        return plan
    tips: list[str] = []

    def fits(**changes: Any) -> MemoryPlan | None:
        alt = plan_memory(shape, replace(options, **changes), gpu_bytes, suggest=False)
        return alt if alt.fits else None

    if plan.max_microbatch_tokens >= 256 and problem is None:
        tokens = 1 << int(math.log2(plan.max_microbatch_tokens))  # a round budget under the limit
        tips.append(f"--max-tokens-per-microbatch {tokens}")
    if not options.gradient_checkpointing and (alt := fits(gradient_checkpointing=True)):
        tips.append("--gradient-checkpointing")
    for tokens in (options.microbatch_tokens, 8192, 4096, 2048):
        if options.sharing != "lora" and tokens <= options.microbatch_tokens:
            alt = fits(sharing="lora", gradient_checkpointing=True, microbatch_tokens=tokens)
            if alt:
                tips.append(
                    f"--sharing lora --gradient-checkpointing --max-tokens-per-microbatch {tokens} "
                    f"(learner {alt.learner_bytes / GIB:.1f} GiB)"
                )
                break
    if options.sharing != "lora":  # FSDP2 (not LoRA): on these GPUs, else on the fewest that fit
        for n in sorted({options.gpus, 2, 4, 8}):
            if n < 2 or n < options.gpus or (n == options.gpus and options.fsdp):
                continue
            if alt := fits(gpus=n, fsdp=True, gradient_checkpointing=True):
                tips.append(
                    f"FSDP2 over {n} GPUs: torchrun --nproc_per_node {n} --no-python srpo train ... "
                    f"--dp-engine fsdp2 --gradient-checkpointing (learner {alt.learner_bytes / GIB:.1f} GiB per GPU)"
                )
                break
    if options.backend == "vllm":  # a smaller engine share that still holds its weights and 4 GiB of KV cache
        models = options.roles if options.sharing == "per-role" else 1
        floor = (2 * models * shape.parameters + 4 * GIB) / gpu_bytes
        util = math.ceil(100 * floor * 1.1) / 100
        if util < options.vllm_gpu_memory_utilization and (alt := fits(vllm_gpu_memory_utilization=util)):
            tips.append(f"--vllm-gpu-memory-utilization {util:.2f}")
    return replace(plan, suggestions=tuple(tips))
