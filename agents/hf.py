"""Transformers backend for the policy interface: batched sampling with exact behaviour log-probs.

Why a hand-written decoding loop instead of ``model.generate``: rollouts need (a) the log-prob of every
sampled token under the convention in :mod:`agents.policy` (``log_softmax(logits / T)``, top-p not
applied), (b) a seed per request that reproduces that request whatever else shares its batch, (c) a
temperature, top-p, ``max_new_tokens`` and stop strings per request inside one batch, and (d) the exact
sampled ids (no re-tokenisation). ``generate(output_scores=True)`` returns *processed* scores (after
top-p masking, so a learner's recompute would not match them); ``output_logits=True`` returns raw logits
but keeps a ``(batch, vocab)`` tensor per step (gigabytes for a 150k vocabulary); and ``generate`` has
one RNG stream and one set of sampling settings per call. The loop here is the computation
``generate`` does -- a left-padded prefill that computes only the last position's logits, then one
token per step against a ``DynamicCache`` -- plus one thing ``generate`` does not do: rows that finished
are dropped from the batch and the cache once a quarter of the batch is done (rollouts have very
uneven lengths). ``benchmarks/perf/bench_generate.py`` measures it against ``model.generate``.

Sampling is inverse-CDF with uniforms drawn up front per request (``torch.Generator(seed)`` when the
request has a seed, the global torch RNG otherwise), so the draw for request *i* at step *t* does not
depend on the other rows. Rows with ``top_p < 1`` sample from the renormalised nucleus in descending
probability order; rows with ``top_p == 1`` sample in vocabulary order.

:func:`response_logprobs` is the matching recompute for learners (with gradients when enabled):
prompts are left-padded and responses right-padded, which is the layout of the generation batch, and
only the response positions go through the LM head.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agents.kv_cache import (
    GROWING_LAYER,
    cache_kwarg,
    forward_params,
    generation_cache,
    is_peft,
    new_cache,
    transformers_model,
)
from agents.layout import pad_prompt_response
from agents.policy import ChatMessages, Generation, GenerationRequest, SamplingParams

#: ``adapter_name`` that runs a ``PeftModel`` with all adapters disabled (the base weights).
BASE_ADAPTER = "__base__"

#: Drop finished rows from the batch (and the KV cache) once at least this fraction of it is done.
PRUNE_FRACTION = 0.25


#: A prefill forward's fixed cost in prompt tokens (one token of one row = 1): what splitting a batch
#: by prompt length must save in padding to pay for another forward (:func:`length_buckets`).
PREFILL_FORWARD_COST = 64

# ------------------------------------------------------------------------------------------- helpers


def length_buckets(lengths: Sequence[int], forward_cost: float) -> list[list[int]]:
    """Split rows sorted by descending length into consecutive buckets, each padded to its longest
    row, at the least total cost ``sum(forward_cost + rows x width)`` (an exact dynamic programme)."""
    n = len(lengths)
    if any(lengths[i] < lengths[i + 1] for i in range(n - 1)):
        raise ValueError("lengths must be sorted longest first")
    best = [0.0] + [float("inf")] * n  # best[j]: cost of rows [0, j)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            c = best[i] + forward_cost + (j - i) * lengths[i]
            if c < best[j]:
                best[j], cut[j] = c, i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(list(range(cut[j], j)))
        j = cut[j]
    return out[::-1]


def _resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """``None``/"auto" -> float32 on CPU (exact log-probs), bfloat16 on accelerators."""
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        return resolved
    return dtype


def dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """``from_pretrained``/``from_config`` keyword for a dtype: ``dtype`` in transformers 5, ``torch_dtype``
    before (4.x silently ignores an unknown ``dtype`` and loads float32)."""
    import transformers

    major = int(transformers.__version__.split(".", 1)[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


def load_causal_lm(
    path: str | os.PathLike[str], dtype: torch.dtype | str | None, device: torch.device | str
) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` on ``device`` (dtype rule: :func:`_resolve_dtype`)."""
    from transformers import AutoModelForCausalLM

    dev = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), **dtype_kwarg(_resolve_dtype(dtype, dev)))
    return model.to(dev)


