"""Issue 48's smaller traps, each checked where it could go wrong: GSPO's TIS weight on its ratio's
scale, consistent timeouts, the CUDA cache emptied before a vLLM engine wakes, generation under the
training dtype's autocast, weights pushed to the engine in the engine's dtype."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from learners.losses import get_policy_loss
from learners.offpolicy import tis_row_weights, tis_weights


def test_gspo_tis_auto_weight_is_the_per_token_geometric_mean() -> None:
    """GSPO's ratio is exp(mean_t log r_t); ``--tis auto`` weights it on that scale (the per-token
    geometric mean of pi_train / pi_rollout), not by the raw product over the sequence."""
    loss = get_policy_loss("gspo")
    level = loss.ratio_level(None)  # type: ignore[arg-type]
    assert level == "sequence-mean"
    train = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.2, -0.3, 0.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.2, -2.3, -0.4, -5.0], [-0.1, -0.3, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float64)
    # row 0: log ratios 0.2, 0.3, -0.1 (mean 0.4/3); row 1: -0.1, 0.0 (mean -0.05)
    expected = [math.exp(0.4 / 3), math.exp(-0.05)]
    rows = tis_row_weights(train, rollout, mask, level=level, cap=2.0)
    assert rows.tolist() == pytest.approx(expected, rel=1e-12)
    w = tis_weights(train, rollout, mask, level=level, cap=2.0)
    assert w[0].tolist() == pytest.approx([expected[0]] * 3 + [0.0], rel=1e-12)
    assert w[1].tolist() == pytest.approx([expected[1]] * 2 + [0.0, 0.0], rel=1e-12)
    # the raw product (the old weight) is another number: exp(0.4) vs exp(0.133)
    raw = tis_row_weights(train, rollout, mask, level="sequence", cap=2.0)
    assert raw[0].item() == pytest.approx(math.exp(0.4), rel=1e-12)
    assert abs(raw[0].item() - rows[0].item()) > 0.1
    # the cap applies after the normalisation: a 40-token row with a 0.05 mismatch per token
    long_t = torch.zeros(1, 40, dtype=torch.float64)
    long_r = torch.full((1, 40), -0.05, dtype=torch.float64)
    on = torch.ones(1, 40, dtype=torch.float64)
    assert tis_row_weights(long_t, long_r, on, level=level, cap=2.0).item() == pytest.approx(math.exp(0.05))
    assert tis_row_weights(long_t, long_r, on, level="sequence", cap=2.0).item() == pytest.approx(2.0)


def test_timeout_defaults_are_consistent_and_an_inconsistent_pair_is_refused(tmp_path: Any) -> None:
    """Waiting ranks must outlast rank 0's wait for a hung Ray worker (rollout_timeout) plus its
    recollection: the defaults agree, and a pair that does not is refused at start with both numbers."""
    from learners.trainer import TrainConfig

    cfg = TrainConfig(model="m", out_dir=str(tmp_path), rollout_workers=2)
    assert cfg.dist_timeout > cfg.rollout_timeout
    with pytest.raises(
        ValueError, match=r"dist_timeout \(1800 s\) must be longer than rollout_timeout \(3600 s\)"
    ):
        TrainConfig(model="m", out_dir=str(tmp_path), rollout_workers=2, dist_timeout=1800.0)
    TrainConfig(model="m", out_dir=str(tmp_path), rollout_workers=0, dist_timeout=1800.0)  # no Ray workers
    TrainConfig(
        model="m", out_dir=str(tmp_path), rollout_workers=2, dist_timeout=900.0, rollout_timeout=600.0
    )


class _FakeLLM:
    """The parts of ``vllm.LLM`` the policy touches: sleep/wake, the resolved dtype, the in-process
    worker's ``reload_weights`` (records what it was given)."""

    def __init__(self, dtype: torch.dtype, calls: list) -> None:
        self.calls = calls
        self.loaded: list[tuple[str, torch.Tensor]] = []
        worker = type(
            "W",
            (),
            {
                "reload_weights": lambda _, weights_iterator, is_checkpoint_format: self.loaded.extend(
                    weights_iterator
                )
            },
        )()
        driver = type("D", (), {"worker": worker})()
        executor = type("E", (), {"driver_worker": driver})()
        config = type("C", (), {"dtype": dtype})()
        self.llm_engine = type("L", (), {"model_executor": executor, "model_config": config})()

    def wake_up(self) -> None:
        self.calls.append("wake_up")


