"""Retrieval quality and speed on the bundled search data.

1. BM25 on the full bundled corpus (22,633 passages), every question whose gold passages are in
   the corpus (``meta.evidence_in_corpus is True``: NQ 500, HotpotQA 500, MuSiQue 200):
   Recall@k = mean fraction of a question's gold passages in the top k; Hit@k = at least one;
   All@10 = every gold passage in the top 10 (what a multi-hop question needs). 2Wiki has only a
   heuristic anchor passage; its anchor hit rate is shown separately.
2. Dense (all-MiniLM-L6-v2) vs BM25 side by side. Embedding the full corpus takes ~50 min on a
   2-core CPU (~7 passages/s), so by default both run on the same *subset* corpus: the gold
   passages of ``--dense-questions`` questions per dataset plus ``--dense-distractors`` random
   other passages. Smaller corpora inflate recall for both; compare the two columns, not with
   part 1. ``--dense-full`` embeds the whole corpus (cached afterwards).
3. Throughput of BM25 called directly (one batch; one query per call) vs through the server
   (a separate process on loopback, via RemoteRetriever: one query per request; batches).

    python -m benchmarks.perf.bench_retrieval [--cache-dir DIR] [--skip-dense] [--dense-full]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence

from srpo_envs.retrievers import BM25Retriever, Passage, Retriever, load_corpus_jsonl
from srpo_envs.tasks.search_data import QATask, bundled_corpus_path, load_qa

KS = (1, 5, 10)
EVIDENCE_SETS = ("nq", "hotpotqa", "musique")


def score(
    retriever: Retriever, tasks: Sequence[QATask], gold_key: str = "gold_passage_ids"
) -> dict[str, float]:
    results = retriever.search([t.question for t in tasks], max(KS))
    out: dict[str, float] = {}
    for k in KS:
        rec = hit = 0.0
        for t, hits in zip(tasks, results, strict=True):
            gold = set(t.meta[gold_key]) if gold_key == "gold_passage_ids" else {t.meta[gold_key]}
            found = len(gold & {h.id for h in hits[:k]})
            rec += found / len(gold)
            hit += found > 0
        out[f"R@{k}"] = rec / len(tasks)
        out[f"Hit@{k}"] = hit / len(tasks)
    out["All@10"] = sum(
        set(t.meta[gold_key] if gold_key == "gold_passage_ids" else [t.meta[gold_key]])
        <= {h.id for h in hits}
        for t, hits in zip(tasks, results, strict=True)
    ) / len(tasks)
    return out


def row(name: str, n: int, m: dict[str, float]) -> str:
    cells = " ".join(f"{m[f'R@{k}']:6.3f}" for k in KS)
    return f"{name:<22} {n:>5}  {cells}   {m['Hit@10']:6.3f}  {m['All@10']:6.3f}"


HEADER = f"{'dataset':<22} {'n':>5}  {'R@1':>6} {'R@5':>6} {'R@10':>6}   {'Hit@10':>6}  {'All@10':>6}"


def bm25_quality(bm25: BM25Retriever) -> list[QATask]:
    print(f"\n## BM25, full bundled corpus ({bm25.num_passages} passages)")
    print(HEADER)
    all_tasks: list[QATask] = []
    for name in EVIDENCE_SETS:
        tasks = load_qa(name, evidence_only=True)
        all_tasks += tasks
        print(row(name, len(tasks), score(bm25, tasks)))
    print(row("all evidence questions", len(all_tasks), score(bm25, all_tasks)))
    wiki = [t for t in load_qa("2wikimultihopqa") if "anchor_passage_id" in t.meta]
    print(row("2wiki (anchor only)", len(wiki), score(bm25, wiki, gold_key="anchor_passage_id")))
    return all_tasks


def dense_vs_bm25(corpus: list[Passage], args: argparse.Namespace) -> None:
    from srpo_envs.retrievers.dense import DenseRetriever

    rng = random.Random(0)
    per_set = {name: load_qa(name, evidence_only=True) for name in EVIDENCE_SETS}
    if args.dense_full:
        sub_tasks, sub_corpus = per_set, corpus
        label = f"full corpus ({len(corpus)} passages)"
    else:
        sub_tasks = {n: rng.sample(ts, min(args.dense_questions, len(ts))) for n, ts in per_set.items()}
        gold = {g for ts in sub_tasks.values() for t in ts for g in t.meta["gold_passage_ids"]}
        others = [p for p in corpus if p.id not in gold]
        keep = gold | {p.id for p in rng.sample(others, min(args.dense_distractors, len(others)))}
        sub_corpus = [p for p in corpus if p.id in keep]
        label = (
            f"SUBSET corpus: {len(gold)} gold + {len(keep) - len(gold)} random passages = {len(sub_corpus)}; "
            f"{args.dense_questions} questions per dataset"
        )
    print(f"\n## Dense (all-MiniLM-L6-v2, faiss IndexFlatIP) vs BM25 - {label}")
    t0 = time.perf_counter()
    dense = DenseRetriever(sub_corpus, cache_dir=args.cache_dir, show_progress=False)
    state = "embedded" if dense.embeddings_built else "loaded cached embeddings for"
    print(f"dense: {state} {len(sub_corpus)} passages in {time.perf_counter() - t0:.1f}s")
    bm25 = BM25Retriever(sub_corpus, cache_dir=args.cache_dir)
    print(f"{'dataset':<12} {'n':>4}  {'BM25 R@1/5/10':>22}   {'dense R@1/5/10':>22}")
    for name, tasks in [*sub_tasks.items(), ("all", [t for ts in sub_tasks.values() for t in ts])]:
        b, d = score(bm25, tasks), score(dense, tasks)
        fb = "/".join(f"{b[f'R@{k}']:.3f}" for k in KS)
        fd = "/".join(f"{d[f'R@{k}']:.3f}" for k in KS)
        print(f"{name:<12} {len(tasks):>4}  {fb:>22}   {fd:>22}")
    t0 = time.perf_counter()
    dense.search([t.question for ts in sub_tasks.values() for t in ts], 10)
    n = sum(len(ts) for ts in sub_tasks.values())
    print(f"dense search: {n / (time.perf_counter() - t0):.0f} q/s (one batch, query encoding on CPU)")
    bm25.close()


def rate(fn, n: int, repeats: int = 3) -> float:
    """Median q/s over ``repeats`` timed runs (the machine may be shared; one run is noisy)."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def throughput(bm25: BM25Retriever, questions: list[str], args: argparse.Namespace) -> None:
    from benchmarks.perf.bench_server import running_server
    from srpo_envs.retrievers import RemoteRetriever

    n = len(questions)
    print(f"\n## BM25 throughput ({n} questions, top-10, {bm25.threads} Lucene threads)")
    bm25.search(questions, 10)  # warm-up (JIT)
    print(f"direct, one batch                 {rate(lambda: bm25.search(questions, 10), n):8.0f} q/s")
    print(
        f"direct, one query per call        {rate(lambda: [bm25.search([q], 10) for q in questions], n):8.0f} q/s"
    )
    with running_server("bm25", args.cache_dir) as url, RemoteRetriever(url) as remote:
        remote.search(questions, 10)  # warm-up (JIT in the server process)
        print(
            f"server, one query per request     {rate(lambda: [remote.search([q], 10) for q in questions], n):8.0f} q/s"
        )
        print(
            f"server, 64 queries per request    "
            f"{rate(lambda: [remote.search(questions[i : i + 64], 10) for i in range(0, n, 64)], n):8.0f} q/s"
        )
        print(f"server, 256 queries per request   {rate(lambda: remote.search(questions, 10), n):8.0f} q/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", help="index/embedding cache (default: $SRPO_CACHE_DIR or ~/.cache/srpo)")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--dense-full", action="store_true", help="embed the whole corpus (slow on CPU)")
    ap.add_argument(
        "--dense-questions", type=int, default=50, help="questions per dataset in the dense subset"
    )
    ap.add_argument(
        "--dense-distractors", type=int, default=750, help="random non-gold passages in the subset"
    )
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()

    path = bundled_corpus_path(args.cache_dir)
    t0 = time.perf_counter()
    bm25 = BM25Retriever(path, cache_dir=args.cache_dir)
    how = "built" if bm25.index_built else "loaded cached"
    print(f"BM25: {how} Lucene index of {bm25.num_passages} passages in {time.perf_counter() - t0:.1f}s")
    tasks = bm25_quality(bm25)
    if not args.skip_dense:
        dense_vs_bm25(load_corpus_jsonl(path), args)
    if not args.skip_throughput:
        throughput(bm25, [t.question for t in tasks], args)
    bm25.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
