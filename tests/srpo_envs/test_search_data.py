"""Bundled QA sets and corpus, user-file loaders, EM/F1, and the procedural knowledge base."""

from __future__ import annotations

import gzip
import hashlib
import json
import re

import pytest

from srpo_envs.qa_metrics import cover_match, exact_match, f1, normalize_answer
from srpo_envs.retrievers import load_corpus_jsonl
from srpo_envs.tasks.knowledge_base import make_knowledge_base
from srpo_envs.tasks.search_data import (
    BUNDLED_CORPUS_SIZE,
    CORPUS_FILES,
    SEARCH_DATASETS,
    QATask,
    bundled_corpus_path,
    data_file,
    dataset_sha256,
    load_qa,
)


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(data_file(name).read_bytes()).splitlines()]


@pytest.mark.parametrize("name", sorted(SEARCH_DATASETS))
def test_bundled_qa_sets_load_completely(name):
    tasks = load_qa(name)
    rows = _rows(SEARCH_DATASETS[name])
    assert len(tasks) == len(rows)
    assert [t.id for t in tasks] == [r["id"] for r in rows]
    assert len({t.id for t in tasks}) == len(tasks)
    assert all(isinstance(t, QATask) and t.question and t.answers and all(t.answers) for t in tasks)
    assert all(t.source == name for t in tasks)
    assert load_qa(name, limit=7) == tasks[:7]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    cache = tmp_path_factory.mktemp("corpus-cache")
    return cache, bundled_corpus_path(cache)


def test_bundled_corpus_is_one_deduplicated_file_written_once(corpus):
    cache, path = corpus
    passages = load_corpus_jsonl(path)  # raises on duplicate ids
    assert len(passages) == BUNDLED_CORPUS_SIZE == sum(len(_rows(f)) for f in CORPUS_FILES)
    mtime = path.stat().st_mtime_ns
    assert bundled_corpus_path(cache) == path and path.stat().st_mtime_ns == mtime


def test_evidence_tasks_point_at_passages_that_contain_the_answer(corpus):
    _, path = corpus
    by_id = {p.id: p for p in load_corpus_jsonl(path)}
    tasks = (
        load_qa("nq", evidence_only=True)
        + load_qa("hotpotqa", evidence_only=True)
        + load_qa("musique", evidence_only=True)
    )
    assert len(tasks) == sum(
        1
        for n in ("nq", "hotpotqa", "musique")
        for r in _rows(SEARCH_DATASETS[n])
        if r["meta"]["evidence_in_corpus"] is True
    )
    contains = 0
    for t in tasks:
        gold = [by_id[i] for i in t.meta["gold_passage_ids"]]  # KeyError = a dangling gold id
        text = normalize_answer(" ".join(f"{p.title} {p.text}" for p in gold))
        contains += any(normalize_answer(a) in text for a in t.answers) or t.answers[0].lower() in (
            "yes",
            "no",
        )
    assert contains / len(tasks) > 0.9
    with pytest.raises(ValueError, match="evidence_only"):
        load_qa("popqa", evidence_only=True)


def test_local_files_jsonl_gz_parquet_and_answer_shapes(tmp_path):
    pd = pytest.importorskip("pandas")
    recs = [
        {"id": "a", "question": "Q1?", "answers": ["x", "x", " y "]},
        {"question": "Q2?", "golden_answers": ["z"]},
        {"id": "c", "query": "Q3?", "answer": {"text": ["t1", "t2"]}},
        {"id": "d", "question": "Q4?", "answer": {"value": "v", "aliases": ["v", "w"]}},
        {"id": "e", "question": "Q5?", "answer": 1969},
    ]
    plain = tmp_path / "mine.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    tasks = load_qa(str(plain))
    assert [t.answers for t in tasks] == [("x", "y"), ("z",), ("t1", "t2"), ("v", "w"), ("1969",)]
    assert [t.id for t in tasks] == ["a", "mine-1", "c", "d", "e"] and tasks[2].question == "Q3?"
    gz = tmp_path / "mine.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_qa(str(gz)) == tasks
    pq = tmp_path / "mine.parquet"
    pd.DataFrame([{"id": "p", "question": "Q?", "golden_answers": ["g1", "g2"]}]).to_parquet(pq)
    assert load_qa(str(pq))[0].answers == ("g1", "g2")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "no answer"}) + "\n")
    with pytest.raises(ValueError, match="at least one answer"):
        load_qa(str(bad))


def test_unknown_names_and_bundled_splits_fail_clearly():
    with pytest.raises(ValueError, match="unknown QA dataset"):
        load_qa("natural_questions")
    with pytest.raises(ValueError, match="split"):
        load_qa("nq", split="train")
    assert load_qa("bamboogle", split="test") == load_qa("bamboogle")


