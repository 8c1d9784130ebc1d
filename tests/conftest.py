"""Shared fixtures: a tiny randomly initialised model built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A ~1M-parameter Llama-style model with a tokenizer trained on procedural env text."""
    from agents.corpus import math_corpus
    from agents.tiny import init_tiny

    out = tmp_path_factory.mktemp("tiny_model")
    init_tiny(out, size="tiny", seed=0, corpus=math_corpus(600), vocab_size=1024)
    return out
