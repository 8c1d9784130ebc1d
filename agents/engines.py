"""Which engine generates: the one choice that evaluation (``srpo bench eval``) and training rollouts
(:mod:`learners.scale`) both make.

Engines (``--backend``):

* ``hf`` — transformers in this process (:class:`agents.hf.HFPolicy`; training rollouts use the
  learner's own policies, so the learner never builds a second copy);
* ``vllm`` — a vLLM engine in this process (:class:`agents.vllm.VLLMPolicy`);
* ``openai`` — an OpenAI-compatible server: evaluation calls it with
  :func:`agents.openai_policy.served_policies`, training pushes a LoRA adapter per role to it
  (:mod:`learners.served`); neither is built here (both need their URLs and what they push).

With Ray rollout workers the engine lives in every worker: :func:`engine_factory` gives the picklable
factory each worker builds its role -> policy map with (the learner's FSDP2 rollout copy uses it too),
and :func:`engine_gpus` the GPUs a worker asks Ray for. Why one module: the choice was written twice
(the eval CLI and the trainer's scale-out), and the two copies had drifted in their dtype and GPU rules.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from agents.ray_rollout import HFPolicyFactory, VLLMPolicyFactory

__all__ = ["ENGINES", "LOCAL_ENGINES", "check_engine", "engine_factory", "engine_gpus", "local_engine"]

#: every generation engine, as ``--backend`` names it
ENGINES = ("hf", "vllm", "openai")
#: the engines that run in this process (or in each Ray worker)
LOCAL_ENGINES = ("hf", "vllm")


def check_engine(backend: str, allowed: Sequence[str] = ENGINES) -> str:
    """``backend`` if it names one of ``allowed``, else a ValueError naming them."""
    if backend not in allowed:
        raise ValueError(f"--backend must be one of {', '.join(allowed)}, got {backend!r}")
    return backend


def local_engine(
    backend: str,
    model: str | os.PathLike[str],
    *,
    device: str | Any | None = None,
    dtype: str | None = None,
    **vllm_kwargs: Any,
) -> Any:
    """One policy of ``model`` in this process: an ``HFPolicy`` (``hf``: on ``device`` in ``dtype``) or a
    ``VLLMPolicy`` (``vllm``: ``dtype``, default ``auto``, and vLLM's own options such as
    ``gpu_memory_utilization``, ``seed``, ``sleep_mode``, ``lora_rank``)."""
    check_engine(backend, LOCAL_ENGINES)
    if backend == "vllm":
        from agents.vllm import VLLMPolicy

        return VLLMPolicy(str(model), dtype=dtype or "auto", **vllm_kwargs)
    if vllm_kwargs:
        raise ValueError(f"backend=hf takes no vLLM options, got {sorted(vllm_kwargs)}")
    from agents.hf import HFPolicy  # lazy: torch/transformers load only when a model is used

    return HFPolicy(str(model), device=device, **({"dtype": dtype} if dtype is not None else {}))


def engine_factory(
    backend: str,
    model: str | os.PathLike[str],
    roles: Sequence[str] = (),
    *,
    sharing: str = "shared",
    lora_rank: int = 8,
    device: str | None = None,
    dtype: str | None = None,
) -> Any:
    """The picklable factory of ``backend``'s role -> policy map (each Ray worker calls it in its process).

    ``hf``: :class:`agents.ray_rollout.HFPolicyFactory` (``sharing`` shared / per-role / lora, on
    ``device`` in ``dtype``). ``vllm``: :class:`agents.ray_rollout.VLLMPolicyFactory`, one shared engine
    per worker (its weights are pushed as full state dicts, so only ``sharing=shared``)."""

    check_engine(backend, LOCAL_ENGINES)
    if backend == "vllm":
        if sharing != "shared":
            raise ValueError(
                f"rollout_workers with backend=vllm supports sharing=shared, got {sharing!r}; "
                "for LoRA per role use the colocated engine (rollout_workers=0, sharing=lora)"
            )
        return VLLMPolicyFactory(str(model), tuple(roles), dtype=dtype or "auto")
    return HFPolicyFactory(str(model), tuple(roles), sharing, lora_rank, device=device, dtype=dtype)


def engine_gpus(backend: str, on_gpu: bool = False) -> int:
    """GPUs a Ray worker of ``backend`` asks for: one for vLLM (it needs a device of its own), one for
    HF when the run is on a GPU, else none."""
    return 1 if (on_gpu or backend == "vllm") else 0
