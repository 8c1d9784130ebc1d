"""Subprocess entry point that builds Lucene indexes with Anserini's ``IndexCollection``.

Run as ``python -I -m srpo_envs.retrievers._lucene_index THREADS INPUT_DIR INDEX_DIR [INPUT_DIR
INDEX_DIR ...]`` (through :func:`srpo_envs.retrievers.bm25.run_lucene_indexer`). It lives in its own
process because Anserini's indexer logs to stdout, can hold a large heap while indexing, and a
Java-side failure must not take the caller (a server or a training run) down with it. Several
indexes share one process because starting the JVM is most of the cost of a small one (a 200-passage
invented world: ~3.3 s alone, a fraction of that in a batch). After each index it prints one JSON line
``{"srpo_index": INDEX_DIR, "num_docs": N}``, N read back from the finished index, which the parent
checks against the corpus size (Anserini silently skips documents it cannot index).
"""

from __future__ import annotations

import json
import sys

from srpo_envs.retrievers.jvm import ensure_jvm


def main(argv: list[str]) -> int:
    threads, pairs = argv[0], argv[1:]
    if len(pairs) % 2:
        raise SystemExit("usage: THREADS INPUT_DIR INDEX_DIR [INPUT_DIR INDEX_DIR ...]")

    ensure_jvm()
    from jnius import autoclass

    indexer = autoclass("io.anserini.index.IndexCollection")
    for input_dir, index_dir in zip(pairs[::2], pairs[1::2], strict=True):
        args = [
            "-collection",
            "JsonCollection",
            "-input",
            input_dir,
            "-index",
            index_dir,
            "-generator",
            "DefaultLuceneDocumentGenerator",
            "-threads",
            str(int(threads)),
            # Raw JSON ({"id", "contents"}) is stored so the index also serves Search-R1's own
            # pyserini-based server unchanged; srpo itself maps ids back to passages in Python.
            "-storeRaw",
        ]
        indexer.main(args)
        directory = autoclass("org.apache.lucene.store.FSDirectory").open(
            autoclass("java.io.File")(index_dir).toPath()
        )
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
        num_docs = int(reader.numDocs())
        reader.close()
        directory.close()
        print(json.dumps({"srpo_index": index_dir, "num_docs": num_docs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
