"""A validated record in the formats others read: Every Eval Ever, the Hub's ``.eval_results``, lm-eval.

What maps to what (``docs/publishing.md`` has the table):

* **Every Eval Ever** (EEE 0.3.0, ``every_eval_ever/schemas/eval.schema.json``): one aggregate JSON
  per record at the datastore path ``data/<suite>/<developer>/<model>/<uuid>.json`` and, when the record
  has per-sample evidence, its ``<uuid>_samples.jsonl`` beside it (instance-level schema). Each dataset
  x metric of the record is one ``evaluation_results`` entry (plus the suite's macro mean), its
  ``score_details.uncertainty`` a 95% percentile bootstrap interval over the problems (the samples'
  problems resampled, :data:`BOOTSTRAP_RESAMPLES` times, seed 0) with the standard deviation over the
  training seeds; the algorithm, the record hash and the team (agent -> model) go in its details. The
  uuid is derived from the record hash, so exporting twice writes the same files.
* **Hugging Face Hub** ``.eval_results/<suite>.yaml``: one entry per dataset (``task_id``) with the
  record's headline metric, built and written with ``huggingface_hub``'s own ``EvalResultEntry``;
  ``source.url`` names the record.
* **lm-evaluation-harness** ``results_<date>.json``: ``results`` per dataset (``<metric>,none`` and
  ``<metric>_stderr,none`` keys), ``groups`` for the suite's macro mean, ``versions``, ``n-shot``,
  ``higher_is_better`` and ``config``, as ``lm_eval`` writes them.

What does not fit: an episode of a multi-agent team is several agents' turns, but the record's
evidence keeps the team's final answer, its reward and token count per sample, not the transcript;
each instance line is therefore a ``single_turn`` sample whose output is the team's answer.
The exported numbers are the record's own (a round trip returns them exactly); only the intervals are
computed here, from the evidence.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from srpo_common import atomic_write_text, canonical_json, sha256_bytes

from .evidence import SampleSet, pass_at_k
from .schema import LeaderboardRecord, is_fraction_metric

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "EEE_SCHEMA_VERSION",
    "FORMATS",
    "ExportError",
    "bootstrap_interval",
    "eee_paths",
    "export_record",
    "to_eee",
    "to_hf_entries",
    "to_lm_eval",
]

#: The formats ``srpo leaderboard export --format`` writes.
FORMATS = ("eee", "hf", "lm-eval")
#: The Every Eval Ever schema version the aggregate and instance files follow.
EEE_SCHEMA_VERSION = "0.3.0"
#: Resamples of the percentile bootstrap over problems behind every exported interval.
BOOTSTRAP_RESAMPLES = 2000

#: ``question_of(dataset, task_index) -> (question, gold)``: what the instance lines show as input and
#: reference (``srpo_cli`` wires the registered datasets in; without it they name the task).
QuestionLookup = Callable[[str, int], tuple[str, str]]


class ExportError(ValueError):
    """A record that cannot be exported as asked (no samples for an instance file, a bad option)."""


# ----------------------------------------------------------------------------------------- intervals
def _per_problem(samples: Sequence[Mapping[str, Any]], dataset: str) -> tuple[list[int], dict[int, list[bool]]]:
    by_task: dict[int, list[bool]] = {}
    for s in samples:
        if s["dataset"] == dataset:
            by_task.setdefault(int(s["task_index"]), []).append(bool(s["correct"]))
    return sorted(by_task), by_task


def bootstrap_interval(
    samples: Sequence[Mapping[str, Any]], dataset: str, metric: str, k: int, level: float = 0.95
) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of ``metric`` (``avg@<k>``/``accuracy`` or ``pass@<j>``) on
    ``dataset``, resampling its problems (each problem's samples over every seed pooled); None for a
    metric this cannot resample (token counts, utility) or a dataset without samples."""
    tasks, by_task = _per_problem(samples, dataset)
    if not tasks:
        return None
    if metric in (f"avg@{k}", "avg@k", "accuracy", "acc"):
        values = np.array([sum(by_task[t]) / len(by_task[t]) for t in tasks])
    elif metric.startswith("pass@") and metric[5:].isdigit():
        j = int(metric[5:])
        if any(len(by_task[t]) < j for t in tasks):
            return None
        values = np.array([pass_at_k(len(by_task[t]), sum(by_task[t]), j) for t in tasks])
    else:
        return None
    rng = np.random.default_rng(0)
    means = values[rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


# --------------------------------------------------------------------------------------------- common
def _model(record: LeaderboardRecord) -> tuple[str, str]:
    """(developer, model) of the record: a hub id ``owner/name`` splits; a local model is ``local/<name>``
    (by its id, else its weights hash)."""
    mid = record.provenance.model_id
    if mid and "/" in mid:
        owner, name = mid.split("/", 1)
        return owner, name.replace("/", "--")
    return "local", mid or f"weights-{(record.provenance.weights_sha256 or '')[:12]}"


def _team(record: LeaderboardRecord) -> dict[str, str]:
    """The agent -> model map: every role played by the record's one model (``srpo bench eval`` shares it)."""
    developer, model = _model(record)
    return {"*": f"{developer}/{model}"}


def _timestamp(record: LeaderboardRecord) -> tuple[str, str]:
    """(ISO datetime, Unix epoch seconds) of the record's date, UTC."""
    when = dt.datetime.fromisoformat(record.provenance.date.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.isoformat(), str(int(when.timestamp()))


def _metric_items(record: LeaderboardRecord) -> list[tuple[str | None, str, float]]:
    """(dataset or None for the macro mean, metric, value) of the record's fraction metrics, in order."""
    items: list[tuple[str | None, str, float]] = []
    for ds in sorted(record.metrics):
        items += [(ds, m, v) for m, v in sorted(record.metrics[ds].items()) if is_fraction_metric(m)]
    items += [(None, m, v) for m, v in sorted(record.macro.items()) if is_fraction_metric(m)]
    return items


def _headline(record: LeaderboardRecord) -> str:
    name = f"avg@{record.k}"
    return name if name in record.macro else sorted(m for m in record.macro if is_fraction_metric(m))[0]


# ------------------------------------------------------------------------------------- Every Eval Ever
def eee_paths(record: LeaderboardRecord) -> tuple[str, str]:
    """The datastore paths (relative to the export root) of the aggregate file and its samples file."""
    developer, model = _model(record)
    eid = uuid.UUID(record.record_hash[:32], version=4)
    base = f"data/{record.suite}/{developer}/{model}/{eid}"
    return f"{base}.json", f"{base}_samples.jsonl"


def _uncertainty(
    record: LeaderboardRecord, samples: SampleSet | None, ds: str | None, metric: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    std = (record.macro_std or {}).get(metric) if ds is None else ((record.metrics_std or {}).get(ds) or {}).get(metric)
    if std is not None:
        out["standard_deviation"] = float(std)
    if samples is not None:
        rows = samples.samples
        datasets = [ds] if ds is not None else sorted(record.metrics)
        intervals = [bootstrap_interval(rows, d, metric, record.k) for d in datasets]
        if all(iv is not None for iv in intervals):
            lo = math.fsum(iv[0] for iv in intervals) / len(intervals)  # type: ignore[index]
            hi = math.fsum(iv[1] for iv in intervals) / len(intervals)  # type: ignore[index]
            out["confidence_interval"] = {
                "lower": lo, "upper": hi, "confidence_level": 0.95,
                "method": "percentile bootstrap over problems" + (" (mean of the datasets' bounds)" if ds is None else ""),
            }  # fmt: skip
            out["num_bootstrap_samples"] = BOOTSTRAP_RESAMPLES
        out["num_samples"] = sum(1 for s in rows if ds is None or s["dataset"] == ds)
    return out


def to_eee(
    record: LeaderboardRecord,
    samples: SampleSet | None,
    *,
    organization: str = "srpo",
    relationship: str = "first_party",
    verified: bool = True,
    question_of: QuestionLookup | None = None,
) -> tuple[dict[str, Any], str]:
    """The EEE aggregate object and its instance file's JSONL text (empty without ``samples``)."""
    developer, model = _model(record)
    iso, epoch = _timestamp(record)
    _, samples_path = eee_paths(record)
    evaluation_id = f"{record.suite}/{developer}/{model}/{epoch}"
    prov = record.provenance
    details = {
        "algorithm": prov.algorithm,
        "record_hash": record.record_hash,
        "team": canonical_json(_team(record)),
        "workflow": prov.workflow,
        "seeds": canonical_json(list(record.seeds)),
        "verified": "true" if verified else "false",
        "partial": "true" if record.evidence is not None and record.evidence.partial else "false",
    }
    header = samples.header if samples is not None else {}
    sampling = header.get("sampling") if isinstance(header.get("sampling"), Mapping) else {}
    generation_args: dict[str, Any] = {
        k: sampling[k] for k in ("temperature", "top_p") if isinstance(sampling.get(k), int | float)
    }
    if isinstance(sampling.get("max_new_tokens"), int):
        generation_args["max_tokens"] = sampling["max_new_tokens"]
    results = []
    for ds, metric, value in _metric_items(record):
        name = f"{record.suite}/{ds or 'macro'}/{metric}"
        source: dict[str, Any] = {
            "dataset_name": ds or record.suite,
            "source_type": "other",
            "additional_details": {
                "dataset_sha256": prov.dataset_sha256.get(ds, "") if ds else canonical_json(prov.dataset_sha256),
            },
        }
        score: dict[str, Any] = {"score": value, "details": details}
        uncertainty = _uncertainty(record, samples, ds, metric)
        if uncertainty:
            score["uncertainty"] = uncertainty
        results.append(
            {
                "evaluation_result_id": name,
                "evaluation_name": name,
                "source_data": source,
                "evaluation_timestamp": iso,
                "metric_config": {
                    "evaluation_description": f"{metric} of the team on {ds or 'every dataset (macro mean)'}",
                    "metric_id": metric, "metric_name": metric, "lower_is_better": False,
                    "score_type": "continuous", "min_score": 0.0, "max_score": 1.0,
                    "metric_parameters": {"k": record.k},
                },
                "score_details": score,
                "generation_config": {
                    "generation_args": generation_args,
                    "additional_details": {"k": str(record.k), "workflow": prov.workflow},
                },
            }
        )  # fmt: skip
    aggregate: dict[str, Any] = {
        "schema_version": EEE_SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "evaluation_timestamp": iso,
        "retrieved_timestamp": epoch,
        "source_metadata": {
            "source_name": f"srpo leaderboard record {record.name}",
            "source_type": "evaluation_run",
            "source_organization_name": organization,
            "evaluator_relationship": relationship,
            "additional_details": {"record_hash": record.record_hash, "git_commit": prov.git_commit},
        },
        "eval_library": {"name": "srpo", "version": prov.package_version, "additional_details": details},
        "model_info": {
            "name": model,
            "id": f"{developer}/{model}",
            "developer": developer,
            "inference_platform": "local",
            "additional_details": {
                "deployment_type": "self_deployed",
                "model_availability": "unknown",
                **({"weights_sha256": prov.weights_sha256} if prov.weights_sha256 else {}),
            },
        },
        "evaluation_results": results,
    }
    lines = _eee_instances(record, samples, evaluation_id, f"{developer}/{model}", question_of)
    body = "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)
    if lines:
        aggregate["detailed_evaluation_results"] = {
            "format": "jsonl", "file_path": samples_path, "hash_algorithm": "sha256",
            "checksum": sha256_bytes(body.encode("utf-8")), "total_rows": len(lines),
        }  # fmt: skip
    return aggregate, body


def _eee_instances(
    record: LeaderboardRecord,
    samples: SampleSet | None,
    evaluation_id: str,
    model_id: str,
    question_of: QuestionLookup | None,
) -> list[dict[str, Any]]:
    if samples is None:
        return []
    metric = f"avg@{record.k}"
    lines = []
    for s in samples.samples:
        ds, answer = str(s["dataset"]), "" if s["answer"] is None else str(s["answer"])
        question, gold = question_of(ds, int(s["task_index"])) if question_of else (f"{ds} task {s['task_id']}", "")
        lines.append(
            {
                "schema_version": EEE_SCHEMA_VERSION,
                "evaluation_id": evaluation_id,
                "model_id": model_id,
                "evaluation_name": f"{record.suite}/{ds}/{metric}",
                "evaluation_result_id": f"{record.suite}/{ds}/{metric}",
                "sample_id": f"{ds}/{s['task_id']}/seed{s['seed']}/sample{s['sample_idx']}",
                "interaction_type": "single_turn",
                "input": {"raw": question, "reference": [gold] if gold else []},
                "output": {"raw": [answer]},
                "messages": None,
                "answer_attribution": [
                    {"turn_idx": 0, "source": "output.raw", "extracted_value": answer,
                     "extraction_method": "custom", "is_terminal": True}
                ],
                "evaluation": {
                    "score": float(s["reward"]), "is_correct": bool(s["correct"]),
                    "num_turns": None, "tool_calls_count": int(s["tool_calls"]),
                },
                "metadata": {
                    "seed": s["seed"], "task_index": s["task_index"], "sample_idx": s["sample_idx"],
                    "team_tokens": s["team_tokens"], "dataset_sha256": s["dataset_sha256"],
                },
            }
        )  # fmt: skip
    return lines


# -------------------------------------------------------------------------------- Hub .eval_results
def to_hf_entries(
    record: LeaderboardRecord, *, dataset_id: str | None = None, record_url: str | None = None, verified: bool = True
) -> list[Any]:
    """``huggingface_hub.EvalResultEntry`` per dataset with the record's headline metric (``avg@k``).
    ``dataset_id``: the Hub benchmark the suite is published as (default ``srpo/<suite>``)."""
    from huggingface_hub import EvalResultEntry  # the Hub's own model of the format (an optional door)

    metric = _headline(record)
    notes = f"{metric}, {record.provenance.algorithm}, seeds {','.join(map(str, record.seeds))}, record {record.record_hash[:12]}"
    if record.evidence is not None and record.evidence.partial:
        notes += f", partial: {sum(record.evidence.problems.values())} of {sum(record.evidence.suite_problems.values())} problems"
    if not verified:
        notes += ", UNVERIFIED (evidence not checked)"
    iso, _ = _timestamp(record)
    return [
        EvalResultEntry(
            dataset_id=dataset_id or f"srpo/{record.suite}",
            task_id=ds,
            value=record.metrics[ds][metric],
            date=iso,
            source_url=record_url,
            source_name=f"srpo record {record.name}" if record_url else None,
            notes=notes,
        )
        for ds in sorted(record.metrics)
        if metric in record.metrics[ds]
    ]


# ------------------------------------------------------------------------------------------ lm-eval
def to_lm_eval(record: LeaderboardRecord, samples: SampleSet | None, *, verified: bool = True) -> dict[str, Any]:
    """lm-eval's results JSON: per-dataset task entries, the suite as a group of them (macro mean)."""
    results: dict[str, dict[str, Any]] = {}
    for ds in sorted(record.metrics):
        task = f"{record.suite}_{ds}"
        entry: dict[str, Any] = {"alias": ds}
        for m, v in sorted(record.metrics[ds].items()):
            if not is_fraction_metric(m):
                continue
            entry[f"{m},none"] = v
            std = ((record.metrics_std or {}).get(ds) or {}).get(m)
            entry[f"{m}_stderr,none"] = std / math.sqrt(len(record.seeds)) if std is not None else "N/A"
        results[task] = entry
    group = {"alias": record.suite, **{f"{m},none": v for m, v in sorted(record.macro.items()) if is_fraction_metric(m)}}
    tasks = sorted(results)
    iso, epoch = _timestamp(record)
    return {
        "results": results,
        "groups": {record.suite: group},
        "group_subtasks": {record.suite: tasks},
        "versions": {**{t: 1 for t in tasks}, record.suite: 1},
        "n-shot": {t: 0 for t in tasks},
        "higher_is_better": {
            t: {m.removesuffix(",none"): True for m in entry if m.endswith(",none") and "_stderr" not in m}
            for t, entry in {**results, record.suite: group}.items()
        },
        "n-samples": {
            t: {"original": record.evidence.suite_problems.get(t.removeprefix(f"{record.suite}_"), 0) if record.evidence else 0,
                "effective": record.evidence.problems.get(t.removeprefix(f"{record.suite}_"), 0) if record.evidence else 0}
            for t in tasks
        },
        "config": {
            "model": "srpo", "model_args": _team(record)["*"], "batch_size": None,
            "algorithm": record.provenance.algorithm, "k": record.k, "seeds": list(record.seeds),
            "record_hash": record.record_hash, "verified": verified,
        },
        "git_hash": record.provenance.git_commit[:7],
        "date": float(epoch),
        "model_name": _team(record)["*"],
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ writing
def export_record(
    record: LeaderboardRecord,
    fmt: str,
    out: str | Path,
    samples: SampleSet | None = None,
    *,
    verified: bool = True,
    record_url: str | None = None,
    dataset_id: str | None = None,
    organization: str = "srpo",
    relationship: str = "first_party",
    question_of: QuestionLookup | None = None,
) -> list[Path]:
    """Write ``record`` in format ``fmt`` under ``out`` (atomic writes); returns the files written."""
    out = Path(out)
    if fmt == "eee":
        aggregate, body = to_eee(
            record, samples, organization=organization, relationship=relationship, verified=verified,
            question_of=question_of,
        )  # fmt: skip
        agg_path, samples_rel = eee_paths(record)
        written = [atomic_write_text(out / agg_path, json.dumps(aggregate, indent=2, sort_keys=True) + "\n")]
        if body:
            written.append(atomic_write_text(out / samples_rel, body))
        return written
    if fmt == "hf":
        import yaml
        from huggingface_hub import eval_result_entries_to_yaml

        entries = to_hf_entries(record, dataset_id=dataset_id, record_url=record_url, verified=verified)
        text = yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False, allow_unicode=True)
        return [atomic_write_text(out / ".eval_results" / f"{record.suite}.yaml", text)]
    if fmt == "lm-eval":
        data = to_lm_eval(record, samples, verified=verified)
        stamp = _timestamp(record)[0].replace(":", "-").split("+")[0]
        return [atomic_write_text(out / f"results_{stamp}.json", json.dumps(data, indent=2, sort_keys=True) + "\n")]
    raise ExportError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
