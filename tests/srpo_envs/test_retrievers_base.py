"""Corpus I/O, fingerprints, cache helpers and the JVM option filter (no JVM, no model)."""

from __future__ import annotations

import gzip
import json

import pytest

from srpo_envs.retrievers import (
    Passage,
    corpus_fingerprint,
    load_corpus_jsonl,
    make_retriever,
    write_corpus_jsonl,
)
from srpo_envs.retrievers.base import check_k, default_cache_dir, split_contents
from srpo_envs.retrievers.jvm import _without_vector_module

PASSAGES = [
    Passage("p1", "Alpha", "Alpha is the first letter."),
    Passage("p2", "Beta", "Beta comes second."),
    Passage("p3", "", "A passage without a title."),
]


def test_write_then_load_roundtrip_plain_and_gzip(tmp_path):
    plain = write_corpus_jsonl(PASSAGES, tmp_path / "c.jsonl")
    assert load_corpus_jsonl(plain) == PASSAGES
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_corpus_jsonl(gz) == PASSAGES
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temp file behind


def test_search_r1_contents_records_are_split_back(tmp_path):
    path = tmp_path / "r1.jsonl"
    path.write_text("\n".join(json.dumps({"id": p.id, "contents": p.contents}) for p in PASSAGES) + "\n\n")
    loaded = load_corpus_jsonl(path)
    assert [(p.title, p.text) for p in loaded[:2]] == [(p.title, p.text) for p in PASSAGES[:2]]
    assert split_contents("no quoted title\nsecond line") == ("", "no quoted title\nsecond line")


@pytest.mark.parametrize(
    "lines, match",
    [
        (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], "duplicate"),
        (['{"title": "t", "text": "x"}'], "missing 'id'"),
        (['{"id": "a", "title": "t"}'], "needs 'text'"),
        (['{"id": "a", "title": " ", "text": ""}'], "neither title nor text"),
        (["not json"], "invalid JSON"),
        (["[1, 2]"], "JSON object"),
        ([""], "no passages"),
    ],
)
def test_bad_corpus_lines_raise_with_location(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=match):
        load_corpus_jsonl(path)


def test_fingerprint_tracks_content_not_format(tmp_path):
    fp = corpus_fingerprint(PASSAGES)
    assert corpus_fingerprint(load_corpus_jsonl(write_corpus_jsonl(PASSAGES, tmp_path / "c.jsonl"))) == fp
    edited = [PASSAGES[0], Passage("p2", "Beta", "Beta comes second!"), PASSAGES[2]]
    assert corpus_fingerprint(edited) != fp
    assert corpus_fingerprint(PASSAGES[::-1]) != fp


def test_passage_document_is_search_r1_shaped():
    doc = PASSAGES[0].to_document()
    assert doc == {
        "id": "p1",
        "title": "Alpha",
        "text": "Alpha is the first letter.",
        "contents": doc["contents"],
    }
    assert doc["contents"] == '"Alpha"\nAlpha is the first letter.'


def test_check_k_clamps_and_rejects():
    assert check_k(5, 3) == 3
    assert check_k(2, 3) == 2
    for bad in (0, -1, 2.0, True, "3"):
        with pytest.raises(ValueError):
            check_k(bad, 3)  # type: ignore[arg-type]


def test_cache_dir_env_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SRPO_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SRPO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "srpo"


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--add-modules=jdk.incubator.vector"], []),
        (["-Xmx2g", "--add-modules", "jdk.incubator.vector", "-Dx=1"], ["-Xmx2g", "-Dx=1"]),
        (["--add-modules=jdk.incubator.vector,java.sql"], ["--add-modules=java.sql"]),
        (["--add-modules", "java.sql,jdk.incubator.vector"], ["--add-modules", "java.sql"]),
        (["--add-modules=java.sql"], ["--add-modules=java.sql"]),
    ],
)
def test_vector_module_option_is_dropped_in_every_spelling(options, expected):
    assert _without_vector_module(options) == expected


def test_make_retriever_rejects_unknown_backend_and_remote_corpus():
    with pytest.raises(ValueError, match="unknown retriever backend"):
        make_retriever("tfidf", PASSAGES)
    with pytest.raises(ValueError, match="url"):
        make_retriever("remote", PASSAGES, url="http://127.0.0.1:1")
