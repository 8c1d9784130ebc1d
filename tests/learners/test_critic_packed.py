"""MAPPO's critic through the prefix tree: the left-padded values and gradients, fewer positions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learners.critic import ValueCritic
from learners.prefix import prefix_tree_size
from tests._numeric import F32, assert_close_scaled

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)

QUESTION = "Question: what is 123 + 456?\n"
STATES = [
    QUESTION,
    QUESTION + "proposer_0: 579\n",
    QUESTION + "proposer_0: 579\nproposer_1: 589\n",
    QUESTION + "proposer_0: 569\n",
    "Question: what is 7 + 8?\n",
    "Question: what is 7 + 8?\nproposer_0: 15\n",
    QUESTION + "proposer_0: 579\n",  # a duplicate state
]


def _critics(tiny_model_dir: Path) -> tuple[ValueCritic, ValueCritic]:
    torch.manual_seed(0)
    padded = ValueCritic.from_pretrained(str(tiny_model_dir), max_tokens=64)
    torch.nn.init.normal_(padded.head.weight, std=0.5)  # a head that reads the hidden state
    packed = ValueCritic.from_pretrained(str(tiny_model_dir), max_tokens=64, pack_len=48)
    packed.load_state_dict(padded.state_dict())
    return padded, packed


def test_packed_values_and_gradients_equal_the_left_padded_ones(tiny_model_dir: Path) -> None:
    """Fails if a state's value is read at any node but its last (e.g. the dummy token's).

    Packed and padded sum the same terms in another order: float32 tolerances per tensor, scaled to
    its max (tests/_numeric.py), not element-wise (an Intel Xeon's embed_tokens gradient, max ~670,
    differed by 1.8e-4 from this AMD's, failing rtol=1e-4 on its small entries)."""
    torch.set_num_threads(1)
    padded, packed = _critics(tiny_model_dir)
    v_pad, v_pack = padded(STATES), packed(STATES)
    assert v_pad.shape == v_pack.shape == (len(STATES),)
    assert v_pad.std() > 1e-3  # the states get different values: a mix-up would show
    assert_close_scaled(v_pack, v_pad, F32)
    target = torch.linspace(-1, 1, len(STATES))
    ((v_pad - target) ** 2).mean().backward()
    ((v_pack - target) ** 2).mean().backward()
    for (name, a), b in zip(padded.named_parameters(), packed.parameters(), strict=True):
        assert b.grad is not None, name
        assert_close_scaled(b.grad, a.grad, F32, msg=name)


def test_packed_chunks_keep_shared_prefixes_together_within_the_node_budget(tiny_model_dir: Path) -> None:
    torch.set_num_threads(1)
    _, packed = _critics(tiny_model_dir)
    ids = [packed.fit(s) for s in STATES]
    budget = max(len(x) for x in ids) + 20
    chunks = packed.token_chunks(STATES, budget)
    assert sorted(i for c in chunks for i in c) == list(range(len(STATES)))
    for chunk in chunks:
        assert len(chunk) == 1 or prefix_tree_size([ids[i] + [packed.pad_id] for i in chunk]) <= budget
    question_states = {0, 1, 2, 3, 6}
    # lexicographic order: the 123 + 456 states sit together, so they span at most two chunks
    assert sum(1 for c in chunks if question_states & set(c)) <= 2
    assert packed.token_chunks(STATES, None) == [list(range(len(STATES)))]
