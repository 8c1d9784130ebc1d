"""Shared fixtures: a tiny randomly initialised model built once per test session.

``srpo train`` gives a model the settings tested for its class when a command leaves them out
(learners.profiles, ``--model-defaults``). The suite's ``srpo train`` tests pin mechanisms (steps per
iteration, checkpoints, resumes) at ``TrainConfig``'s plain defaults, so the suite runs with the profile
off (``SRPO_MODEL_DEFAULTS=0``, inherited by the commands it starts); the tests of the profile itself
(tests/learners/test_model_defaults.py) turn it back on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["SRPO_MODEL_DEFAULTS"] = "0"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A ~1M-parameter Llama-style model with a tokenizer trained on procedural env text."""
    from agents.corpus import math_corpus
    from agents.tiny import init_tiny

    out = tmp_path_factory.mktemp("tiny_model")
    init_tiny(out, size="tiny", seed=0, corpus=math_corpus(600), vocab_size=1024)
    return out