def _engine(dtype: torch.dtype, calls: list, asleep: bool = False) -> Any:
    from agents.vllm import VLLMPolicy, _EngineState

    pol = object.__new__(VLLMPolicy)  # no vLLM here: the engine is the stand-in above
    pol.llm = _FakeLLM(dtype, calls)
    pol.sleep_mode = True
    pol._engine_state = _EngineState()
    pol._engine_state.asleep = asleep
    pol.policy_version = 0
    return pol


def test_cuda_cache_is_emptied_before_the_engine_wakes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    engine = _engine(torch.bfloat16, calls, asleep=True)
    assert engine.wake_up()
    assert calls == ["empty_cache", "wake_up"]
    assert not engine.wake_up() and calls == ["empty_cache", "wake_up"]  # awake: nothing to do


def test_weights_reach_a_bf16_engine_in_bf16() -> None:
    """The learner's float32 master weights are pushed in the engine's dtype (half the bytes); integer
    buffers stay as they are."""
    engine = _engine(torch.bfloat16, [])
    weights = {"w": torch.randn(4, 4), "b": torch.randn(4), "steps": torch.arange(3)}
    engine.load_weights(weights, policy_version=2)
    got = dict(engine.llm.loaded)
    assert got["w"].dtype == torch.bfloat16 and got["b"].dtype == torch.bfloat16
    assert got["steps"].dtype == torch.int64
    assert torch.equal(got["w"], weights["w"].to(torch.bfloat16)) and engine.policy_version == 2
    f32 = _engine(torch.float32, [])
    f32.load_weights(weights)
    assert dict(f32.llm.loaded)["w"].dtype == torch.float32


def test_ray_workers_get_weights_in_the_engine_dtype(tiny_model_dir: Any) -> None:
    from agents.hf import HFPolicy
    from agents.policy import PolicyMap
    from agents.ray_rollout import model_states

    policies = PolicyMap.shared(HFPolicy(str(tiny_model_dir)), ["a"])
    full = model_states(policies)["model0"]
    half = model_states(policies, dtype=torch.bfloat16)["model0"]
    assert {t.dtype for t in full.values()} == {torch.float32}
    assert {t.dtype for t in half.values()} == {torch.bfloat16}
    bytes_ = lambda s: sum(t.numel() * t.element_size() for t in s.values())  # noqa: E731
    assert bytes_(half) * 2 == bytes_(full)


def test_hf_rollouts_generate_under_the_training_dtypes_autocast(tiny_model_dir: Any) -> None:
    """A bf16 run on a GPU generates under bf16 autocast (the policy's ``autocast_dtype``); on CPU
    the policy enters the autocast when asked, and not otherwise."""
    from agents.hf import HFPolicy
    from agents.policy import GenerationRequest, SamplingParams
    from learners.trainer import generation_autocast

    assert generation_autocast("bfloat16", torch.device("cuda", 0)) == torch.bfloat16
    assert generation_autocast("bfloat16", torch.device("cpu")) is None
    assert generation_autocast("float32", torch.device("cuda")) is None

    pol = HFPolicy(str(tiny_model_dir))
    seen: list[tuple[bool, torch.dtype]] = []
    pol.model.register_forward_pre_hook(
        lambda *_: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
    )
    req = [
        GenerationRequest(
            agent="a", role="r", prompt="1+1=", sampling=SamplingParams(max_new_tokens=3, seed=0)
        )
    ]
    pol.generate(req)
    assert seen and not any(on for on, _ in seen)
    seen.clear()
    pol.autocast_dtype = torch.bfloat16
    gens = pol.view(None).generate(req)  # a view keeps it
    assert seen and all(on and dt == torch.bfloat16 for on, dt in seen)
    assert len(gens[0].token_ids) == len(gens[0].logprobs) > 0


def test_vllm_request_seeds_can_be_left_to_the_engine() -> None:
    """Per-request seeds (the default, reproducible) or none (vLLM's faster batched sampler)."""
    from agents.policy import GenerationRequest, SamplingParams

    engine = _engine(torch.bfloat16, [])
    engine._vllm = type("V", (), {"SamplingParams": lambda **kw: kw})
    engine._warned_top_p = False
    req = GenerationRequest(
        agent="a", role="r", prompt="x", sampling=SamplingParams(max_new_tokens=3, seed=11)
    )
    engine.request_seeds = True
    assert engine._params(req)["seed"] == 11
    engine.request_seeds = False
    assert engine._params(req)["seed"] is None
