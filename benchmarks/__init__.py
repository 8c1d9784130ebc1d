"""Benchmarks: suites, evaluation, comparisons that decide, and the perf scripts.

The main names import from the package itself, lazily. (``benchmarks.evaluate`` is the evaluation module;
its function is ``benchmarks.evaluate.evaluate``.)"""

from srpo_common.lazy import lazy_exports

_EXPORTS = {
    "CompareConfig": "benchmarks.compare",
    "ComparisonResult": "benchmarks.compare",
    "run_comparison": "benchmarks.compare",
    "EvalResult": "benchmarks.evaluate",
    "Suite": "benchmarks.suites",
    "SuiteDataset": "benchmarks.suites",
    "get_suite": "benchmarks.suites",
    "register_suite": "benchmarks.suites",
    "TrainingEnv": "benchmarks.presets",
    "register_training_env": "benchmarks.presets",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
