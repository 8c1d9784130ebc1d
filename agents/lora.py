"""One base model with a LoRA adapter per role: each role a :class:`agents.hf.HFPolicy` view of one
``PeftModel`` (``sharing="lora"``), its adapter active for that role's batches
(:func:`agents.hf.adapter_scope`). The vLLM counterpart is :func:`agents.vllm.vllm_lora_policy_map`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agents.hf import HFPolicy, load_causal_lm
from agents.policy import PolicyMap


def default_lora_config(r: int = 8, alpha: int = 16, dropout: float = 0.0) -> Any:
    """LoRA on every linear layer; dropout 0 so the learner's recompute equals the behaviour log-prob."""
    from peft import LoraConfig

    return LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def _mark_adapters_trainable(model: Any, adapters: Sequence[str]) -> None:
    """Every role's adapter trainable, the base frozen: ``get_peft_model``/``set_adapter`` leave only the
    active adapter trainable, which would silently freeze the other roles."""
    names = set(adapters)
    for name, p in model.named_parameters():
        parts = set(name.split("."))
        p.requires_grad_(bool(parts & names) and "lora_" in name)


def lora_policy_map(
    base: Any,
    roles: Sequence[str],
    lora_config: Any = None,
    tokenizer: Any = None,
    adapters: Mapping[str, str | os.PathLike[str]] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    **policy_kwargs: Any,
) -> PolicyMap:
    """One base model with one LoRA adapter per role, as a :class:`PolicyMap` of :class:`HFPolicy` views.

    ``base``: path/id, ``PreTrainedModel``, :class:`HFPolicy`, or a ``PeftModel`` that already has an
    adapter named after every role. New adapters come from ``lora_config`` (default
    :func:`default_lora_config`) or are loaded from ``adapters[role]`` (a saved adapter directory).
    Wrapping injects the LoRA layers into ``base`` in place and leaves every role's adapter trainable
    (base frozen). All views share the model, so their batches run one after another with their own
    adapter active ("adapter switching per batch group", :func:`adapter_scope`).
    """
    from peft import PeftModel, get_peft_model
    from transformers import AutoTokenizer

    roles = list(dict.fromkeys(roles))
    if not roles:
        raise ValueError("lora_policy_map needs at least one role")
    if isinstance(base, HFPolicy):
        tokenizer = tokenizer if tokenizer is not None else base.tokenizer
        base = base.model
    if isinstance(base, (str, os.PathLike)):
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(base))
        base = load_causal_lm(base, dtype, device or "cpu")
        device = dtype = None
    if isinstance(base, PeftModel):
        model = base
        missing = [r for r in roles if r not in model.peft_config]
        if missing:
            raise ValueError(f"PeftModel has no adapter for roles {missing}")
    elif adapters:
        missing = [r for r in roles if r not in adapters]
        if missing:
            raise ValueError(f"no adapter path for roles {missing}")
        model = PeftModel.from_pretrained(
            base, str(adapters[roles[0]]), adapter_name=roles[0], is_trainable=True
        )
        for r in roles[1:]:
            model.load_adapter(str(adapters[r]), adapter_name=r, is_trainable=True)
    else:
        cfg = lora_config if lora_config is not None else default_lora_config()
        model = get_peft_model(base, cfg, adapter_name=roles[0])
        for r in roles[1:]:
            model.add_adapter(r, cfg)
    if not isinstance(base, PeftModel):  # a PeftModel passed in keeps the caller's trainable set
        _mark_adapters_trainable(model, roles)
    first = HFPolicy(model, tokenizer, device=device, dtype=dtype, adapter_name=roles[0], **policy_kwargs)
    policies = {roles[0]: first}
    for r in roles[1:]:
        policies[r] = first.view(r)
    return PolicyMap.per_role(policies)


__all__ = ["default_lora_config", "lora_policy_map"]
