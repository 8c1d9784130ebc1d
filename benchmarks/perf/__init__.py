"""The performance harness: scripts that print speed and memory numbers (``python -m benchmarks.perf.bench_x``).

Kept apart from the suite runners (``benchmarks.compare``, ``benchmarks.evaluate``...) because these measure
the engine, not the algorithms; nothing in the suite runners imports them.
"""