def test_sha256_provenance(tmp_path):
    assert dataset_sha256("nq") == hashlib.sha256(data_file("nq.jsonl.gz").read_bytes()).hexdigest()
    f = tmp_path / "x.jsonl"
    f.write_text("{}\n")
    assert dataset_sha256(str(f)) == hashlib.sha256(b"{}\n").hexdigest()
    assert dataset_sha256("owner/name") == hashlib.sha256(b"owner/name").hexdigest()


# --- EM / F1 -----------------------------------------------------------------------------------


def test_normalize_answer_squad_rules():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("  ") == ""


@pytest.mark.parametrize(
    "pred, golds, em, f",
    [
        ("Paris", ["paris"], 1.0, 1.0),
        ("the Eiffel Tower.", "Eiffel tower", 1.0, 1.0),
        ("Barack Obama", ["Obama"], 0.0, 2 * 0.5 * 1.0 / 1.5),
        ("Obama", ["Barack Obama", "Obama"], 1.0, 1.0),
        ("New York City", ["York"], 0.0, 0.5),
        ("no", ["no, it is not"], 0.0, 0.0),  # HotpotQA rule: yes/no scores only when exact
        ("yes", ["no"], 0.0, 0.0),
        ("cat", ["dog"], 0.0, 0.0),
        ("", ["dog"], 0.0, 0.0),
        ("", [""], 1.0, 1.0),
        (None, ["dog"], 0.0, 0.0),
        ("dog", [], 0.0, 0.0),
    ],
)
def test_exact_match_and_f1_known_cases(pred, golds, em, f):
    assert exact_match(pred, golds) == em
    assert f1(pred, golds) == pytest.approx(f)


def test_cover_match_is_token_aligned():
    assert cover_match("It is Paris, France", ["paris"]) == 1.0
    assert cover_match("Parisian", ["paris"]) == 0.0


# --- procedural knowledge base ------------------------------------------------------------------


@pytest.fixture(scope="module")
def kb():
    return make_knowledge_base(n_entities=200, seed=7, split="all")


def test_kb_is_deterministic_and_seeded(kb):
    corpus, tasks = kb
    assert make_knowledge_base(200, seed=7, split="all") == (corpus, tasks)
    other_corpus, _ = make_knowledge_base(200, seed=8, split="all")
    assert {p.title for p in other_corpus} != {p.title for p in corpus}
    assert len(corpus) == 200 and len({p.id for p in corpus}) == 200
    assert len({p.title.lower() for p in corpus}) == 200


def test_kb_splits_partition_the_questions(kb):
    _, tasks = kb
    train = make_knowledge_base(200, seed=7, split="train")[1]
    test = make_knowledge_base(200, seed=7, split="test")[1]
    assert {t.id for t in train} | {t.id for t in test} == {t.id for t in tasks}
    assert not {t.question for t in train} & {t.question for t in test}
    assert 0.1 < len(test) / len(tasks) < 0.3
    one_hop = make_knowledge_base(200, seed=7, split="all", max_hops=1)[1]
    assert one_hop and all(t.meta["hops"] == 1 for t in one_hop)
    assert {t.meta["hops"] for t in tasks} == {1, 2}


def test_kb_questions_are_answerable_and_unambiguous(kb):
    corpus, tasks = kb
    by_id = {p.id: p for p in corpus}
    titles = [p.title for p in corpus]
    questions: dict[str, tuple[str, ...]] = {}
    for t in tasks:
        gold = [by_id[i] for i in t.meta["gold_passage_ids"]]
        assert len(gold) == t.meta["hops"] and t.meta["evidence_in_corpus"] is True
        # The question names exactly one entity: the first gold passage's title.
        named = [x for x in titles if re.search(rf"\b{re.escape(x)}\b", t.question)]
        assert named == [gold[0].title], (t.question, named)
        # Each hop's entity is named in the previous passage; the answer is stated in the last one.
        for prev, nxt in zip(gold, gold[1:], strict=False):
            assert re.search(rf"\b{re.escape(nxt.title)}\b", prev.text)
        assert re.search(rf"\b{re.escape(t.answers[0])}\b", gold[-1].text), (t.question, t.answers)
        assert len(t.answers) == 1 and questions.setdefault(t.question, t.answers) == t.answers
    assert len(tasks) > 800


def test_kb_rejects_bad_arguments():
    for kwargs in ({"n_entities": 10}, {"split": "dev"}, {"max_hops": 3}):
        with pytest.raises(ValueError):
            make_knowledge_base(**kwargs)
