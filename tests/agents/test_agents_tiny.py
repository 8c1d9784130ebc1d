"""Tiny local models: loadable with the Auto classes, ids round-trip, deterministic, sized as promised."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from agents.tiny import (
    SPECIAL_TOKENS,
    build_config,
    count_params,
    fallback_corpus,
    init_tiny,
    train_tokenizer,
)

CORPUS = fallback_corpus(1500, seed=3)

TRICKY = [
    "\\frac{1}{2} + \\sqrt{x^2 + y^2} = \\boxed{\\dfrac{3}{4}}",
    "$\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}$ and \\left( a \\right)",
    "1234567890 + 0.5 = -1e10, 3,141,592",
    "   leading spaces and trailing   ",
    "a\n\nb\r\n\tc\n \n  d",
    "café naïve 日本語 😀 π ≤ ∞ → ñ",
    "e\u0301 vs \u00e9",  # NFD vs NFC: both sides normalise the same way
    "don't I'll they're WE'VE it's",
    ",hello!! ??? ... ---",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "x<|endoftext|>y<|pad|>",
    "",
]


@pytest.fixture(scope="module")
def trained():
    return train_tokenizer(CORPUS, vocab_size=1024)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"tiny_{request.param}")
    init_tiny(out, size="tiny", arch=request.param, seed=0, corpus=CORPUS, vocab_size=1024)
    return out


def test_tokenizer_ids_round_trip_after_reload(trained, model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    for text in TRICKY:
        expected = trained.encode(text).ids
        assert tok(text, add_special_tokens=True)["input_ids"] == expected, text
        assert tok.encode(text) == expected, text
        # decoding gives back the (NFC-normalised) text
        assert tok.decode(expected) == unicodedata.normalize("NFC", text), text


def test_digits_are_single_tokens(model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    pieces = [tok.decode([i]) for i in tok("x = 9876543210 + 31415")["input_ids"]]
    digits = [p.strip() for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("987654321031415")


def test_special_tokens_and_chat_template(model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    for s in SPECIAL_TOKENS:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == [s]
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>"
    text = tok.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_model_loads_and_matches_tokenizer(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.vocab_size == len(tok)
    eos = model.generation_config.eos_token_id
    assert set(eos) == {tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")}
    ids = torch.tensor([tok("What is 1 + 2?")["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()
    meta = json.loads((model_dir / "srpo_tiny.json").read_text())
    assert meta["n_params"] == count_params(model)
    assert not list(model_dir.parent.glob(f".{model_dir.name}.*")), "temporary directory left behind"


def test_init_tiny_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = init_tiny(tmp_path / "a", arch="qwen2", seed=7, corpus=CORPUS, vocab_size=1024)
    b = init_tiny(tmp_path / "b", arch="qwen2", seed=7, corpus=CORPUS, vocab_size=1024)
    c = init_tiny(tmp_path / "c", arch="qwen2", seed=8, corpus=CORPUS, vocab_size=1024)
    assert a.weights_sha256 == b.weights_sha256
    assert a.tokenizer_sha256 == b.tokenizer_sha256 == c.tokenizer_sha256
    assert a.weights_sha256 != c.weights_sha256
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        ha = hashlib.sha256((tmp_path / "a" / name).read_bytes()).hexdigest()
        hb = hashlib.sha256((tmp_path / "b" / name).read_bytes()).hexdigest()
        assert ha == hb, name
    # the recorded hash is the hash of the weights that load back
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "c")
    h = hashlib.sha256()
    for k, t in sorted(loaded.state_dict().items()):
        h.update(k.encode())
        h.update(t.contiguous().numpy().tobytes())
    assert h.hexdigest() == c.weights_sha256


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    ("size", "lo", "hi"), [("tiny", 0.5e6, 2e6), ("small", 3e6, 8e6), ("base", 20e6, 40e6)]
)
def test_size_parameter_counts(arch: str, size: str, lo: float, hi: float) -> None:
    ids = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
    config = build_config(size, arch, 3500, ids)  # the default tokenizer has ~3.5k tokens
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert lo <= count_params(model) <= hi


def test_cli_init_tiny(tmp_path: Path) -> None:
    from agents.cli import app

    result = CliRunner().invoke(
        app, ["init-tiny", "--out", str(tmp_path / "m"), "--arch", "qwen2", "--seed", "1"]
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "m" / "srpo_tiny.json").read_text())
    assert f"parameters: {meta['n_params']:,}" in result.output
    assert f"vocab size: {meta['vocab_size']}" in result.output
    assert 2000 <= meta["vocab_size"] <= 4096  # the default corpus fills a ~2-4k vocabulary
    bad = CliRunner().invoke(app, ["init-tiny", "--out", str(tmp_path / "x"), "--size", "huge"])
    assert bad.exit_code != 0
