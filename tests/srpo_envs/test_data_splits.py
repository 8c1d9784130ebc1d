"""Held-out splits of every training set are disjoint from training; user files load via ``datasets``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srpo_envs.tasks.math_data import TRAINING_SETS, load_math, normalize_problem
from srpo_envs.tasks.search_data import load_qa


def _disjoint(train: list, held: list, text: str) -> None:
    assert train and held
    assert not {t.id for t in train} & {t.id for t in held}
    assert not {normalize_problem(getattr(t, text)) for t in train} & {
        normalize_problem(getattr(t, text)) for t in held
    }


@pytest.mark.parametrize("name", sorted(TRAINING_SETS))
def test_bundled_training_sets_have_a_disjoint_heldout_split(name: str) -> None:
    train, held, whole = load_math(name), load_math(name, split="test"), load_math(name, split="all")
    _disjoint(train, held, "problem")
    assert len(train) + len(held) == len(whole)
    assert 0.02 < len(held) / len(whole) < 0.1
    assert load_math(name, split="train") == train  # the default is the training side


def test_procedural_and_kb_training_splits_are_disjoint() -> None:
    for family, d in (("procedural", 2), ("procedural-columns", 3)):
        train = load_math(f"{family}:{d}", split="train", limit=400)
        held = load_math(f"{family}:{d}", split="test", limit=400)
        _disjoint(train, held, "problem")
    from srpo_envs.tasks.knowledge_base import make_knowledge_base

    _, kb_train = make_knowledge_base(seed=0, split="train")
    _, kb_test = make_knowledge_base(seed=0, split="test")
    _disjoint(list(kb_train), list(kb_test), "question")


def test_eval_sets_refuse_a_train_split() -> None:
    with pytest.raises(ValueError, match="evaluation set"):
        load_math("math500", split="train")
    with pytest.raises(ValueError, match="split must be"):
        load_math("math_train", split="bogus")


def test_local_files_go_through_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JSONL, JSON ({"data": [...]}) and parquet all load through ``datasets.load_dataset``."""
    import datasets
    import pandas as pd

    calls: list[str] = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    rows = [{"id": f"p{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(4)]
    jl = tmp_path / "mine.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    js = tmp_path / "mine.json"
    js.write_text(json.dumps({"data": rows}))
    pq = tmp_path / "mine.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    for path in (jl, js, pq):
        tasks = load_math(str(path))
        assert [(t.id, t.answer) for t in tasks] == [(r["id"], r["answer"]) for r in rows]
    assert calls[0] == "json" and "parquet" in calls
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "Q?", "golden_answers": ["a", "b"]}) + "\n")
    assert load_qa(str(qa))[0].answers == ("a", "b") and load_qa(str(qa))[0].id == "qa-0"


def test_unfetched_hub_id_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match="not cached"):
        load_math("no-such-owner/no-such-dataset-srpo")
