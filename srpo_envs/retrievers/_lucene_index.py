"""Subprocess entry point that builds one Lucene index with Anserini's ``IndexCollection``.

Run as ``python -m srpo_envs.retrievers._lucene_index INPUT_DIR INDEX_DIR THREADS``. It lives in
its own process because Anserini's indexer logs to stdout, can hold a large heap while indexing,
and a Java-side failure must not take the caller (a server or a training run) down with it.
The last stdout line is JSON ``{"num_docs": N}`` read back from the finished index, which the
parent checks against the corpus size (Anserini silently skips documents it cannot index).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    input_dir, index_dir, threads = argv
    from srpo_envs.retrievers.jvm import ensure_jvm

    ensure_jvm()
    from jnius import autoclass

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
    autoclass("io.anserini.index.IndexCollection").main(args)
    directory = autoclass("org.apache.lucene.store.FSDirectory").open(
        autoclass("java.io.File")(index_dir).toPath()
    )
    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
    num_docs = int(reader.numDocs())
    reader.close()
    directory.close()
    print(json.dumps({"num_docs": num_docs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
