"""``srpo index build`` / ``open_index``: a built directory searches exactly like the built-in index."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from srpo_envs.index_build import build_index, index_corpus_info, open_index, read_manifest

QUERIES = [
    "Who wrote the novel Pride and Prejudice?",
    "capital of Australia",
    "Scott Derrickson nationality",
    "What year did the Eiffel Tower open?",
    "",
]


def _write_corpus(path: Path, n: int = 40) -> Path:
    """A Search-R1-format corpus: ``id`` and ``contents`` ('"Title"\\ntext')."""
    lines = [
        json.dumps({"id": f"d{i}", "contents": f'"Topic {i}"\nPassage {i} mentions word{i} and word{i % 7}.'})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_build_resume_and_open_small(tmp_path: Path) -> None:
    corpus = _write_corpus(tmp_path / "c.jsonl")
    m = build_index(corpus, tmp_path / "idx", batch_size=16, threads=1, progress=False)
    assert m["num_passages"] == 40 and m["backend"] == "bm25"
    assert (tmp_path / "idx" / m["index_path"] / "srpo_index.json").is_file()
    retriever = open_index(tmp_path / "idx")
    assert not retriever.index_built  # found the build, did not index again
    hits = retriever.search(["word13"], 3)[0]
    assert hits and hits[0].id == "d13" and hits[0].title == "Topic 13"
    assert index_corpus_info(tmp_path / "idx")["corpus"] == "c.jsonl"
    from benchmarks.suites import get_suite  # what an eval record names for --index DIR

    info = get_suite("search").datasets[0].corpus_info({"index": str(tmp_path / "idx")})
    assert info["corpus_sha256"] == m["corpus_fingerprint"] and info["retriever"] == "bm25-index"
    # a second build of a finished directory is a no-op for the index (resume)
    again = build_index(corpus, tmp_path / "idx", batch_size=16, threads=1, progress=False)
    assert again["index_path"] == m["index_path"]


def test_interrupted_build_resumes_from_its_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import srpo_envs.index_build as ib

    corpus = _write_corpus(tmp_path / "c.jsonl")
    real = ib.build_bm25

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ib, "build_bm25", crash)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, tmp_path / "idx", batch_size=16, threads=1, progress=False)
    shards = sorted((tmp_path / "idx" / "shards").glob("docs-*.jsonl"))
    assert len(shards) == 3  # 16 + 16 + 8 passages
    stamps = [s.stat().st_mtime_ns for s in shards]
    seen: list[int] = []

    def resume(out: Path, *args, **kwargs):
        seen.extend(s.stat().st_mtime_ns for s in sorted(out.glob("shards/docs-*.jsonl")))
        return real(out, *args, **kwargs)

    monkeypatch.setattr(ib, "build_bm25", resume)
    build_index(corpus, tmp_path / "idx", batch_size=16, threads=1, progress=False)
    assert seen == stamps  # the shards of the interrupted build were reused, not rewritten
    assert not (tmp_path / "idx" / "shards").exists() and open_index(tmp_path / "idx").search(["word5"], 1)[0]


def test_bad_inputs_have_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not an srpo index directory"):
        read_manifest(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n')
    with pytest.raises(ValueError, match="duplicate passage id"):
        build_index(bad, tmp_path / "idx", progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "idx", progress=False)
    corpus = _write_corpus(tmp_path / "c.jsonl", 5)
    build_index(corpus, tmp_path / "idx2", threads=1, progress=False)
    _write_corpus(corpus, 6)  # the indexed corpus changed afterwards
    with pytest.raises(ValueError, match="not the corpus indexed"):
        open_index(tmp_path / "idx2")


@pytest.mark.slow
def test_bundled_corpus_index_matches_builtin(tmp_path: Path) -> None:
    """The full bundled corpus through ``srpo index build`` == the env's built-in BM25 index."""
    from srpo_envs.retrievers import make_retriever
    from srpo_envs.search import MultiTurnSearchEnv
    from srpo_envs.tasks.search_data import BUNDLED_CORPUS_SIZE, bundled_corpus_path, load_qa

    t0 = time.perf_counter()
    m = build_index(bundled_corpus_path(), tmp_path / "idx", threads=2, progress=False)
    seconds = time.perf_counter() - t0
    print(
        f"\nindex build: {m['num_passages']} passages, {seconds:.1f}s, {seconds * 1000 / m['num_passages']:.3f}s/1k"
    )
    assert m["num_passages"] == BUNDLED_CORPUS_SIZE
    built = open_index(tmp_path / "idx")
    assert not built.index_built
    builtin = make_retriever("bm25", bundled_corpus_path())
    queries = QUERIES + [t.question for t in load_qa("hotpotqa", limit=20)]
    got, want = built.search(queries, 5), builtin.search(queries, 5)
    assert [[(p.id, round(p.score, 4)) for p in r] for r in got] == [
        [(p.id, round(p.score, 4)) for p in r] for r in want
    ]
    # and through the env: --index DIR reaches the same passages
    env = MultiTurnSearchEnv("hotpotqa", index=str(tmp_path / "idx"), dataset_size=2)
    assert env.retriever is built
    env.reset(seed=0, options={"task_index": 0})
    env.step({"searcher_0": "<search>Scott Derrickson</search>", "searcher_1": "<search>Ed Wood</search>"})
    expect = [p.id for r in builtin.search(["Scott Derrickson", "Ed Wood"], env.top_k) for p in r]
    assert env.retrieved_ids == list(dict.fromkeys(expect))