def eos_token_ids(tokenizer: Any, model: Any | None = None) -> list[int]:
    """Every id that ends a sequence: the tokenizer's EOS plus the model's ``generation_config`` ones."""
    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen_cfg = getattr(transformers_model(model), "generation_config", None) if model is not None else None
    extra = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(extra, int):
        extra = [extra]
    for i in extra or []:
        if int(i) not in ids:
            ids.append(int(i))
    return ids


def pad_token_id(tokenizer: Any) -> int:
    """A valid id to pad with (never attended to, but it must index the embedding)."""
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return 0


def render_chat(tokenizer: Any, messages: ChatMessages) -> str:
    """Chat messages -> prompt text: the tokenizer's chat template, else a plain role transcript."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def encode_request(tokenizer: Any, request: GenerationRequest) -> list[int]:
    """The prompt ids of a request: its ``prompt_ids`` when given, else the tokenised prompt.

    Raw text gets the tokenizer's usual special tokens (e.g. a BOS); a chat template already writes
    its own, so templated text is tokenised without adding any.
    """
    if request.prompt_ids is not None:
        ids = list(request.prompt_ids)
    elif isinstance(request.prompt, str):
        ids = tokenizer(request.prompt, add_special_tokens=True)["input_ids"]
    else:
        templated = bool(getattr(tokenizer, "chat_template", None))
        ids = tokenizer(render_chat(tokenizer, request.prompt), add_special_tokens=not templated)["input_ids"]
    if not ids:
        raise ValueError(f"empty prompt for agent {request.agent!r}")
    return [int(i) for i in ids]


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for the duration (no dropout, incl. LoRA dropout), restoring train mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


@contextlib.contextmanager
def adapter_scope(model: Any, adapter_name: str | None) -> Iterator[None]:
    """Make one LoRA adapter of a ``PeftModel`` the active one for the duration; change nothing else.

    ``PeftModel.set_adapter`` also flips ``requires_grad`` (active adapter on, the others off). A
    learner that runs each role's forward in this scope and calls ``backward`` after leaving it would
    then lose the gradients of every adapter whose flag was switched back off (autograd skips leaves
    that no longer require grad). So the ``requires_grad`` flags are put back right after each switch:
    which parameters train is the learner's decision (:func:`lora_policy_map` makes every role's
    adapter trainable; an inactive adapter gets no gradient because it is not in the forward).
    ``BASE_ADAPTER`` disables all adapters. A plain model or ``adapter_name=None`` is a no-op.
    """
    if adapter_name is None or not is_peft(model):
        yield
        return
    if adapter_name == BASE_ADAPTER:
        with model.disable_adapter():
            yield
        return
    previous = model.active_adapter
    if adapter_name == previous:
        yield
        return
    params = list(model.named_parameters())
    flags = [p.requires_grad for _, p in params]

    def switch(name: str) -> None:
        model.set_adapter(name)
        for (_, p), flag in zip(params, flags, strict=True):
            if p.requires_grad != flag:
                p.requires_grad_(flag)

    switch(adapter_name)
    try:
        yield
    finally:
        switch(previous)


def enable_gradient_checkpointing(model: Any) -> None:
    """Non-reentrant gradient checkpointing of ``model``'s decoder layers whose recompute, during
    ``backward``, runs under the LoRA adapter that was active when the layer ran forward.

    Why: a learner with one adapter per role forwards each role inside :func:`adapter_scope` and calls
    ``backward`` once after leaving every scope (SRPO's event loss couples members of different roles,
    so the backward cannot be split per role). Checkpointing recomputes each layer during that backward
    with whatever adapter is active *then*, so every role but the active one got gradients of the wrong
    adapter's activations (silently: the shapes match; huggingface/peft#2832). The fix is at the
    checkpoint itself: torch's non-reentrant checkpoint calls ``context_fn`` when the layer runs forward
    and enters the second context it returns around the recompute; ours captures the active adapter
    there and re-enters it (through :func:`adapter_scope`, which also keeps the learner's
    ``requires_grad`` flags, so the recompute builds the graph of the same trainable parameters).
    Chosen over a backward per role (impossible for a coupled loss) and over peft's per-sample
    ``adapter_names`` (documented by peft for mixed-batch inference; it would change how every chunk is
    forwarded, not only the recompute). The recompute's switch costs a
    ``set_adapter`` per recomputed layer of a non-active role, small beside the layer's recompute.
    A plain model gets plain non-reentrant checkpointing.
    """
    import functools

    kwargs: dict[str, Any] = {"use_reentrant": False}
    if is_peft(model):
        kwargs["context_fn"] = functools.partial(_adapter_recompute_contexts, model)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5 (gradient_checkpointing_enable is its deprecated alias)
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # pragma: no cover - older transformers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _adapter_recompute_contexts(model: Any) -> tuple[Any, Any]:
    """``context_fn`` of :func:`enable_gradient_checkpointing`: nothing around the forward, the
    forward's active adapter around the recompute."""
    return contextlib.nullcontext(), adapter_scope(model, model.active_adapter)


