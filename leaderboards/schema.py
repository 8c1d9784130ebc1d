"""Leaderboard result records: a strict pydantic v2 schema plus hashing and provenance helpers.

A record is *data only*: it is read and written as JSON (never pickle), validated in pydantic strict
mode (no silent ``"3" -> 3`` coercion), and carries a ``record_hash`` -- the sha256 of the canonical
JSON of everything else -- so an edit made after submission is detected. The hash is an integrity
check against accidental or casual edits, not a signature: anyone can recompute it.

Validation rejects, with one readable message per problem:

* malformed records: missing/extra fields, wrong types, NaN/inf, fraction metrics (``avg@k``,
  ``pass@k``, ``accuracy``...) outside [0, 1], negative cost metrics, malformed sha256 strings,
  bad names or dates;
* inconsistent records: ``macro[m]`` not the mean over datasets of ``metrics[d][m]`` (within 1e-6),
  datasets with different metric sets, dataset hashes not matching the metric datasets, empty or
  duplicate seeds, ``k < 1``;
* tampered records: ``record_hash`` does not match the content;
* oversized records: more than :data:`MAX_RECORD_BYTES` bytes (checked *before* parsing, so a huge
  file costs a ``stat``, not a gigabyte of RAM), :data:`MAX_DATASETS` datasets, :data:`MAX_METRICS`
  metrics or :data:`MAX_SEEDS` seeds;
* unknown metric names: every metric is range-checked by its *name* against :data:`METRIC_RANGES`
  (plus the ``avg@N``/``pass@N``/``maj@N`` families), so ``accuracy_strict = 42`` cannot slip past a
  pattern; a placeholder all-zero sha256 is not a hash.

A record may point, by sha256, to its per-sample evidence file (:class:`Evidence`); what that file
holds and how it is re-checked lives in :mod:`leaderboards.evidence`.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import math
import numbers
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic.types import FiniteFloat

from srpo_common.hashing import canonical_json, sha256_bytes, sha256_file
from srpo_common.jsonsafe import loads_bounded
from srpo_common.plugins import provenance as plugin_provenance

__all__ = [
    "Evidence",
    "LeaderboardRecord",
    "MAX_DATASETS",
    "MAX_METRICS",
    "MAX_RECORD_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_SAMPLES",
    "MAX_SEEDS",
    "METRIC_RANGES",
    "Provenance",
    "RecordContent",
    "RecordValidationError",
    "canonical_json",
    "compute_record_hash",
    "dump_record_json",
    "git_commit",
    "hash_config",
    "is_fraction_metric",
    "load_record",
    "load_records",
    "make_record",
    "metric_range",
    "package_version",
    "parse_record_json",
    "record_dict",
    "sha256_bytes",
    "sha256_file",
    "validate_record",
]

SCHEMA_VERSION = 1
#: Absolute tolerance for ``macro == mean(datasets)`` (a relative 1e-9 also applies to large values).
MACRO_TOLERANCE = 1e-6

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_GIT_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}|unknown")
_SUITE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DATASET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,127}")
_PROTOCOL_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_METRIC_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_@.+-]{0,63}")
_FRACTION_RE = re.compile(r"(?:(?:avg|pass|maj)@\d+|acc|accuracy|exact_match|em|f1)")
_AT_K_RE = re.compile(r"(?:avg|pass|maj)@[1-9]\d{0,5}")
#: Every metric a record may carry and its allowed range (``avg@N``/``pass@N``/``maj@N`` are fractions
#: too). A closed list rather than a naming pattern: a new metric gets a range here, or it is rejected.
METRIC_RANGES: dict[str, tuple[float, float]] = {
    **dict.fromkeys(("acc", "accuracy", "exact_match", "em", "f1"), (0.0, 1.0)),
    **dict.fromkeys(
        (
            "team_tokens_per_problem",
            "tool_calls_per_problem",
            "team_tokens_total",
            "tool_calls_total",
            "n_problems",
            "n_samples",
        ),
        (0.0, math.inf),
    ),
    # correct samples per million team tokens: at most one correct sample per token
    "utility": (0.0, 1e6),
}
#: Size limits: a record is a summary (datasets x metrics), not a data dump; the samples live in the
#: evidence file. Bytes are checked before parsing.
MAX_RECORD_BYTES = 1 << 20
MAX_DATASETS = 256
MAX_METRICS = 64
MAX_SEEDS = 1000
#: At most this many samples in one record's evidence file.
MAX_SAMPLES = 2_000_000
#: Records nest 4 levels (a results list 5); anything much deeper is refused before it is parsed.
MAX_JSON_DEPTH = 32
_ZERO_SHA256 = "0" * 64
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class RecordValidationError(ValueError):
    """A record failed validation; ``errors`` holds one human-readable message per problem."""

    def __init__(self, errors: Sequence[str], source: str | None = None) -> None:
        self.errors = list(errors)
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + "invalid leaderboard record:\n  - " + "\n  - ".join(self.errors))


def is_fraction_metric(name: str) -> bool:
    """Metrics that are fractions of problems/samples and so must lie in [0, 1]."""
    return _FRACTION_RE.fullmatch(name.lower()) is not None


def metric_range(name: str) -> tuple[float, float] | None:
    """The allowed ``(low, high)`` of a metric, or ``None`` for a metric name the schema does not know."""
    if _AT_K_RE.fullmatch(name):
        return (0.0, 1.0)
    return METRIC_RANGES.get(name)


def _check_sha256(value: str) -> str:
    if not _SHA256_RE.fullmatch(value):
        raise ValueError(f"not a sha256 hex digest (64 lowercase hex characters): {value[:80]!r}")
    if value == _ZERO_SHA256:
        raise ValueError("all-zero sha256 is a placeholder, not the hash of anything")
    return value


def _check_git(value: str) -> str:
    if not _GIT_RE.fullmatch(value):
        raise ValueError(f"git commit must be a full hex object id or 'unknown', got {value[:80]!r}")
    return value


def _pattern_check(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"invalid {what} {value[:80]!r} (allowed: {pattern.pattern})")
        return value

    return check


def _check_text(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    if len(value) > 200:
        raise ValueError(f"must be at most 200 characters, got {len(value)}")
    if _CONTROL_RE.search(value):
        raise ValueError("must not contain control characters")
    return value


#: How far past this machine's clock a record's date may be (another machine's clock skew): a day.
MAX_CLOCK_SKEW = dt.timedelta(days=1)


def _check_date(value: str) -> str:
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"date must be ISO 8601 (e.g. 2025-01-31T12:00:00Z), got {value[:40]!r}") from None
    if when.tzinfo is None:  # a date without a zone is read as UTC (what make_record writes)
        when = when.replace(tzinfo=dt.UTC)
    now = dt.datetime.now(dt.UTC)
    if when > now + MAX_CLOCK_SKEW:
        raise ValueError(
            f"date {value[:40]} is in the future (this machine's clock says {now:%Y-%m-%d %H:%M} UTC; a day of "
            "clock skew is allowed): a result cannot be dated before it was run"
        )
    return value


Sha256 = Annotated[str, AfterValidator(_check_sha256)]
GitCommit = Annotated[str, AfterValidator(_check_git)]
SuiteName = Annotated[str, AfterValidator(_pattern_check(_SUITE_RE, "suite name"))]
DatasetName = Annotated[str, AfterValidator(_pattern_check(_DATASET_RE, "dataset name"))]
MetricName = Annotated[str, AfterValidator(_pattern_check(_METRIC_RE, "metric name"))]
Text = Annotated[str, AfterValidator(_check_text)]
ProtocolName = Annotated[str, AfterValidator(_pattern_check(_PROTOCOL_RE, "protocol name"))]
IsoDate = Annotated[str, AfterValidator(_check_date)]

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class Provenance(BaseModel):
    """Where a result came from: enough to rerun it or to tell two runs apart."""

    model_config = _STRICT

    package_version: Text
    git_commit: GitCommit
    model_id: Text | None = None
    weights_sha256: Sha256 | None = None
    algorithm: Text
    config_hash: Sha256
    workflow: Text
    dataset_sha256: dict[DatasetName, Sha256]
    retriever: Text | None = None
    corpus: Text | None = None
    corpus_sha256: Sha256 | None = None
    date: IsoDate
    #: the resolved config itself (plain JSON data; ``config_hash`` is its hash), so a record says how
    #: to rerun it: a comparison's records carry each variant's training config in the experiment-file
    #: sections (``srpo train --config``). Optional and left out of the hash when unset, so records
    #: written before it keep their ids.
    config: dict[str, Any] | None = None
    #: the plugins the run had loaded (``srpo_common.plugins``: name -> target and distribution version),
    #: which its algorithm, env or suite may come from; optional, left out of the hash when unset
    plugins: dict[Text, Text] | None = None

    @model_validator(mode="after")
    def _model_identified(self) -> Provenance:
        if self.model_id is None and self.weights_sha256 is None:
            raise ValueError("provenance needs model_id or weights_sha256 (at least one)")
        if self.config is not None and hash_config(self.config) != self.config_hash:
            raise ValueError("provenance.config does not hash to provenance.config_hash")
        if not self.dataset_sha256:
            raise ValueError("provenance.dataset_sha256 must list at least one dataset")
        return self


class Evidence(BaseModel):
    """Where a record's numbers come from: its per-sample file, named by sha256 (see
    :mod:`leaderboards.evidence`), and how much of the suite it covers.

    ``problems`` counts the problems evaluated per dataset; ``suite_problems`` the problems of every
    dataset of the suite as run: the whole suite, or, with ``protocol``, the fixed problem set that the
    suite's registered protocol of that name defines (e.g. ``bench-quick``: the first 32 problems of
    each dataset, what the main job evaluates). A record that leaves out a dataset or problems of
    that set is *partial*: it is ranked apart, since Avg@k over the first problem says little about
    the suite. Records of a protocol are ranked among themselves (other problems than the whole suite).
    """

    model_config = _STRICT

    samples_sha256: Sha256
    n_samples: int
    samples_bytes: int
    problems: dict[DatasetName, int]
    suite_problems: dict[DatasetName, int]
    protocol: ProtocolName | None = None

    @model_validator(mode="after")
    def _sizes(self) -> Evidence:
        errors = []
        if not 1 <= self.n_samples <= MAX_SAMPLES:
            errors.append(f"n_samples must be in [1, {MAX_SAMPLES}], got {self.n_samples}")
        if self.samples_bytes < 1:
            errors.append(f"samples_bytes must be >= 1, got {self.samples_bytes}")
        if len(self.suite_problems) > MAX_DATASETS:
            errors.append(
                f"suite_problems lists {len(self.suite_problems)} datasets (at most {MAX_DATASETS})"
            )
        for where, counts in (("problems", self.problems), ("suite_problems", self.suite_problems)):
            errors += [f"{where}[{d!r}] must be >= 1, got {n}" for d, n in counts.items() if n < 1]
        for d, n in self.problems.items():
            if d not in self.suite_problems:
                errors.append(f"problems[{d!r}]: dataset is not in suite_problems")
            elif n > self.suite_problems[d]:
                errors.append(f"problems[{d!r}] = {n} exceeds the suite's {self.suite_problems[d]}")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def partial(self) -> bool:
        """True when some dataset of the suite, or some of its problems, was not evaluated."""
        return set(self.problems) != set(self.suite_problems) or any(
            n < self.suite_problems[d] for d, n in self.problems.items()
        )


class RecordContent(BaseModel):
    """Everything in a record except its hash; all consistency checks live here.

    ``metrics_std``/``macro_std`` are the sample standard deviations over seeds (0 for one seed) that
    the page shows as ``±`` and ranks with; ``evidence`` points to the per-sample file. All three are
    optional so that records written before they existed keep validating (and keep their hash).
    """

    model_config = _STRICT

    schema_version: Literal[1] = SCHEMA_VERSION
    suite: SuiteName
    name: Text
    k: int
    seeds: list[int]
    metrics: dict[DatasetName, dict[MetricName, FiniteFloat]]
    macro: dict[MetricName, FiniteFloat]
    provenance: Provenance
    metrics_std: dict[DatasetName, dict[MetricName, FiniteFloat]] | None = None
    macro_std: dict[MetricName, FiniteFloat] | None = None
    evidence: Evidence | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_oversized(cls, data: Any) -> Any:
        """Count before validating: 330k datasets must fail in microseconds, not after building them."""
        if isinstance(data, Mapping):
            for key, limit in (("metrics", MAX_DATASETS), ("seeds", MAX_SEEDS), ("macro", MAX_METRICS)):
                value = data.get(key)
                if isinstance(value, Mapping | list) and len(value) > limit:
                    raise ValueError(f"{key} has {len(value)} entries; a record holds at most {limit}")
            metrics = data.get("metrics")
            if isinstance(metrics, Mapping):
                for ds, values in metrics.items():
                    if isinstance(values, Mapping) and len(values) > MAX_METRICS:
                        raise ValueError(
                            f"metrics[{str(ds)[:40]!r}] has {len(values)} metrics; at most {MAX_METRICS}"
                        )
        return data

    @property
    def partial(self) -> bool:
        """A record whose evidence says it does not cover the whole suite (``--limit``, ``--dataset``)."""
        return self.evidence is not None and self.evidence.partial

    @field_validator("k")
    @classmethod
    def _k_positive(cls, k: int) -> int:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return k

    @field_validator("seeds")
    @classmethod
    def _seeds_nonempty(cls, seeds: list[int]) -> list[int]:
        if not seeds:
            raise ValueError("seeds must list at least one seed")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @field_validator("metrics")
    @classmethod
    def _metric_ranges(cls, metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        if not metrics:
            raise ValueError("metrics must contain at least one dataset")
        errors = [f"dataset {ds!r} has no metrics" for ds, values in metrics.items() if not values]
        for ds, values in metrics.items():
            errors += _range_errors(values, f"metrics[{ds!r}]")
        if errors:
            raise ValueError("\n".join(errors))
        return metrics

    @field_validator("macro")
    @classmethod
    def _macro_ranges(cls, macro: dict[str, float]) -> dict[str, float]:
        errors = _range_errors(macro, "macro")
        if errors:
            raise ValueError("\n".join(errors))
        return macro

    @model_validator(mode="after")
    def _consistent(self) -> RecordContent:
        """Cross-field checks; runs only once every field is individually valid."""
        errors: list[str] = []
        metric_sets = {ds: frozenset(values) for ds, values in self.metrics.items()}
        if len(set(metric_sets.values())) > 1:
            detail = ", ".join(f"{ds}: {sorted(ms)}" for ds, ms in sorted(metric_sets.items()))
            errors.append(f"every dataset must report the same metrics ({detail})")
        else:
            common = next(iter(metric_sets.values()))
            if set(self.macro) != common:
                errors.append(
                    f"macro must have exactly the dataset metrics: missing {sorted(common - set(self.macro))}, "
                    f"extra {sorted(set(self.macro) - common)}"
                )
            for m in sorted(common & set(self.macro)):
                mean = math.fsum(values[m] for values in self.metrics.values()) / len(self.metrics)
                if not math.isclose(self.macro[m], mean, rel_tol=1e-9, abs_tol=MACRO_TOLERANCE):
                    errors.append(
                        f"macro[{m!r}] = {self.macro[m]!r} is not the mean over datasets ({mean!r})"
                    )
        errors += self._std_errors()
        errors += self._evidence_errors()
        ds_hashed = set(self.provenance.dataset_sha256)
        if ds_hashed != set(self.metrics):
            errors.append(
                "provenance.dataset_sha256 must cover exactly the datasets in metrics: "
                f"missing {sorted(set(self.metrics) - ds_hashed)}, extra {sorted(ds_hashed - set(self.metrics))}"
            )
        if errors:
            raise ValueError("\n".join(errors))
        return self

    def _std_errors(self) -> list[str]:
        errors = []
        if self.metrics_std is not None:
            if set(self.metrics_std) != set(self.metrics):
                errors.append("metrics_std must have exactly the datasets of metrics")
            for ds, values in self.metrics_std.items():
                if set(values) != set(self.metrics.get(ds, {})):
                    errors.append(f"metrics_std[{ds!r}] must have exactly the metrics of metrics[{ds!r}]")
                errors += [
                    f"metrics_std[{ds!r}][{m!r}] = {v} is negative" for m, v in values.items() if v < 0
                ]
        if self.macro_std is not None:
            if set(self.macro_std) != set(self.macro):
                errors.append("macro_std must have exactly the metrics of macro")
            errors += [f"macro_std[{m!r}] = {v} is negative" for m, v in self.macro_std.items() if v < 0]
        return errors

    def _evidence_errors(self) -> list[str]:
        ev = self.evidence
        if ev is None:
            return []
        errors = []
        if set(ev.problems) != set(self.metrics):
            errors.append(
                f"evidence.problems must cover exactly the datasets in metrics: got {sorted(ev.problems)}"
            )
        expected = sum(ev.problems.values()) * self.k * len(self.seeds)
        if ev.n_samples != expected:
            errors.append(f"evidence.n_samples = {ev.n_samples}, but problems x k x seeds = {expected}")
        return errors


def _range_errors(values: Mapping[str, float], where: str) -> list[str]:
    """Every metric is checked by name; a name without a known range is an error, not a free pass."""
    errors = []
    for m, v in values.items():
        bounds = metric_range(m)
        if bounds is None:
            known = ", ".join([*sorted(METRIC_RANGES), "avg@N", "pass@N", "maj@N"])
            errors.append(f"{where}[{m!r}]: unknown metric name (known: {known})")
        elif bounds == (0.0, 1.0) and not 0.0 <= v <= 1.0:
            errors.append(f"{where}[{m!r}] = {v} is a fraction and must be in [0, 1]")
        elif not bounds[0] <= v:
            errors.append(f"{where}[{m!r}] = {v} must be non-negative")
        elif not v <= bounds[1]:
            errors.append(f"{where}[{m!r}] = {v} must be at most {bounds[1]:g}")
    return errors


class Signature(BaseModel):
    """An ed25519 signature of ``record_hash`` by a submitter key (see :mod:`leaderboards.signing`).

    It sits outside the hashed content (it signs the hash), and ``record_hash`` covers
    ``evidence.samples_sha256``, so one signature vouches for the record and its sample file.
    """

    model_config = _STRICT

    key_id: Annotated[
        str, AfterValidator(_pattern_check(re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}"), "key id"))
    ]
    signature: Annotated[
        str, AfterValidator(_pattern_check(re.compile(r"[0-9a-f]{128}"), "ed25519 signature"))
    ]


class LeaderboardRecord(RecordContent):
    """A validated, hashed result record. Construct with :func:`make_record` or :func:`validate_record`."""

    record_hash: Sha256
    signature: Signature | None = None

    @model_validator(mode="after")
    def _hash_matches(self) -> LeaderboardRecord:
        expected = compute_record_hash(self)
        if self.record_hash != expected:
            raise ValueError(
                f"record_hash mismatch: stored {self.record_hash}, computed {expected} "
                "(record modified after hashing, i.e. tampered)"
            )
        return self

    @property
    def short_hash(self) -> str:
        """First 12 hex digits: enough to tell records apart in file names and tables."""
        return self.record_hash[:12]


def hash_config(config: Mapping[str, Any]) -> str:
    """sha256 of a config's canonical JSON, so key order and formatting do not change the hash."""
    return sha256_bytes(canonical_json(dict(config)).encode("utf-8"))


