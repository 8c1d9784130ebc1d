"""The GPU memory plan (learners.memory_plan): exact parameter arithmetic, the GPU recipes' verdicts (docs/scaling.md),
the refusal with what would fit, and `srpo train --plan-only`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from learners.memory_plan import (
    GIB,
    MemoryPlanError,
    ModelShape,
    PlanOptions,
    check_memory,
    load_model_shape,
    lora_parameters,
    plan_memory,
)
from srpo_cli.app import app

#: Qwen2.5-3B-Instruct's and Qwen2.5-7B-Instruct's config.json sizes (the GPU recipes of docs/scaling.md)
QWEN_3B = dict(
    hidden_size=2048, num_hidden_layers=36, vocab_size=151936, intermediate_size=11008,
    num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True, model_type="qwen2",
)  # fmt: skip
QWEN_7B = dict(
    hidden_size=3584, num_hidden_layers=28, vocab_size=152064, intermediate_size=18944,
    num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False, model_type="qwen2",
)  # fmt: skip


def test_parameter_and_lora_counts_equal_the_models(tiny_model_dir: Path) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from agents.lora import default_lora_config

    shape = load_model_shape(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    peft = get_peft_model(model, default_lora_config(r=8))
    assert lora_parameters(shape, 8) == sum(p.numel() for p in peft.parameters() if p.requires_grad)
    # Qwen2.5-3B: 3.09 B (its model card), the q/k/v biases included
    assert ModelShape.from_config(QWEN_3B).parameters == 3_085_938_688


def _readme_one_gpu(**changes) -> PlanOptions:
    """The one-GPU recipe of docs/scaling.md: bf16, vLLM (0.3 of the card), 16384 tokens per micro-batch,
    gradient checkpointing, two roles (proposers-aggregator)."""
    base = dict(dtype="bfloat16", backend="vllm", gradient_checkpointing=True, microbatch_tokens=16384, roles=2)
    return PlanOptions(**{**base, **changes})


def test_readme_one_gpu_recipe_does_not_fit_an_80gb_card_and_says_what_would() -> None:
    shape = ModelShape.from_config(QWEN_3B, name="Qwen2.5-3B")
    plan = plan_memory(shape, _readme_one_gpu(), 80 * GIB)
    items = dict(plan.items)
    # float32 master weights, gradients and two AdamW moments: 16 bytes per parameter = 46 GiB
    assert plan.static_bytes - items["CUDA context, workspaces, fragmentation"] == 16 * shape.parameters
    assert not plan.fits and plan.learner_budget == int(0.7 * 80 * GIB)
    assert any(tip.startswith("--sharing lora") for tip in plan.suggestions)
    assert any("--dp-engine fsdp2" in tip for tip in plan.suggestions)
    with pytest.raises(MemoryPlanError, match="DOES NOT FIT") as err:
        check_memory(plan)
    assert "learner total" in str(err.value) and "would fit: --sharing lora" in str(err.value)
    assert check_memory(plan, refuse=False) == plan.table()
    for fixed in (
        _readme_one_gpu(sharing="lora"),
        _readme_one_gpu(microbatch_tokens=4096, vllm_gpu_memory_utilization=0.15),
    ):
        assert plan_memory(shape, fixed, 80 * GIB).fits


def test_readme_node_recipe_needs_fsdp2() -> None:
    shape = ModelShape.from_config(QWEN_7B)
    base = dict(dtype="bfloat16", gradient_checkpointing=True, microbatch_tokens=8192, roles=2, gpus=8)
    replicated = plan_memory(shape, PlanOptions(**base), 80 * GIB)
    assert not replicated.fits and any("FSDP2 over 8 GPUs" in t for t in replicated.suggestions)
    sharded = plan_memory(shape, PlanOptions(**base, fsdp=True), 80 * GIB)
    assert sharded.fits and sharded.max_microbatch_tokens >= 8192
    # at 16384 tokens the logits of 85% response tokens alone are 19.7 GiB: the recipe's 8192 is needed
    assert not plan_memory(shape, PlanOptions(**{**base, "microbatch_tokens": 16384}, fsdp=True), 80 * GIB).fits


def test_a_vllm_share_below_its_weights_does_not_fit() -> None:
    plan = plan_memory(ModelShape.from_config(QWEN_7B), PlanOptions(backend="vllm", sharing="lora"), 40 * GIB)
    assert plan.vllm_problem is not None and not plan.fits  # 12 GiB share < 14.2 GiB of bf16 weights


def test_memory_plan_runs_before_the_model_loads_on_gpu(tiny_model_dir: Path, monkeypatch) -> None:
    """The trainer's hook: the plan of its config on its GPU, logged; refused unless memory_check is off."""
    import torch

    from learners.trainer import TrainConfig, Trainer

    logged: list[str] = []
    fake = SimpleNamespace(
        cfg=TrainConfig(model=str(tiny_model_dir), dtype="bfloat16"),
        roles=["aggregator", "proposer"],
        dist=SimpleNamespace(world_size=1),
        algorithm=SimpleNamespace(critic=False),
        model_path=str(tiny_model_dir),
        device=torch.device("cuda", 0),
        log=logged.append,
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=80 * GIB))
    Trainer._memory_plan(fake)
    assert "fits" in logged[-1]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=GIB))
    with pytest.raises(MemoryPlanError):
        Trainer._memory_plan(fake)
    fake.cfg.memory_check = False
    Trainer._memory_plan(fake)
    assert "DOES NOT FIT" in logged[-1]


