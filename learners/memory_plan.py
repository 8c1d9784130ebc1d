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
* activations of one micro-batch of ``T`` tokens (``max_tokens_per_microbatch``): per token and layer
  about ``32 H + 10 I`` bytes under bf16 autocast with a float32 residual stream (``48 H + 20 I`` in
  float32; ``H`` hidden size, ``I`` MLP width; the tensors a Llama/Qwen2 decoder layer saves for
  backward), or with gradient checkpointing each layer's float32 input ``4 H`` plus one layer
  recomputed; plus the logits of the micro-batch's response tokens (``response_share`` of ``T``)
  over the vocabulary ``V``: bf16 logits, their float32 log-softmax and its gradient, ``10 V``
  bytes per token;
* a fixed allowance for the CUDA context, kernels' workspaces and allocator fragmentation.

The activation coefficients are estimates of a decoder's saved tensors (within about 30% of measured
peaks on the model sizes this project runs, see ``benchmarks/perf/bench_memory.py``); everything
else is exact arithmetic. Pure functions: no torch, no model loading.
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
#: CUDA context, cuBLAS/attention workspaces and allocator fragmentation (a measured-order allowance)
RUNTIME_OVERHEAD = int(2.0 * GIB)
#: KV cache the vLLM engine needs at least beside its weights (a few thousand tokens of a 7B model)
MIN_KV_CACHE = int(1.0 * GIB)
#: the modules :func:`agents.hf.default_lora_config` adapts (attention and MLP projections)
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
    response_share: float = 0.5
    kl_reference: bool = False
    critic: bool = False

    @classmethod
    def from_train_config(cls, cfg: Any, roles: int, gpus: int = 1, critic: bool = False) -> PlanOptions:
        """From a :class:`learners.trainer.TrainConfig`; a micro-batch without a token budget is the
        whole minibatch, estimated as ``rows_per_batch`` rows of 512 prompt tokens plus
        ``max_new_tokens``."""
        tokens = cfg.max_tokens_per_microbatch or cfg.rows_per_batch * (512 + cfg.max_new_tokens)
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

    @property
    def learner_bytes(self) -> int:
        return sum(b for name, b in self.items if not name.startswith("vLLM"))

    @property
    def static_bytes(self) -> int:
        return sum(b for name, b in self.items if not name.startswith(("vLLM", "activations", "logits")))

    @property
    def fits(self) -> bool:
        return self.learner_bytes <= self.learner_budget and self.vllm_problem is None

    @property
    def max_microbatch_tokens(self) -> int:
        """The largest ``--max-tokens-per-microbatch`` whose activations fit beside the static part."""
        return max(0, (self.learner_budget - self.static_bytes) // max(self.per_token, 1))

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
        lines.append(f"  {'learner total':<58s}{gib(self.learner_bytes)}  of {gib(self.learner_budget).strip()}")
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
    per_token_logits = int(o.response_share * (act + 4 + 4) * shape.vocab)
    per_token = per_token_act + per_token_logits
    items.append(
        (f"activations: {o.microbatch_tokens} tokens/micro-batch{' (checkpointed)' if o.gradient_checkpointing else ''}",
         o.microbatch_tokens * per_token_act)
    )  # fmt: skip
    items.append((f"logits: {o.response_share:.0%} response tokens x V", o.microbatch_tokens * per_token_logits))
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