#: Not part of the hashed content: the hash itself and the signature of the hash.
_UNHASHED = ("record_hash", "signature")
_OPTIONAL_HASHED = ("metrics_std", "macro_std", "evidence")


def compute_record_hash(record: RecordContent | Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a record's content, ``record_hash`` excluded.

    A mapping is first normalised through :class:`RecordContent`, so the hash is computed over the
    same JSON whether the record came from Python values or from a file.
    """
    if isinstance(record, Mapping):
        content = {k: v for k, v in record.items() if k not in _UNHASHED}
        record = RecordContent.model_validate(content)
    data = _drop_unset(record.model_dump(mode="json", exclude=set(_UNHASHED)))
    return sha256_bytes(canonical_json(data).encode("utf-8"))


def _drop_unset(data: dict[str, Any]) -> dict[str, Any]:
    """Optional fields added later are left out when unset, so older records keep their hash and their
    files round-trip (``evidence.protocol`` inside the evidence)."""
    for key in _OPTIONAL_HASHED:
        if data.get(key) is None:
            data.pop(key, None)
    if isinstance(data.get("evidence"), dict) and data["evidence"].get("protocol") is None:
        data["evidence"].pop("protocol", None)
    if isinstance(data.get("provenance"), dict):
        for key in ("config", "plugins"):
            if data["provenance"].get(key) is None:
                data["provenance"].pop(key, None)
    return data


def _format_errors(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "record"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "missing":
            msg = "missing required field"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field (not part of the schema)"
        # Validators report several problems at once, one per line.
        out.extend(f"{loc}: {line}" for line in msg.split("\n") if line)
    return out


def validate_record(
    data: Mapping[str, Any] | LeaderboardRecord, source: str | None = None
) -> LeaderboardRecord:
    """Validate a mapping (e.g. parsed JSON) as a :class:`LeaderboardRecord`.

    Raises :class:`RecordValidationError` listing every problem pydantic found.
    """
    if isinstance(data, LeaderboardRecord):
        data = data.model_dump(mode="json")
    if not isinstance(data, Mapping):
        raise RecordValidationError([f"record must be a JSON object, got {type(data).__name__}"], source)
    try:
        return LeaderboardRecord.model_validate(dict(data))
    except ValidationError as exc:
        raise RecordValidationError(_format_errors(exc), source) from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed in a record")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _loads(text: str | bytes) -> Any:
    """Strict record JSON: nesting depth checked before parsing (a ``[[[[...`` bomb is a one-line
    error, not a RecursionError), NaN/Infinity and duplicate keys rejected."""
    return loads_bounded(
        text,
        MAX_JSON_DEPTH,
        "record JSON",
        parse_constant=_reject_constant,
        object_pairs_hook=_no_duplicate_keys,
    )


def _too_big(size: int, source: str | None) -> RecordValidationError:
    return RecordValidationError(
        [
            f"record is {size} bytes; at most {MAX_RECORD_BYTES} are accepted (per-sample data belongs in "
            "the evidence file, not the record)"
        ],
        source,
    )


def parse_record_json(text: str | bytes, source: str | None = None) -> LeaderboardRecord:
    """Parse and validate record JSON. NaN/Infinity literals and duplicate keys are rejected:
    JSON parsers disagree on them, so they would make a record mean different things to different readers.
    Text over :data:`MAX_RECORD_BYTES` is refused before parsing.
    """
    size = len(text.encode("utf-8")) if isinstance(text, str) else len(text)
    if size > MAX_RECORD_BYTES:
        raise _too_big(size, source)
    try:
        data = _loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordValidationError([f"not valid record JSON: {exc}"], source) from None
    return validate_record(data, source)


def load_record(path: str | os.PathLike[str]) -> LeaderboardRecord:
    """Read and validate one record file (JSON only)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_RECORD_BYTES:
                raise _too_big(size, str(path))
            raw = fh.read(MAX_RECORD_BYTES + 1)  # a file growing under us is still capped
    except OSError as exc:
        raise RecordValidationError([f"cannot read file: {exc.strerror or exc}"], str(path)) from None
    return parse_record_json(raw, str(path))


#: A results file (a JSON list of records, as ``srpo bench quick`` writes) holds at most this many.
MAX_RECORDS_PER_FILE = 256


def load_records(path: str | os.PathLike[str]) -> list[LeaderboardRecord]:
    """One record file, or a results file holding a JSON list of records; each one validated.

    The size limit (:data:`MAX_RECORD_BYTES` per record) is checked on the file before it is read.
    """
    path = Path(path)
    limit = MAX_RECORD_BYTES * MAX_RECORDS_PER_FILE
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise _too_big(size, str(path))
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise RecordValidationError([f"cannot read file: {exc.strerror or exc}"], str(path)) from None
    if not raw.lstrip().startswith(b"["):
        return [parse_record_json(raw, str(path))]
    try:
        items = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordValidationError([f"not valid record JSON: {exc}"], str(path)) from None
    if len(items) > MAX_RECORDS_PER_FILE:
        raise RecordValidationError(
            [f"{len(items)} records; at most {MAX_RECORDS_PER_FILE} per file"], str(path)
        )
    out = []
    for i, item in enumerate(items):
        if len(canonical_json(item).encode("utf-8")) > MAX_RECORD_BYTES:
            raise _too_big(len(canonical_json(item).encode("utf-8")), f"{path}[{i}]")
        out.append(validate_record(item, f"{path}[{i}]"))
    return out


def dump_record_json(record: LeaderboardRecord) -> str:
    """Git-friendly JSON: sorted keys, indent 2, UTF-8, trailing newline."""
    return (
        json.dumps(record_dict(record), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    )


def record_dict(record: LeaderboardRecord) -> dict[str, Any]:
    """The record as JSON data, optional fields left out when unset (so older files round-trip)."""
    data = _drop_unset(record.model_dump(mode="json"))
    if data.get("signature") is None:
        data.pop("signature", None)
    return data


def package_version(dist: str = "srpo") -> str:
    """Installed version of ``dist`` via importlib.metadata, or ``"unknown"``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def git_commit(repo_dir: str | os.PathLike[str] | None = None) -> str:
    """``git rev-parse HEAD`` in ``repo_dir`` (default: this package's directory), else ``"unknown"``."""
    cwd = Path(repo_dir) if repo_dir is not None else Path(__file__).resolve().parent
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = proc.stdout.strip()
    return sha if proc.returncode == 0 and _GIT_RE.fullmatch(sha) else "unknown"


def _plain_int(value: Any) -> Any:
    """numpy integers -> int; anything else (bools, floats, strings) is left for strict validation to reject."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def _utc_now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def make_record(
    *,
    suite: str,
    metrics: Mapping[str, Mapping[str, float]],
    k: int,
    seeds: Sequence[int],
    algorithm: str,
    workflow: str,
    name: str | None = None,
    model_id: str | None = None,
    weights_sha256: str | None = None,
    weights_path: str | os.PathLike[str] | None = None,
    config: Mapping[str, Any] | None = None,
    config_hash: str | None = None,
    dataset_sha256: Mapping[str, str] | None = None,
    dataset_paths: Mapping[str, str | os.PathLike[str]] | None = None,
    retriever: str | None = None,
    corpus: str | None = None,
    corpus_sha256: str | None = None,
    macro: Mapping[str, float] | None = None,
    date: str | dt.datetime | dt.date | None = None,
    version: str | None = None,
    commit: str | None = None,
    repo_dir: str | os.PathLike[str] | None = None,
    metrics_std: Mapping[str, Mapping[str, float]] | None = None,
    macro_std: Mapping[str, float] | None = None,
    evidence: Mapping[str, Any] | None = None,
    plugins: Mapping[str, str] | None = None,
) -> LeaderboardRecord:
    """Build a validated, hashed record, filling what can be derived.

    * ``macro``: mean over datasets of each metric when omitted.
    * ``config_hash``: from ``config`` (canonical JSON) -- give exactly one of the two.
    * ``weights_sha256``: from ``weights_path`` when given.
    * ``dataset_sha256``: merged with file hashes of ``dataset_paths``.
    * ``version``/``commit``: :func:`package_version` / :func:`git_commit` (``"unknown"`` fallback).
    * ``date``: now, UTC, second precision. ``name``: ``"<algorithm>/<model id or weights hash>"``.
    * ``metrics_std``/``macro_std``/``evidence``: optional (see :class:`RecordContent`).
    * ``plugins``: the plugins this process loaded (:func:`srpo_common.plugins.provenance`) when omitted.

    Raises :class:`RecordValidationError` if the result is not a valid record.
    """
    if (config is None) == (config_hash is None):
        raise ValueError("give exactly one of config= or config_hash=")
    if weights_path is not None:
        computed = sha256_file(weights_path)
        if weights_sha256 is not None and weights_sha256 != computed:
            raise ValueError(f"weights_sha256 {weights_sha256} does not match the file {weights_path}")
        weights_sha256 = computed
    ds_hashes = dict(dataset_sha256 or {})
    for ds, path in (dataset_paths or {}).items():
        ds_hashes[ds] = sha256_file(path)
    metrics_plain = {str(ds): {str(m): float(v) for m, v in vals.items()} for ds, vals in metrics.items()}
    if macro is None:
        names = sorted({m for vals in metrics_plain.values() for m in vals})
        macro = {
            m: math.fsum(vals[m] for vals in metrics_plain.values() if m in vals) / max(len(metrics_plain), 1)
            for m in names
        }
    if isinstance(date, dt.datetime | dt.date):
        date = date.isoformat()
    if name is None:
        name = f"{algorithm}/{model_id if model_id is not None else 'weights:' + (weights_sha256 or '')[:12]}"
    content: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "suite": suite,
        "name": name,
        "k": _plain_int(k),
        "seeds": [_plain_int(s) for s in seeds],
        "metrics": metrics_plain,
        "macro": {str(m): float(v) for m, v in macro.items()},
        "provenance": {
            "package_version": version if version is not None else package_version(),
            "git_commit": commit if commit is not None else git_commit(repo_dir),
            "model_id": model_id,
            "weights_sha256": weights_sha256,
            "algorithm": algorithm,
            "config_hash": config_hash if config_hash is not None else hash_config(config or {}),
            # the config as plain JSON data (tuples as lists), beside its hash
            "config": json.loads(canonical_json(dict(config))) if config is not None else None,
            "workflow": workflow,
            "dataset_sha256": ds_hashes,
            "retriever": retriever,
            "corpus": corpus,
            "corpus_sha256": corpus_sha256,
            "date": date if date is not None else _utc_now(),
            "plugins": dict(plugins if plugins is not None else plugin_provenance()) or None,
        },
    }
    if metrics_std is not None:
        content["metrics_std"] = {
            str(d): {str(m): float(v) for m, v in vals.items()} for d, vals in metrics_std.items()
        }
    if macro_std is not None:
        content["macro_std"] = {str(m): float(v) for m, v in macro_std.items()}
    if evidence is not None:
        content["evidence"] = {
            **dict(evidence),
            "problems": {str(d): _plain_int(n) for d, n in evidence["problems"].items()},
            "suite_problems": {str(d): _plain_int(n) for d, n in evidence["suite_problems"].items()},
        }
    try:
        record_hash = compute_record_hash(content)
    except ValidationError as exc:
        raise RecordValidationError(_format_errors(exc)) from None
    return validate_record({**content, "record_hash": record_hash})
