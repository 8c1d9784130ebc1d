"""Tiny local causal LMs (model + tokenizer) built from nothing, for tests, CI and laptop experiments.

No model can be downloaded in CI, so every test and smoke run uses a model made here: a Llama- or
Qwen2-architecture config with randomly initialised weights and a byte-level BPE tokenizer trained
locally with ``tokenizers`` on procedural text. The directory written by :func:`init_tiny` loads with
the ordinary ``AutoModelForCausalLM.from_pretrained(DIR)`` / ``AutoTokenizer.from_pretrained(DIR)``,
so every code path that handles a hub model handles it too.

Tokenizer design (why it looks like Qwen2's):

* transformers 5 ignores ``tokenizer_class`` in ``tokenizer_config.json`` for ``model_type == "qwen2"``
  and always builds ``Qwen2Tokenizer``, which *re-creates* the normaliser (NFC) and pre-tokeniser (the
  Qwen2 split regex + ``ByteLevel(use_regex=False)``) from code, discarding the ones in
  ``tokenizer.json``. A tokenizer trained with any other pre-tokenisation would encode differently after
  reload (ids drift between the trainer and the learner). So we train with exactly that pipeline, for
  both architectures: the Llama path loads ``tokenizer.json`` verbatim (``TokenizersBackend``) and the
  Qwen2 path rebuilds the same pipeline, and ids round-trip in both (tested).
* The Qwen2 regex isolates every ``\\p{N}`` character, so digits are always single tokens (what
  ``pre_tokenizers.Digits(individual_digits=True)`` would give) and arithmetic is learnable.
* Special tokens: ``<|endoftext|>`` (eos of a document), ``<|im_start|>``/``<|im_end|>`` (chat turns;
  ``<|im_end|>`` is also a generation eos) and ``<|pad|>``. No BOS is added, like Qwen2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from agents.corpus import (
    EOS_TOKEN,
    IM_END,
    IM_START,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    default_corpus,
    fallback_corpus,
)

#: The pre-tokenisation regex transformers' ``Qwen2Tokenizer`` hard-codes (see module docstring).
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

#: ChatML-style template: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

Size = Literal["tiny", "mini", "small", "base"]
Arch = Literal["llama", "qwen2"]

#: Architecture per size (tied embeddings; with the default ~3.5k vocabulary: 0.85M, 2.4M, 4.8M, 30M parameters).
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "mini": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2),
    "base": dict(hidden_size=512, intermediate_size=1792, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=4),
}  # fmt: skip


@dataclass(frozen=True)
class TinyModelInfo:
    """What :func:`init_tiny` wrote (also saved as ``srpo_tiny.json`` in the directory)."""

    path: str
    size: str
    arch: str
    seed: int
    n_params: int
    vocab_size: int
    weights_sha256: str
    tokenizer_sha256: str


# -------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(corpus: Sequence[str], vocab_size: int = 4096):
    """Train the byte-level BPE ``tokenizers.Tokenizer`` (see the module docstring for the pipeline).

    Deterministic for a corpus: the BPE trainer breaks ties by pair order, not by hash order.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer, length=len(corpus))
    return tok


def wrap_tokenizer(tok):
    """The transformers tokenizer around a trained ``tokenizers.Tokenizer`` (special tokens, template)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    fast.padding_side = "left"
    return fast


# ------------------------------------------------------------------------------------------------ model


def build_config(size: Size, arch: Arch, vocab_size: int, special_ids: dict[str, int]):
    """A LlamaConfig / Qwen2Config of the requested size with tied embeddings."""
    from transformers import LlamaConfig, Qwen2Config

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    common = dict(
        SIZES[size],
        vocab_size=vocab_size,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=special_ids[PAD_TOKEN],
        bos_token_id=None,
        eos_token_id=[special_ids[EOS_TOKEN], special_ids[IM_END]],
        rms_norm_eps=1e-6,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"arch must be 'llama' or 'qwen2', got {arch!r}")


def count_params(model) -> int:
    """Parameters counted once (tied input/output embeddings count once)."""
    return sum(p.numel() for p in model.parameters())


def _weights_sha256(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def init_tiny(
    out_dir: str | os.PathLike[str],
    size: Size = "tiny",
    arch: Arch = "llama",
    seed: int = 0,
    corpus: Sequence[str] | None = None,
    vocab_size: int = 4096,
    domain: str = "math",
) -> TinyModelInfo:
    """Write a randomly initialised causal LM and a locally trained tokenizer to ``out_dir``.

    Deterministic for ``(size, arch, seed, corpus, vocab_size)``: the same weights and the same
    ``tokenizer.json`` (their sha256 are in the returned info and ``srpo_tiny.json``). ``corpus=None``
    trains on :func:`agents.corpus.default_corpus` of ``domain`` (the same text for every seed). Files are
    written to a temporary directory beside ``out_dir`` and moved in with ``os.replace``, so a reader never sees a half-written file.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    from agents.hf import dtype_kwarg

    out = Path(out_dir)
    # The default corpus does not depend on ``seed``: models of different seeds share one tokenizer, so
    # their rollouts and checkpoints are interchangeable at the token level.
    texts = list(corpus) if corpus is not None else default_corpus(seed=0, domain=domain)
    if not texts:
        raise ValueError("corpus is empty")
    tok = train_tokenizer(texts, vocab_size=vocab_size)
    special_ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = build_config(size, arch, tok.get_vocab_size(), special_ids)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, **dtype_kwarg(torch.float32))
    model.generation_config = GenerationConfig(
        eos_token_id=[special_ids[EOS_TOKEN], special_ids[IM_END]],
        pad_token_id=special_ids[PAD_TOKEN],
        bos_token_id=None,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    )
    fast = wrap_tokenizer(tok)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a CLI / test log wants one line, not shard bars
    try:
        model.save_pretrained(tmp)
        fast.save_pretrained(tmp)
        info = TinyModelInfo(
            path=str(out),
            size=size,
            arch=arch,
            seed=seed,
            n_params=count_params(model),
            vocab_size=tok.get_vocab_size(),
            weights_sha256=_weights_sha256(model),
            tokenizer_sha256=hashlib.sha256(tok.to_str().encode()).hexdigest(),
        )
        (tmp / "srpo_tiny.json").write_text(json.dumps(asdict(info), indent=2) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        shutil.rmtree(tmp, ignore_errors=True)
    return info


__all__ = [
    "CHAT_TEMPLATE",
    "SIZES",
    "SPECIAL_TOKENS",
    "TinyModelInfo",
    "build_config",
    "count_params",
    "default_corpus",
    "fallback_corpus",
    "init_tiny",
    "train_tokenizer",
    "wrap_tokenizer",
]
