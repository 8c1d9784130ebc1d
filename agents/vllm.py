"""vLLM backend for the policy interface (optional: ``pip install 'srpo[vllm]'``, needs a CUDA GPU).

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
LoRA adapters must be merged into the weights by the caller (``merge_and_unload`` on a copy).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agents.policy import Generation, GenerationRequest

INSTALL_HINT = "VLLMPolicy needs vLLM and a CUDA GPU: pip install 'srpo[vllm]' (or pip install vllm)"


def vllm_available() -> bool:
    """True when ``import vllm`` works (it may still fail later without a GPU)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def _require_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


def _load_into(model: Any, weights: list[tuple[str, Any]]) -> None:
    model.load_weights(weights=iter(weights))


class VLLMPolicy:
    """A :class:`agents.policy.Policy` on a vLLM engine (same requests, same :class:`Generation` s).

    ``model``: local directory or hub id. ``tokenizer``: defaults to the model's. ``dtype``: vLLM's
    dtype string ("auto", "bfloat16", "float32"...). ``llm``: an already built ``vllm.LLM`` to wrap
    instead. Other keyword arguments go to ``vllm.LLM``.
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
        llm: Any = None,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _require_vllm()
        if llm is None:
            if model is None:
                raise ValueError("pass a model path/id or an existing vllm.LLM")
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
            seed=sp.seed,
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample one response per request; results in request order."""
        from agents.hf import encode_request

        if not requests:
            return []
        prompts = [encode_request(self.tokenizer, r) for r in requests]
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        outputs = self.llm.generate(inputs, [self._params(r) for r in requests], use_tqdm=False)
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
        items = [(name, t.detach()) for name, t in items]
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

    def _load_via_driver(self, items: list[tuple[str, Any]]) -> bool:
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


def _as_pairs(weights: Iterable[Any]) -> Iterable[tuple[str, Any]]:
    for item in weights:
        name, tensor = item
        yield str(name), tensor


__all__ = ["INSTALL_HINT", "VLLMPolicy", "vllm_available"]