def test_train_plan_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN_3B))
    args = ["train", "--plan-only", "--algo", "srpo", "--dtype", "bfloat16", "--backend", "vllm"]
    args += ["--max-tokens-per-microbatch", "16384", "--gradient-checkpointing", "--plan-gpu-gb", "80"]
    big = CliRunner().invoke(app, [*args, "--model", str(config)])
    assert big.exit_code == 1 and "DOES NOT FIT" in big.output and "--sharing lora" in big.output
    lora = CliRunner().invoke(app, [*args, "--model", str(config), "--sharing", "lora"])
    assert lora.exit_code == 0 and "fits" in lora.output and "learner total" in lora.output
    tiny = CliRunner().invoke(app, [*args, "--model", str(tiny_model_dir)])
    assert tiny.exit_code == 0, tiny.output
    missing = CliRunner().invoke(app, [*args, "--model", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no config.json" in missing.output


def test_an_unreadable_config_skips_the_plan(tmp_path: Path, monkeypatch) -> None:
    """A config without a decoder's sizes: the plan says it is unavailable and the run goes on."""
    import torch

    from learners.trainer import TrainConfig, Trainer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "something-else"}))
    logged: list[str] = []
    fake = SimpleNamespace(
        cfg=TrainConfig(model=str(tmp_path)),
        roles=["solver"],
        dist=SimpleNamespace(world_size=1),
        algorithm=SimpleNamespace(critic=False),
        model_path=str(tmp_path),
        device=torch.device("cuda", 0),
        log=logged.append,
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=GIB))
    Trainer._memory_plan(fake)
    assert logged == [f"memory plan unavailable: config of {tmp_path} has no 'hidden_size': not a decoder LM config"]


def test_the_terms_issue_48_found_missing() -> None:
    """bf16 autocast weight copies, AdamW's foreach temporaries at the step, the HF backend's KV cache and
    the response share are in the plan, each in its phase (the learner needs the largest phase)."""
    shape = ModelShape.from_config(QWEN_3B)
    h, v, layers = shape.hidden, shape.vocab, shape.layers
    full = plan_memory(shape, PlanOptions(dtype="bfloat16", roles=2), 80 * GIB, suggest=False)
    items = dict(full.items)
    copies = 2 * (layers * shape.layer_linear_parameters + v * h)
    assert items["autocast: bf16 weight copies (all matmuls)"] == copies
    # the issue's 11.5 GiB: float32 sqrt(v) of every parameter of a 3B full fine-tuning at once
    assert items["AdamW step: foreach temporaries"] == 4 * shape.parameters
    assert abs(items["AdamW step: foreach temporaries"] / GIB - 11.5) < 0.05
    peaks = full.phase_peaks()
    assert full.learner_bytes == max(peaks.values()) and peaks["step"] == full.static_bytes + 4 * shape.parameters
    assert peaks["train"] - full.static_bytes == sum(b for n, b in full.items if n.startswith(("activations", "logits", "autocast")))
    assert not any(n.startswith("autocast") for n, _ in plan_memory(shape, PlanOptions(), 80 * GIB).items)
    lora_ckpt = dict(plan_memory(shape, PlanOptions(dtype="bfloat16", sharing="lora", gradient_checkpointing=True), 80 * GIB).items)
    assert lora_ckpt["autocast: bf16 weight copies (one layer + head)"] == 2 * (shape.layer_linear_parameters + v * h)
    per_tensor = dict(plan_memory(shape, PlanOptions(foreach=False), 80 * GIB).items)
    assert per_tensor["AdamW step: per-tensor temporaries"] == 2 * 4 * v * h  # sqrt and quotient of the embedding
    # the response share comes from max_new_tokens (long answers ~85%), not a fixed half; backend=hf holds
    # a KV cache of its generation rows
    from learners.trainer import TrainConfig

    cfg = TrainConfig(model="m", max_new_tokens=1024, dtype="bfloat16", max_tokens_per_microbatch=8192)
    opts = PlanOptions.from_train_config(cfg, roles=2)
    assert opts.response_share == pytest.approx(1024 / (192 + 1024)) and opts.generation_tokens == 192 + 1024
    kv = dict(plan_memory(shape, opts, 80 * GIB).items)["KV cache: HF generation, 64 rows x 1216 tokens"]
    assert kv == 64 * 1216 * layers * 2 * shape.kv_heads * shape.head_dim * 4
    assert PlanOptions.from_train_config(cfg, roles=2, response_share=0.5).response_share == 0.5
    vllm = PlanOptions.from_train_config(replace(cfg, backend="vllm"), roles=2)
    assert not any(n.startswith("KV cache") for n, _ in plan_memory(shape, vllm, 80 * GIB).items)
    short = PlanOptions.from_train_config(replace(cfg, max_new_tokens=48), roles=2)
    logits = dict(plan_memory(shape, short, 80 * GIB).items)
    assert logits[f"logits: {short.response_share:.0%} response tokens x V"] < dict(plan_memory(shape, opts, 80 * GIB).items)[
        f"logits: {opts.response_share:.0%} response tokens x V"
    ]


def test_the_bench_counts_allocations_exactly() -> None:
    """benchmarks/perf/bench_memory_plan's measurement: the running total of CPU allocations (exact bytes)."""
    import torch

    from benchmarks.perf.bench_memory_plan import _peak_during

    keep = torch.zeros(1000, 1000)  # allocated before: not counted

    def work() -> None:
        a = torch.ones(512, 1024)  # 2 MiB
        b = torch.ones(256, 1024)  # +1 MiB: the peak, 3 MiB
        del a, b
        c = torch.ones(128, 1024)  # 0.5 MiB after the frees
        del c

    assert _peak_during(work) == 3 * 2**20
    assert _peak_during(work) == 3 * 2**20  # a second session starts from zero again
    del keep
