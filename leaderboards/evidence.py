"""Per-sample evidence of a leaderboard record, and how a record is re-checked against it.

A record's numbers are averages; its *evidence file* holds what they average. The file is JSON lines
(UTF-8, one canonical-JSON object per line): a header naming the eval (suite, workflow, k, sampling,
env kwargs, limit, chunk size: what ``reproduce`` needs to rerun a sample), then one line per sample::

    {"seed": 0, "dataset": "arith-d1", "dataset_sha256": "...", "task_id": "...", "task_index": 3,
     "sample_idx": 1, "answer": "12", "correct": true, "reward": 1.0, "team_tokens": 40, "tool_calls": 0}

The record names the file by its sha256 (:class:`leaderboards.schema.Evidence`), and ``record_hash``
covers that sha256, so the record and its samples stand or fall together. Files live beside the
record (or in the store) as ``samples/<sha256>.jsonl``: content-addressed, so a results list with
many records and a store share one layout.

:func:`check_evidence` re-derives the record from the samples:

* the file's size and sha256 match the record, every line is well-formed, ``correct`` agrees with
  ``reward``, each sample's dataset hash is the record's, and the samples form the full grid of
  seeds x the first N problems x k samples that the record claims (no duplicates, no gaps);
* every metric (and its ``±`` over seeds) is recomputed from the samples and must match;
* with a :class:`SampleGrader` (the real one is wired in by ``srpo_cli``; this package imports no
  env code), every answer is regraded against the registered dataset, the dataset hash and task
  ids are checked against it, and the suite's true size decides whether the record is partial.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from srpo_common import atomic_write_bytes, canonical_json, sha256_bytes
from srpo_common.jsonsafe import json_depth

from .schema import MAX_JSON_DEPTH, MAX_SAMPLES, Evidence, LeaderboardRecord

__all__ = [
    "EVIDENCE_FORMAT",
    "MAX_SAMPLE_FILE_BYTES",
    "EvidenceError",
    "SampleGrader",
    "SampleSet",
    "check_evidence",
    "encode_samples",
    "load_samples",
    "recompute_metrics",
    "samples_path",
    "write_samples",
]

EVIDENCE_FORMAT = "srpo-samples/1"
#: A sample file larger than this is refused before it is read.
MAX_SAMPLE_FILE_BYTES = 256 << 20
#: Metric agreement: relative and absolute tolerance (sums in a different order differ in the last ulp).
METRIC_TOLERANCE = 1e-9
_SAMPLE_KEYS = frozenset(
    (
        "seed",
        "dataset",
        "dataset_sha256",
        "task_id",
        "task_index",
        "sample_idx",
        "answer",
        "correct",
        "reward",
        "team_tokens",
        "tool_calls",
    )
)
_MAX_ANSWER_CHARS = 10_000
_MAX_ERRORS = 50


class EvidenceError(ValueError):
    """The evidence file cannot be used at all (missing, too big, wrong hash, not JSON lines)."""


class SampleGrader(Protocol):
    """What ``validate`` needs from the benchmark code to regrade a record (implemented in benchmarks).

    Kept as a protocol so that ``leaderboards`` imports no env or benchmark module: ``srpo_cli`` passes
    the real grader in, tests may pass a fake.
    """

    def suite_problems(self, suite: str, protocol: str | None = None) -> Mapping[str, int]:
        """Problems per dataset of the full registered suite, or of its registered ``protocol`` (a fixed
        problem set of the suite, such as the main job's); ``KeyError`` for an unknown suite or protocol.
        Called without ``protocol`` for whole-suite records, so graders written before protocols work."""
        ...

    def check_dataset(self, suite: str, dataset: str, sha256: str, task_ids: Sequence[str]) -> list[str]:
        """Errors if ``task_ids`` are not the first problems of the registered dataset, in order, or
        ``sha256`` is not its hash (for those problems); empty when both hold."""
        ...

    def grade(self, suite: str, dataset: str, task_index: int, answer: str | None) -> tuple[bool, float]:
        """``(correct, reward)`` of ``answer`` for problem ``task_index``, graded as the env grades
        (the reward before any per-member cost)."""
        ...

    def member_cost(self, suite: str, dataset: str) -> float:
        """The per-member cost the registered dataset's env charges (0 when none; routed suites set
        one), so recorded rewards below the graded reward are expected there."""
        ...


@dataclass(frozen=True)
class SampleSet:
    """A parsed evidence file: its header and its samples (dicts with :data:`_SAMPLE_KEYS`)."""

    header: dict[str, Any]
    samples: list[dict[str, Any]]


def samples_path(base_dir: str | os.PathLike[str], samples_sha256: str) -> Path:
    """Where the evidence file of a record in ``base_dir`` lives (content-addressed)."""
    return Path(base_dir) / "samples" / f"{samples_sha256}.jsonl"


def encode_samples(header: Mapping[str, Any], samples: Iterable[Mapping[str, Any]]) -> bytes:
    """The evidence file's bytes: the header then one canonical-JSON line per sample."""
    lines = [canonical_json({"format": EVIDENCE_FORMAT, **header})]
    lines += [canonical_json(dict(s)) for s in samples]
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_samples(
    base_dir: str | os.PathLike[str], header: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """Write the evidence file under ``base_dir/samples/`` (0644, atomic); returns its path and the
    ``samples_sha256``/``n_samples``/``samples_bytes`` fields of :class:`~leaderboards.schema.Evidence`."""
    data = encode_samples(header, samples)
    digest = sha256_bytes(data)
    path = samples_path(base_dir, digest)
    if not (path.is_file() and path.stat().st_size == len(data)):
        atomic_write_bytes(path, data)
    return path, {"samples_sha256": digest, "n_samples": len(samples), "samples_bytes": len(data)}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def load_samples(path: str | os.PathLike[str], evidence: Evidence) -> SampleSet:
    """Read and parse an evidence file, checking size (before reading) and sha256 against ``evidence``.

    Raises :class:`EvidenceError` for a file that cannot be the record's evidence at all; per-sample
    problems are left to :func:`check_evidence`, which reports them all.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_SAMPLE_FILE_BYTES:
                raise EvidenceError(f"{path.name}: {size} bytes; at most {MAX_SAMPLE_FILE_BYTES} accepted")
            if size != evidence.samples_bytes:
                raise EvidenceError(f"{path.name}: {size} bytes, the record says {evidence.samples_bytes}")
            data = fh.read(size + 1)
    except FileNotFoundError:
        raise EvidenceError(f"evidence file {path} not found") from None
    except OSError as exc:
        raise EvidenceError(f"cannot read evidence file {path}: {exc.strerror or exc}") from None
    digest = sha256_bytes(data)
    if digest != evidence.samples_sha256:
        raise EvidenceError(
            f"{path.name}: sha256 {digest} does not match the record's {evidence.samples_sha256}"
        )
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise EvidenceError(f"{path.name}: not UTF-8 ({exc})") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) - 1 > MAX_SAMPLES:
        raise EvidenceError(f"{path.name}: {len(lines) - 1} samples; at most {MAX_SAMPLES}")
    # one linear pass over the whole file bounds every line's nesting (a deep line would otherwise be
    # a RecursionError from inside json.loads)
    if json_depth(data) > MAX_JSON_DEPTH:
        raise EvidenceError(f"{path.name}: JSON nests deeper than {MAX_JSON_DEPTH} levels; refused")
    parsed: list[Any] = []
    for n, line in enumerate(lines, start=1):
        try:
            parsed.append(json.loads(line, parse_constant=_reject_constant))
        except ValueError as exc:
            raise EvidenceError(f"{path.name}: line {n} is not JSON ({exc})") from None
    if not parsed or not isinstance(parsed[0], dict) or parsed[0].get("format") != EVIDENCE_FORMAT:
        raise EvidenceError(f"{path.name}: the first line must be a header with format {EVIDENCE_FORMAT!r}")
    return SampleSet(header=parsed[0], samples=parsed[1:])


# ------------------------------------------------------------------------------------------ metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _dataset_metrics(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The metrics :mod:`benchmarks.metrics` computes for one dataset and seed, from its samples:
    problem-level means (each problem weighs the same) and pooled utility."""
    by_task: dict[int, list[Mapping[str, Any]]] = {}
    for s in samples:
        by_task.setdefault(int(s["task_index"]), []).append(s)
    groups = [by_task[t] for t in sorted(by_task)]
    n_problems = len(groups)
    correct = [sum(bool(s["correct"]) for s in g) for g in groups]
    sizes = [len(g) for g in groups]
    tokens_total = math.fsum(float(s["team_tokens"]) for s in samples)
    out = {
        "n_problems": float(n_problems),
        "n_samples": float(len(samples)),
        "avg@k": math.fsum(c / n for c, n in zip(correct, sizes, strict=True)) / n_problems,
        "team_tokens_per_problem": math.fsum(
            math.fsum(float(s["team_tokens"]) for s in g) / len(g) for g in groups
        )
        / n_problems,
        "tool_calls_per_problem": math.fsum(
            math.fsum(float(s["tool_calls"]) for s in g) / len(g) for g in groups
        )
        / n_problems,
        "team_tokens_total": tokens_total,
        "tool_calls_total": math.fsum(float(s["tool_calls"]) for s in samples),
    }
    out["accuracy"] = out["acc"] = out["avg@k"]
    if tokens_total > 0:
        out["utility"] = sum(correct) * 1_000_000 / tokens_total
    for kk in range(1, min(sizes) + 1):
        out[f"pass@{kk}"] = math.fsum(pass_at_k(n, c, kk) for c, n in zip(correct, sizes, strict=True))
        out[f"pass@{kk}"] /= n_problems
    return out


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1) over seeds; 0 for one seed (as ``benchmarks.metrics.mean_std``)."""
    if len(values) < 2:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def recompute_metrics(
    samples: Sequence[Mapping[str, Any]], k: int, seeds: Sequence[int], datasets: Sequence[str]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
    """Per-dataset metrics averaged over seeds, their std over seeds, and the macro mean and std.

    ``avg@k`` is also reported as ``avg@<k>`` (the record's name for it). A metric undefined for some
    seed (utility at zero tokens) is left out rather than guessed.
    """
    per_seed: dict[int, dict[str, dict[str, float]]] = {}
    for seed in seeds:
        for ds in datasets:
            rows = [s for s in samples if s["seed"] == seed and s["dataset"] == ds]
            values = _dataset_metrics(rows) if rows else {}
            values[f"avg@{k}"] = values.get("avg@k", math.nan)
            per_seed.setdefault(seed, {})[ds] = values
    names = set.intersection(*(set(v) for by_ds in per_seed.values() for v in by_ds.values()))
    metrics = {ds: {} for ds in datasets}
    spread = {ds: {} for ds in datasets}
    for ds in datasets:
        for m in names:
            vals = [per_seed[s][ds][m] for s in seeds]
            metrics[ds][m] = math.fsum(vals) / len(vals)
            spread[ds][m] = _std(vals)
    macro: dict[str, float] = {}
    macro_std: dict[str, float] = {}
    for m in names:
        per_seed_macro = [math.fsum(per_seed[s][ds][m] for ds in datasets) / len(datasets) for s in seeds]
        macro[m] = math.fsum(metrics[ds][m] for ds in datasets) / len(datasets)
        macro_std[m] = _std(per_seed_macro)
    return metrics, spread, macro, macro_std


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=METRIC_TOLERANCE, abs_tol=METRIC_TOLERANCE)


# ------------------------------------------------------------------------------------------ checks


def _costed(header: Mapping[str, Any]) -> bool:
    """Whether the eval charged a per-member cost (``member_cost``): then a correct answer's reward is
    1 minus that cost and may be <= 0, so ``correct`` <=> ``reward > 0`` holds only one way."""
    env_kwargs = header.get("env_kwargs")
    return isinstance(env_kwargs, Mapping) and bool(env_kwargs.get("member_cost"))


def reward_consistent(correct: bool, reward: float, costed: bool) -> bool:
    """``correct`` <=> ``reward > 0`` (every env rewards 1 or EM for a correct answer, 0 otherwise); with
    per-member costs only ``reward > 0`` => ``correct`` and ``reward <= 1`` can be checked."""
    if costed:
        return reward <= 1.0 and (correct or reward <= 0)
    return correct == (reward > 0)


def _sample_errors(n: int, s: Any, record: LeaderboardRecord, costed: bool = False) -> list[str]:
    """Shape, types and internal consistency of one sample line (``n`` is its line number)."""
    where = f"sample line {n}"
    if not isinstance(s, dict):
        return [f"{where}: not a JSON object"]
    if set(s) != _SAMPLE_KEYS:
        missing, extra = sorted(_SAMPLE_KEYS - set(s)), sorted(set(s) - _SAMPLE_KEYS)
        return [f"{where}: fields differ from the format (missing {missing}, extra {extra})"]
    errors = []
    ints = ("seed", "task_index", "sample_idx", "team_tokens", "tool_calls")
    for key in ints:
        if isinstance(s[key], bool) or not isinstance(s[key], int):
            errors.append(f"{where}: {key} must be an integer")
        elif key != "seed" and s[key] < 0:
            errors.append(f"{where}: {key} must be non-negative")
    if not isinstance(s["correct"], bool):
        errors.append(f"{where}: correct must be true or false")
    if (
        isinstance(s["reward"], bool)
        or not isinstance(s["reward"], int | float)
        or not math.isfinite(s["reward"])
    ):
        errors.append(f"{where}: reward must be a finite number")
    elif isinstance(s["correct"], bool) and not reward_consistent(s["correct"], s["reward"], costed):
        errors.append(
            f"{where}: correct={s['correct']} but reward={s['reward']} (correct must mean reward > 0)"
        )
    if s["answer"] is not None and (not isinstance(s["answer"], str) or len(s["answer"]) > _MAX_ANSWER_CHARS):
        errors.append(f"{where}: answer must be null or a string of at most {_MAX_ANSWER_CHARS} characters")
    if not isinstance(s["task_id"], str) or not s["task_id"]:
        errors.append(f"{where}: task_id must be a non-empty string")
    if errors:
        return errors
    if s["seed"] not in record.seeds:
        errors.append(f"{where}: seed {s['seed']} is not one of the record's seeds {record.seeds}")
    if s["dataset"] not in record.metrics:
        errors.append(f"{where}: dataset {s['dataset']!r} is not in the record")
    elif s["dataset_sha256"] != record.provenance.dataset_sha256[s["dataset"]]:
        errors.append(f"{where}: dataset_sha256 differs from the record's for {s['dataset']!r}")
    if s["sample_idx"] >= record.k:
        errors.append(f"{where}: sample_idx {s['sample_idx']} >= k = {record.k}")
    return errors


def _grid_errors(record: LeaderboardRecord, samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every (seed, dataset) must hold problems 0..N-1 with samples 0..k-1 each, once; task ids agree."""
    ev = record.evidence
    assert ev is not None
    errors = []
    seen: set[tuple[int, str, int, int]] = set()
    ids: dict[tuple[str, int], str] = {}
    for s in samples:
        key = (s["seed"], s["dataset"], s["task_index"], s["sample_idx"])
        if key in seen:
            errors.append(f"duplicate sample {key}")
        seen.add(key)
        known = ids.setdefault((s["dataset"], s["task_index"]), s["task_id"])
        if known != s["task_id"]:
            errors.append(
                f"{s['dataset']} problem {s['task_index']}: task ids {known!r} and {s['task_id']!r}"
            )
    for ds, n in ev.problems.items():
        for seed in record.seeds:
            want = {(seed, ds, t, g) for t in range(n) for g in range(record.k)}
            have = {key for key in seen if key[0] == seed and key[1] == ds}
            if have != want:
                errors.append(
                    f"{ds}, seed {seed}: samples do not form problems 0..{n - 1} x samples 0..{record.k - 1} "
                    f"({len(want - have)} missing, {len(have - want)} unexpected)"
                )
    return errors


def _metric_errors(record: LeaderboardRecord, samples: Sequence[Mapping[str, Any]]) -> list[str]:
    datasets = sorted(record.metrics)
    # macro itself needs no check here: the schema checks it is the mean of the (now checked) metrics
    metrics, spread, _, macro_std = recompute_metrics(samples, record.k, record.seeds, datasets)
    errors = []
    for ds in datasets:
        for m, v in sorted(record.metrics[ds].items()):
            if m not in metrics[ds]:
                errors.append(f"metrics[{ds!r}][{m!r}] cannot be recomputed from the samples")
            elif not _close(v, metrics[ds][m]):
                errors.append(f"metrics[{ds!r}][{m!r}] = {v!r}, but the samples give {metrics[ds][m]!r}")
            if record.metrics_std is not None and m in spread[ds]:
                got = record.metrics_std[ds][m]
                if not _close(got, spread[ds][m]):
                    errors.append(f"metrics_std[{ds!r}][{m!r}] = {got!r}, the samples give {spread[ds][m]!r}")
    for m, v in sorted((record.macro_std or {}).items()):
        if m in macro_std and not _close(v, macro_std[m]):
            errors.append(f"macro_std[{m!r}] = {v!r}, but the samples give {macro_std[m]!r}")
    return errors


def _grader_errors(
    record: LeaderboardRecord,
    header: Mapping[str, Any],
    samples: Sequence[Mapping[str, Any]],
    grader: SampleGrader,
) -> list[str]:
    ev = record.evidence
    assert ev is not None
    costed = _costed(header)
    charged = getattr(grader, "member_cost", None)  # graders written before it: the header decides
    errors = []
    what = "suite" if ev.protocol is None else f"protocol {ev.protocol!r} of suite"
    try:
        if ev.protocol is None:
            suite = dict(grader.suite_problems(record.suite))
        else:
            suite = dict(grader.suite_problems(record.suite, ev.protocol))
    except KeyError as exc:
        return [f"{what} {record.suite!r} is not registered: {exc.args[0] if exc.args else exc}"]
    if suite != ev.suite_problems:
        errors.append(
            f"evidence.suite_problems {dict(sorted(ev.suite_problems.items()))} is not the registered "
            f"{what} {record.suite!r}: {dict(sorted(suite.items()))}"
        )
    for ds in sorted(ev.problems):
        if ds not in suite:
            errors.append(f"dataset {ds!r} is not part of suite {record.suite!r}")
            continue
        ids = {s["task_index"]: s["task_id"] for s in samples if s["dataset"] == ds}
        task_ids = [ids[t] for t in sorted(ids)]
        errors += grader.check_dataset(record.suite, ds, record.provenance.dataset_sha256[ds], task_ids)
    if errors:
        return errors  # grading against the wrong data would only add noise
    for n, s in enumerate(samples, start=2):
        correct, reward = grader.grade(record.suite, s["dataset"], s["task_index"], s["answer"])
        # a suite whose datasets charge per-member costs (routed suites) takes them off the graded reward
        # even when the user passed no member_cost: the registered dataset says so, not the header
        paid = costed or (charged is not None and charged(record.suite, s["dataset"]) > 0)
        reward_ok = float(s["reward"]) <= reward + METRIC_TOLERANCE if paid else _close(reward, s["reward"])
        if correct != s["correct"] or not reward_ok:
            errors.append(
                f"sample line {n} ({s['dataset']} {s['task_id']!r} #{s['sample_idx']}, seed {s['seed']}): "
                f"recorded correct={s['correct']} reward={s['reward']}, regrading gives "
                f"correct={correct} reward={reward}"
            )
            if len(errors) >= _MAX_ERRORS:
                errors.append("... (further regrading mismatches not listed)")
                break
    return errors


def check_evidence(
    record: LeaderboardRecord, sample_set: SampleSet, grader: SampleGrader | None = None
) -> list[str]:
    """Every reason ``sample_set`` does not support ``record`` (empty when it does); see module doc.

    Without ``grader`` the answers are not regraded and the suite size is taken from the record.
    """
    if record.evidence is None:
        return ["record has no evidence (per-sample file)"]
    header, samples = sample_set.header, sample_set.samples
    errors: list[str] = []
    for key, want in (("suite", record.suite), ("k", record.k), ("workflow", record.provenance.workflow)):
        if header.get(key) != want:
            errors.append(f"evidence header {key} = {header.get(key)!r}, the record says {want!r}")
    if len(samples) != record.evidence.n_samples:
        errors.append(f"evidence has {len(samples)} samples, the record says {record.evidence.n_samples}")
    for n, s in enumerate(samples, start=2):
        errors += _sample_errors(n, s, record, _costed(header))
        if len(errors) >= _MAX_ERRORS:
            return [*errors, "... (further sample errors not listed)"]
    if errors:
        return errors
    errors += _grid_errors(record, samples)
    if errors:
        return errors[:_MAX_ERRORS]
    errors += _metric_errors(record, samples)
    if grader is not None:
        errors += _grader_errors(record, header, samples, grader)
    return errors