def response_logprobs(
    model: Any,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits / T)`` of every response token, from one forward pass.

    Layout ``[left-padded prompt | right-padded response]`` with position ids counted over real tokens,
    the same layout the sampler uses, so the result matches ``Generation.logprobs``. Returns float32
    ``(B, R)`` log-probs and a ``(B, R)`` bool mask of real response tokens (padding entries are 0).
    Gradients flow when the caller has them enabled; ``temperature <= 0`` means ``T = 1``.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError("prompt_ids_list and response_ids_list differ in length")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    b = len(prompt_ids_list)
    r_len = max((len(r) for r in response_ids_list), default=0)
    mask = torch.zeros(b, r_len, dtype=torch.bool, device=device)
    if b == 0 or r_len == 0:
        return torch.zeros(b, r_len, device=device), mask
    ids, attn, pos, p_len = pad_prompt_response(prompt_ids_list, response_ids_list, pad_id)
    for i, r in enumerate(response_ids_list):
        mask[i, : len(r)] = True
    ids, attn, pos = ids.to(device), attn.to(device), pos.to(device)
    kwargs: dict[str, Any] = {"use_cache": False}
    if "logits_to_keep" in forward_params(model):
        kwargs["logits_to_keep"] = r_len + 1
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, **kwargs).logits
    logits = logits[:, -(r_len + 1) : -1].float()  # position P-1+t predicts response token t
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    target = ids[:, p_len:].unsqueeze(-1)
    out = logp.gather(-1, target).squeeze(-1)
    return out.masked_fill(~mask, 0.0), mask


