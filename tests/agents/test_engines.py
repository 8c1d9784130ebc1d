"""One engine choice for evaluation and training rollouts (:mod:`agents.engines`).

``srpo bench eval`` and the trainer's scale-out (:mod:`learners.scale`) both build their engines here;
these tests pin what each name builds, so the two callers cannot drift apart again."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.engines import ENGINES, check_engine, engine_factory, engine_gpus, local_engine
from agents.ray_rollout import HFPolicyFactory, VLLMPolicyFactory


def test_engine_names_and_refusals() -> None:
    from learners.scale import BACKENDS

    assert BACKENDS == ENGINES == ("hf", "vllm", "openai")  # training's --backend choices are the engines
    assert check_engine("vllm") == "vllm"
    with pytest.raises(ValueError, match=r"--backend must be one of hf, vllm, openai, got 'tgi'"):
        check_engine("tgi")
    with pytest.raises(ValueError, match="must be one of hf, vllm"):
        local_engine("openai", "m")  # a server is not built in this process
    with pytest.raises(ValueError, match="takes no vLLM options"):
        local_engine("hf", "m", gpu_memory_utilization=0.5)


def test_factories_for_ray_workers_and_their_gpus() -> None:
    hf = engine_factory("hf", Path("m"), ["a", "b"], sharing="lora", lora_rank=4, device="cpu", dtype="float32")
    assert hf == HFPolicyFactory("m", ("a", "b"), "lora", 4, device="cpu", dtype="float32")
    assert engine_factory("vllm", "m", ["a"], dtype="bfloat16") == VLLMPolicyFactory("m", ("a",), dtype="bfloat16")
    assert engine_factory("vllm", "m").dtype == "auto"  # eval: the checkpoint's dtype
    with pytest.raises(ValueError, match="rollout_workers with backend=vllm supports sharing=shared"):
        engine_factory("vllm", "m", ["a"], sharing="lora")
    assert engine_gpus("vllm") == 1 and engine_gpus("hf") == 0 and engine_gpus("hf", on_gpu=True) == 1


def test_local_hf_engine_is_the_learners_policy_class(tiny_model_dir: Path) -> None:
    from agents.hf import HFPolicy

    pol = local_engine("hf", tiny_model_dir, device="cpu")
    assert isinstance(pol, HFPolicy) and next(pol.model.parameters()).device.type == "cpu"
