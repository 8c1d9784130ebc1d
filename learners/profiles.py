"""Training settings by model class: what ``srpo train`` uses for the settings a user did not give.

``TrainConfig``'s dataclass defaults are one set of numbers for every model, and no set fits both a
2.4M-parameter model trained from scratch and a 7B checkpoint: at lr 3e-4 and two epochs per batch the
shipped tiny models go far off-policy (approx-KL 1.6-4.1 per iteration; the README's train command took
held-out accuracy from 0.750 to 0.250), while a real checkpoint needs lr 1e-6..1e-5. So a command that
names only a model and an env takes the settings tested for that model's class:

* ``tiny`` - a model of at most :data:`TINY_MAX_PARAMS` parameters read from its ``config.json`` (the
  project's own tiny models, 0.85M-30M): :data:`TINY`, the column suites' bench settings (16 tasks x G=8
  per iteration, one epoch split into two minibatches, lr 1e-4, prefix-tree forward under a token budget),
  the settings every ``srpo bench`` result on them was measured with (docs/results/);
* ``pretrained`` - anything else (a checkpoint directory of a larger model, or a hub id):
  :func:`pretrained_settings`, the GPU recipes' learning rate (docs/scaling.md: 1e-5 with LoRA, 1e-6 for
  full fine-tuning).

A setting given on the command line, in an experiment file or by ``--set`` always wins; a profile only
fills the rest (``srpo_common.cli.dataclass_command``'s ``profile``). The resolved config is written to
``OUT/config.toml`` as always, so a run records what it used. From Python, :func:`settings_for` gives
the same overrides (``TrainConfig(**{**settings_for(model)[1], "model": model, ...})``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The largest model (parameters, estimated from config.json) that takes the tiny-model settings.
TINY_MAX_PARAMS = 50_000_000

#: The shipped tiny models' RL settings (benchmarks.presets builds the column suites' bench settings from
#: these, so the two cannot drift): measured healthy in docs/results/algorithms.md and main-job.md.
TINY: dict[str, Any] = {
    "tasks_per_iter": 16,
    "group_size": 8,
    "epochs": 1,
    "rows_per_batch": 256,
    "minibatches_per_iter": 2,
    "lr": 1e-4,
    "prefix_tree": True,
    "max_tokens_per_microbatch": 4096,
}

#: The GPU recipes' learning rates (learners/experiments/3b.toml, 3b-full.toml, 7b.toml).
PRETRAINED_LR = {"lora": 1e-5, "full": 1e-6}


def pretrained_settings(sharing: str = "shared") -> dict[str, Any]:
    """A real checkpoint's settings: the recipes' lr for LoRA or full fine-tuning."""
    return {"lr": PRETRAINED_LR["lora" if sharing == "lora" else "full"]}


def estimate_params(config: Mapping[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer from its ``config.json`` (None when the keys are missing):
    embeddings (twice unless tied) plus per layer 4 h^2 attention (less with grouped KV heads) and
    3 h i MLP; within a few percent for llama/qwen-style configs, which is all a class boundary needs."""
    try:
        h, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
        inter = int(config.get("intermediate_size") or 4 * h)
        heads = int(config.get("num_attention_heads") or 1)
        kv = int(config.get("num_key_value_heads") or heads)
    except (KeyError, TypeError, ValueError):
        return None
    attn = 2 * h * h + 2 * h * (h * kv // max(heads, 1))
    embed = vocab * h * (1 if config.get("tie_word_embeddings", True) else 2)
    return embed + layers * (attn + 3 * h * inter)


def model_class(model: str) -> str | None:
    """``tiny``, ``pretrained``, or None when no model is named."""
    if not model:
        return None
    path = Path(model).expanduser()
    config_file = path / "config.json" if path.is_dir() else None
    if config_file is None or not config_file.is_file():
        return "pretrained"  # a hub id, or a directory without a config: a real checkpoint's settings
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "pretrained"  # unreadable: loading it will say what is wrong
    n = estimate_params(config) if isinstance(config, dict) else None
    return "tiny" if n is not None and n <= TINY_MAX_PARAMS else "pretrained"


def settings_for(model: str, sharing: str = "shared") -> tuple[str | None, dict[str, Any]]:
    """``(class, overrides)`` for ``model``: :data:`TINY` or :func:`pretrained_settings` (none without a model)."""
    kind = model_class(model)
    if kind == "tiny":
        return kind, dict(TINY)
    if kind == "pretrained":
        return kind, pretrained_settings(sharing)
    return None, {}


def profile(values: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``srpo train``'s profile hook: a description and the overrides for the model in ``values``."""
    kind, overrides = settings_for(str(values.get("model") or ""), str(values.get("sharing") or "shared"))
    if kind is None:
        return None
    label = "a tiny model (learners.profiles.TINY)" if kind == "tiny" else "a pretrained model (the recipes' lr)"
    return label, overrides


__all__ = ["PRETRAINED_LR", "TINY", "TINY_MAX_PARAMS", "estimate_params", "model_class", "pretrained_settings",
           "profile", "settings_for"]  # fmt: skip