def _sample(
    logits: torch.Tensor, temp: torch.Tensor, top_p: torch.Tensor, greedy: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it and its behaviour log-prob (see :mod:`agents.policy`).

    ``u`` holds one uniform in [0, 1) per row: inverse-CDF sampling makes a row's draw a function of
    its own uniform and distribution only.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    scaled = logits / temp.unsqueeze(-1)
    logz = torch.logsumexp(scaled, dim=-1, keepdim=True)
    probs = torch.exp(scaled - logz)
    cdf = probs.cumsum(-1)
    tok = (
        torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1).clamp_(max=vocab - 1)
    )
    nucleus = (top_p < 1.0) & ~greedy
    if bool(nucleus.any()):
        rows = nucleus.nonzero().squeeze(-1)
        sp, si = probs[rows].sort(dim=-1, descending=True)
        drop = (sp.cumsum(-1) - sp) >= top_p[rows].unsqueeze(-1)  # the first token is always kept
        sp = sp.masked_fill(drop, 0.0)
        c2 = sp.cumsum(-1)
        k = torch.searchsorted(c2, (u[rows] * c2[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
        k = torch.minimum(k, (~drop).sum(-1) - 1)
        tok[rows] = si.gather(-1, k.unsqueeze(-1)).squeeze(-1)
    if bool(greedy.any()):
        tok = torch.where(greedy, logits.argmax(-1), tok)
    logprob = (scaled.gather(-1, tok.unsqueeze(-1)) - logz).squeeze(-1)
    return tok, logprob


# ------------------------------------------------------------------------------------------- policy


class HFPolicy:
    """A :class:`agents.policy.Policy` on a transformers causal LM (optionally a LoRA ``PeftModel``).

    ``model_or_path``: a local directory or hub id (``AutoModelForCausalLM.from_pretrained``), a
    ``PreTrainedModel`` or a ``PeftModel``. ``tokenizer``: a tokenizer or a path/id; by default the one
    beside the model. ``device``: ``None`` keeps a given model where it is and puts a loaded one on CPU.
    ``dtype``: ``None`` loads float32 on CPU (the exact-log-prob setting) and bfloat16 on accelerators,
    and leaves a given model's dtype alone. ``adapter_name``: the LoRA adapter this policy activates on a
    ``PeftModel`` (``BASE_ADAPTER`` for the bare base). ``max_batch_size``: rows per forward batch.

    The learner updates the weights in place (same module object) and bumps ``policy_version``.
    """

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        adapter_name: str | None = None,
        *,
        max_batch_size: int = 64,
        policy_version: int = 0,
    ) -> None:
        from transformers import AutoTokenizer

        if isinstance(model_or_path, (str, os.PathLike)):
            model = load_causal_lm(model_or_path, dtype, device or "cpu")
            if tokenizer is None:
                tokenizer = str(model_or_path)
        else:
            model = model_or_path
            if device is not None:
                model.to(torch.device(device))
            if dtype is not None:
                model.to(_resolve_dtype(dtype, next(model.parameters()).device))
        if tokenizer is None:
            name = getattr(transformers_model(model), "name_or_path", None)
            if not name:
                raise ValueError("pass a tokenizer when the model was not loaded from a path")
            tokenizer = name
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        if adapter_name is not None and adapter_name != BASE_ADAPTER:
            if not is_peft(model):
                raise ValueError(f"adapter_name={adapter_name!r} needs a peft.PeftModel")
            if adapter_name not in model.peft_config:
                raise ValueError(f"adapter {adapter_name!r} not in {sorted(model.peft_config)}")
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.adapter_name = adapter_name
        self.max_batch_size = max_batch_size
        self.policy_version = policy_version
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.pad_id = pad_token_id(tokenizer)
        self._cache_kwarg = cache_kwarg(model)
        self._keep_kwarg = "logits_to_keep" in forward_params(model)
        #: Prefill each distinct prompt of a batch once (:meth:`_prefill`); False forwards every row.
        self.share_prefix = True
        #: Generate under ``torch.autocast`` to this dtype (None: in the weights' dtype). A learner keeps
        #: float32 master weights and trains under bf16 autocast; without this its rollouts on a GPU
        #: would run every decoding step in float32 (about twice the time and KV-cache memory).
        self.autocast_dtype: torch.dtype | None = None

    # -- properties / views ------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def view(self, adapter_name: str | None, policy_version: int = 0) -> HFPolicy:
        """Another policy on the same model and tokenizer (e.g. another LoRA adapter), own version."""
        other = HFPolicy(
            self.model,
            self.tokenizer,
            adapter_name=adapter_name,
            max_batch_size=self.max_batch_size,
            policy_version=policy_version,
        )
        other.share_prefix = self.share_prefix
        other.autocast_dtype = self.autocast_dtype
        return other

    def _autocast(self) -> Any:
        """``torch.autocast`` to :attr:`autocast_dtype` on this policy's device (no-op when None)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def bump_version(self) -> int:
        """Called by the learner after a weight update; returns the new version."""
        self.policy_version += 1
        return self.policy_version

    # -- prompts -----------------------------------------------------------------------------------

    def render_chat(self, messages: ChatMessages) -> str:
        return render_chat(self.tokenizer, messages)

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        return encode_request(self.tokenizer, request)

    # -- log-probs ---------------------------------------------------------------------------------

    def compute_logprobs(
        self,
        prompt_ids_list: Sequence[Sequence[int]],
        response_ids_list: Sequence[Sequence[int]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Per-token ``log_softmax(logits / T)`` of each response given its prompt (no gradients).

        One forward per ``max_batch_size`` rows; the adapter of this policy is active.
        """
        out: list[list[float]] = []
        with torch.inference_mode(), eval_mode(self.model), adapter_scope(self.model, self.adapter_name):
            for s in range(0, len(prompt_ids_list), self.max_batch_size):
                ps = prompt_ids_list[s : s + self.max_batch_size]
                rs = response_ids_list[s : s + self.max_batch_size]
                lp, _ = response_logprobs(self.model, ps, rs, temperature, self.pad_id, self.device)
                out.extend(row[: len(r)] for row, r in zip(lp.tolist(), rs, strict=True))
        return out

    # -- generation --------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample a response per request (batched, longest prompts first); results in request order."""
        prompts = [self.encode_prompt(r) for r in requests]
        order = sorted(range(len(requests)), key=lambda i: -len(prompts[i]))
        out: list[Generation | None] = [None] * len(requests)
        with (
            torch.inference_mode(),
            eval_mode(self.model),
            adapter_scope(self.model, self.adapter_name),
            self._autocast(),
        ):
            for s in range(0, len(order), self.max_batch_size):
                idx = order[s : s + self.max_batch_size]
                gens = self._generate_batch([requests[i] for i in idx], [prompts[i] for i in idx])
                for i, g in zip(idx, gens, strict=True):
                    out[i] = g
        return out  # type: ignore[return-value]

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_kwarg: cache, "use_cache": True}
        if self._keep_kwarg:
            kwargs["logits_to_keep"] = 1
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, **kwargs).logits
        return logits[:, -1]

    def _prefill(
        self, prompts: list[list[int]], ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Prefill the batch's KV cache and return each row's last-position logits.

        Rollouts repeat prompts (a group's G samples, every proposer of a round reading the same
        question), so with :attr:`share_prefix` each distinct prompt is forwarded once and its cache
        rows and logits are copied to the rows that share it (``batch_select_indices`` with repeated
        indices). Prompts of very different lengths (an aggregator reading 1..5 proposals) are
        prefilled in buckets of similar length (:func:`length_buckets`, :meth:`_bucketed_forward`)
        instead of all at the longest one's width. Every row keeps its positions and mask, and the
        per-request uniforms are untouched: the sampled tokens do not change. Log-probs agree to float
        rounding (a CPU GEMM may round a 2-row LM head differently from an 8-row one, attention over a
        narrower padding differently; ``tests/agents/test_hf_prefix.py``): the shipped warm start's rollouts
        have the same tokens, and their log-probs move by at most ~3e-6
        (``python -m benchmarks.perf.fingerprint`` prints both hashes).
        """
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(p), j) for j, p in enumerate(prompts)]
        shared = self.share_prefix and len(first) < len(prompts)
        rows = list(first.values()) if shared else list(range(len(prompts)))
        lengths = [len(prompts[j]) for j in rows]
        longest_first = all(a >= b for a, b in zip(lengths, lengths[1:], strict=False))  # as generate() sorts
        buckets = length_buckets(lengths, PREFILL_FORWARD_COST) if longest_first else [list(range(len(rows)))]
        if len(buckets) > 1 and all(type(layer) is GROWING_LAYER for layer in getattr(cache, "layers", ())):
            logits = self._bucketed_forward(
                [[rows[i] for i in b] for b in buckets], prompts, ids, attn, pos, cache
            )
        elif shared:
            uniq = torch.tensor(rows, device=ids.device)
            logits = self._forward(ids[uniq], attn[uniq], pos[uniq], cache)
        else:
            return self._forward(ids, attn, pos, cache)
        if not shared:
            return logits
        slot = {j: s for s, j in enumerate(rows)}
        expand = torch.tensor([slot[j] for j in source], device=ids.device)
        cache.batch_select_indices(expand)
        return logits[expand]

    def _bucketed_forward(
        self,
        buckets: list[list[int]],
        prompts: list[list[int]],
        ids: torch.Tensor,
        attn: torch.Tensor,
        pos: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """Prefill ``buckets`` of rows (longest first) each at its own padded width, then lay their
        keys and values into ``cache`` at the batch's width, left-padded with zeros.

        Why: an aggregator's prompts hold 1..5 proposals, so a batch padded to its longest prompt
        spent ~40% of its prefill on padding. A row's outputs depend only on its own real tokens
        (its positions and mask are unchanged, padded keys are masked out), so the merged cache and
        the last-position logits are those of the full-width prefill up to float rounding, and the
        decode steps run on one batch as before.
        """
        width = ids.shape[1]
        parts, keys, values = [], [], []
        for bucket in buckets:
            w = max(len(prompts[j]) for j in bucket)
            sel = torch.tensor(bucket, device=ids.device)
            part = new_cache(self.model)
            parts.append(
                self._forward(ids[sel, width - w :], attn[sel, width - w :], pos[sel, width - w :], part)
            )
            keys.append([torch.nn.functional.pad(layer.keys, (0, 0, width - w, 0)) for layer in part.layers])
            values.append(
                [torch.nn.functional.pad(layer.values, (0, 0, width - w, 0)) for layer in part.layers]
            )
        for i, layer in enumerate(cache.layers):
            layer.update(torch.cat([k[i] for k in keys]), torch.cat([v[i] for v in values]))
        return torch.cat(parts)

    @staticmethod
    def _uniforms(sps: Sequence[SamplingParams], steps: int) -> torch.Tensor:
        """One uniform per (row, step): from the request's own generator when it has a seed."""
        u = torch.zeros(len(sps), steps)
        unseeded = [i for i, sp in enumerate(sps) if sp.seed is None]
        if unseeded:
            u[unseeded] = torch.rand(len(unseeded), steps)
        for i, sp in enumerate(sps):
            if sp.seed is not None:  # its own length: the stream must not depend on the batch's longest row
                m = sp.max_new_tokens
                u[i, :m] = torch.rand(m, generator=torch.Generator().manual_seed(int(sp.seed)))
        return u

    def _generate_batch(
        self, requests: Sequence[GenerationRequest], prompts: list[list[int]]
    ) -> list[Generation]:
        dev = self.device
        n = len(requests)
        sps: list[SamplingParams] = [r.sampling for r in requests]
        max_new = [sp.max_new_tokens for sp in sps]
        steps = max(max_new, default=0)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        finish: list[str | None] = ["length" if m == 0 else None for m in max_new]
        reason: list[int | str | None] = [None] * n
        if steps > 0:
            self._decode_loop(sps, prompts, steps, tokens, logps, finish, reason, dev)
        return [
            self._finalise(sps[i], prompts[i], tokens[i], logps[i], finish[i], reason[i]) for i in range(n)
        ]

    def _decode_loop(
        self,
        sps: list[SamplingParams],
        prompts: list[list[int]],
        steps: int,
        tokens: list[list[int]],
        logps: list[list[float]],
        finish: list[str | None],
        reason: list[int | str | None],
        dev: torch.device,
    ) -> None:
        n = len(sps)
        ids, attn, pos, _ = pad_prompt_response(prompts, None, self.pad_id)
        ids, attn, pos = ids.to(dev), attn.to(dev), pos.to(dev)
        temp = torch.tensor([sp.temperature if sp.temperature > 0 else 1.0 for sp in sps], device=dev)
        top_p = torch.tensor([sp.top_p for sp in sps], device=dev)
        greedy = torch.tensor([sp.greedy for sp in sps], device=dev)
        u = self._uniforms(sps, steps).to(dev)
        eos = [frozenset() if sp.ignore_eos else frozenset(self.eos_ids) for sp in sps]
        window = [4 * max((len(s) for s in sp.stop), default=0) + 2 for sp in sps]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)

        cache = generation_cache(self.model, reserve=steps)
        logits = self._prefill(prompts, ids, attn, pos, cache)
        next_pos = attn.sum(-1, keepdim=True)
        rows = list(range(n))  # original index of each row still in the batch
        for step in range(steps):
            tok, lp = _sample(logits, temp, top_p, greedy, u[:, step])
            tok_l, lp_l = tok.tolist(), lp.tolist()
            check: list[int] = []
            for j, i in enumerate(rows):
                if finish[i] is not None:
                    continue
                t = tok_l[j]
                tokens[i].append(t)
                logps[i].append(lp_l[j])
                if t in eos[i]:
                    finish[i], reason[i] = "stop", t
                elif sps[i].stop:
                    check.append(i)
                if finish[i] is None and len(tokens[i]) >= sps[i].max_new_tokens:
                    finish[i] = "length"
            if check:
                tails = [tokens[i][-window[i] :] for i in check]
                if backend is not None:
                    texts = backend.decode_batch(tails, skip_special_tokens=False)
                else:
                    texts = self.tokenizer.batch_decode(tails, skip_special_tokens=False)
                for i, text in zip(check, texts, strict=True):
                    hit = next((s for s in sps[i].stop if s in text), None)
                    if hit is not None:
                        finish[i], reason[i] = "stop", hit
            live = [j for j, i in enumerate(rows) if finish[i] is None]
            if not live:
                break
            if len(rows) - len(live) >= max(1, PRUNE_FRACTION * len(rows)):
                keep = torch.tensor(live, device=dev)
                cache.batch_select_indices(keep)
                attn, next_pos, tok = attn[keep], next_pos[keep], tok[keep]
                temp, top_p, greedy, u = temp[keep], top_p[keep], greedy[keep], u[keep]
                rows = [rows[j] for j in live]
            attn = torch.cat([attn, attn.new_ones(len(rows), 1)], dim=-1)
            logits = self._forward(tok.unsqueeze(-1), attn, next_pos, cache)
            next_pos = next_pos + 1

    def _finalise(
        self,
        sp: SamplingParams,
        prompt: list[int],
        tokens: list[int],
        logps: list[float],
        finish: str | None,
        reason: int | str | None,
    ) -> Generation:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if isinstance(reason, str):
            ends = [text.find(s) + len(s) for s in sp.stop if s in text]
            if ends:
                text = text[: min(ends)]
        return Generation(
            text=text,
            token_ids=tokens,
            logprobs=logps,
            prompt_ids=prompt,
            policy_version=self.policy_version,
            finish_reason=finish or "length",  # type: ignore[arg-type]
            stop_reason=reason,
        )


__all__ = [
    "BASE_ADAPTER",
    "HFPolicy",
    "adapter_scope",
    "enable_gradient_checkpointing",
    "dtype_kwarg",
    "load_causal_lm",
    "eos_token_ids",
    "eval_mode",
    "encode_request",
    "pad_token_id",
    "render_chat",
    "response_logprobs",
]
