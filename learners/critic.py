"""MAPPO's centralised critic: a value head on a small transformers backbone reading the shared state.

The critic sees what no single agent sees: the env's shared state text before each event (the
problem and every consumed output so far). Its backbone is a separate copy of the policy's base
model (so value learning never disturbs the policy) and the value is a linear head on the last
token's final hidden state.

Input budget: every env's state text puts the question on its first line and appends turns after
it, so keeping only the tail of a long state (search transcripts, aggregation states) would drop the
question. :meth:`ValueCritic.fit` keeps the question (head, at most half the budget), a ``[...]``
marker, and as much of the latest state (tail) as fits.

Prefix tree (``pack_len``, the trainer's ``prefix_tree``): a batch's states repeat themselves (a task's
G episodes start from one question; an episode's later states extend its earlier ones), so the inputs
are forwarded as their prefix tree (:func:`learners.prefix.pack_rows`), every distinct prefix once, the
value read at each state's last node: the values of the left-padded forward up to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from learners.batching import prefix_chunks
from learners.prefix import pack_rows, packed_inputs


class ValueCritic(nn.Module):
    """``V(state_text)`` with a transformers backbone; ``max_tokens`` bounds the input (head + tail)."""

    def __init__(
        self, backbone: nn.Module, tokenizer: Any, max_tokens: int = 256, pack_len: int | None = None
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        #: forward the inputs as their prefix tree in sequences of this many nodes (None: left-padded)
        self.pack_len = pack_len
        hidden = int(backbone.config.hidden_size)
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)

    @classmethod
    def from_pretrained(
        cls, path: str, tokenizer: Any = None, max_tokens: int = 256, pack_len: int | None = None
    ) -> ValueCritic:
        """Backbone = the base model (no LM head) of a causal-LM checkpoint, e.g. the policy's."""
        from transformers import AutoModel, AutoTokenizer

        backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        return cls(backbone, tokenizer or AutoTokenizer.from_pretrained(path), max_tokens, pack_len)

    def fit(self, text: str) -> list[int]:
        """Token ids of ``text`` within ``max_tokens``: all of it when it fits, else its first line
        (the question; at most half the budget), a ``[...]`` marker and the tail of the rest."""
        tok = self.tokenizer
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.max_tokens:
            return ids or [self.pad_id]
        first, _, rest = text.partition("\n")
        head = tok(first + "\n", add_special_tokens=False)["input_ids"][: self.max_tokens // 2]
        marker = tok("[...]\n", add_special_tokens=False)["input_ids"]
        budget = self.max_tokens - len(head) - len(marker)
        if budget <= 0:
            return ids[-self.max_tokens :]
        return head + marker + tok(rest, add_special_tokens=False)["input_ids"][-budget:]

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Right-aligned (left-padded) ids of each text as :meth:`fit` keeps it."""
        ids = [self.fit(t) for t in texts]
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, width - len(x) :] = torch.tensor(x)
            attention[i, width - len(x) :] = 1
        return input_ids, attention

    def token_chunks(self, texts: Sequence[str], max_tokens: int | None) -> list[list[int]]:
        """Indices of ``texts`` in chunks that bound a forward/backward's memory by ``max_tokens`` (one
        chunk when ``None``). Left-padded: rows x widest input, sorted by input length so short states
        (a question) are not padded to long ones (an aggregation state). Prefix tree (``pack_len``):
        prefix-tree nodes, the inputs in lexicographic order so states sharing a prefix share a chunk.
        An input longer than the budget gets a chunk of its own."""
        if max_tokens is None:
            return [list(range(len(texts)))]
        if self.pack_len is not None:  # the node of a state's padding "response" counts, as packed
            seqs = [[*self.fit(t), self.pad_id] for t in texts]
            return prefix_chunks(seqs, [[i] for i in range(len(texts))], max_tokens)
        lengths = [len(self.fit(t)) for t in texts]
        chunks: list[list[int]] = []
        current: list[int] = []
        for i in sorted(range(len(texts)), key=lambda j: lengths[j]):
            if current and (len(current) + 1) * lengths[i] > max_tokens:
                chunks.append(current)
                current = []
            current.append(i)
        if current:
            chunks.append(current)
        return chunks

    def forward(self, texts: Sequence[str]) -> Tensor:
        if self.pack_len is not None:
            return self._packed_forward(texts)
        input_ids, attention = self.encode(texts)
        device = self.head.weight.device
        input_ids, attention = input_ids.to(device), attention.to(device)
        position_ids = (attention.cumsum(-1) - 1).clamp_min(0) * attention
        out = self.backbone(input_ids=input_ids, attention_mask=attention, position_ids=position_ids)
        last = out.last_hidden_state[:, -1]  # left padding: the last column is every text's last token
        return self.head(last).squeeze(-1)

    def _packed_forward(self, texts: Sequence[str]) -> Tensor:
        """Each input's last hidden state from one prefix-tree forward: every input is a "prompt" with a
        one-token "response" (padding), so the node predicting that token is the input's last one."""
        ids = [self.fit(t) for t in texts]
        packed = pack_rows(ids, [[self.pad_id]] * len(ids), self.pad_id, self.pack_len)
        inputs, src = packed_inputs(self.backbone, packed)
        nodes = self.backbone(**inputs).last_hidden_state[src]
        last = nodes[packed.src_index.to(nodes.device)]  # one token per input, in input order
        return self.head(last).squeeze(-1)
