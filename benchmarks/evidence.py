"""Per-sample evidence for leaderboard records: writing it, regrading it, reproducing it.

The file format and the generic checks live in :mod:`leaderboards.evidence` (which may not import
env or benchmark code); this module is the benchmark side:

* :func:`record_evidence` turns one :class:`~benchmarks.evaluate.EvalResult` per seed into the
  evidence file (written under ``out_dir/samples/``) and the record fields that point to it
  (``evidence``, ``metrics_std``, ``macro_std``);
* :class:`SuiteGrader` implements :class:`leaderboards.evidence.SampleGrader` against the registered
  suites: the bundled/generated problems, their hashes, and the env's own graders;
* :func:`reproduce` re-generates a random subset of a record's samples from its recorded seeds with
  a model directory whose weights hash matches, and compares them with the recorded samples.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutCollector
from benchmarks.evaluate import EvalResult, _dataset_seed, sample_records
from benchmarks.suites import SUITES, Suite, SuiteDataset, get_suite
from leaderboards.evidence import SampleSet, write_samples
from leaderboards.schema import LeaderboardRecord
from srpo_common import weights_sha256
from srpo_envs.grading import grade
from srpo_envs.qa_metrics import exact_match

__all__ = [
    "BUNDLED_DATASET_SHA256",
    "ReproduceError",
    "ReproduceReport",
    "SuiteGrader",
    "record_evidence",
    "reproduce",
]

#: The registered sha256 of every bundled dataset file (generated datasets hash their task list
#: instead). A record's hash for a bundled dataset must be this one, and so must the installed file:
#: a changed file is a new dataset, registered here on purpose, not picked up silently.
BUNDLED_DATASET_SHA256: dict[str, str] = {
    "math500": "37e72b60f73aae0297e59ce5c7b2112d9a0bdce7340e8dc90fabc14a8f5c3f49",
    "aime24": "d30d9582b8de0822d40996895e3cb6ba61a583ab301784712261798fc4046dbc",
    "aime25": "396dfe34b2d842135bbb707dda3bfa0df9d5d480d9ff23fc354802bc82fb8dbb",
    "amc23": "0645e3dc69e8f77d5c7d2d81fea5063485c91df6a40d996397b17f8d0663a526",
    "minerva": "322d196cc95709783521c8dd3f334e81aa1108287fc224627b89f92d0568b64b",
    "olympiadbench": "9e110dcbfdeb9df44da1ff69828577e733bdef4ec66495152d3134b867854e5a",
    "nq": "2f33d25d08be522cc2e9a09070d9c5505b67b495fe5d7633618276789c3bda1d",
    "triviaqa": "fde76cbbe1216c3697e1b505b98ade928d9e197ec66c4eb25257a75d0be98ef1",
    "popqa": "801815aa4c9a9852a71be52fb40500a0f5e50199e1969ac2cf35f928538bb45d",
    "hotpotqa": "3e71f50824e1348f6214e845dffb1976d342a5682b8c0d02cb7277f73b1e0280",
    "2wikimultihopqa": "3f1f04376879ebdf57ebe46f5f7e422d6a68dc32b54373a64c6af39a66a3c894",
    "musique": "d76f3903869bf0119deabbb541b86811c75ea10c288167bca0ff5be01c6a3c15",
    "bamboogle": "f32bf364b3a33b87c503cdc5249bdd3898e2ddca305a429deb2bc8e771ac4460",
}
#: Fields of a sample compared by :func:`reproduce` (what the generation decides).
REPRODUCED_FIELDS = ("answer", "correct", "reward", "team_tokens", "tool_calls")


def eval_header(result: EvalResult) -> dict[str, Any]:
    """What re-running a sample needs, beyond its seed: suite, workflow, k, sampling, env kwargs, limit,
    chunk size (samples are regenerated chunk by chunk, the batches they were generated in)."""
    cfg = result.run_info["config"]
    return {
        "suite": result.suite,
        "workflow": result.workflow,
        "k": result.k,
        "datasets": [d["name"] for d in cfg["datasets"]],
        "limit": cfg["limit"],
        "sampling": cfg["sampling"],
        "env_kwargs": cfg["env_kwargs"],
        "chunk_size": cfg["chunk_size"],
        # how samples were generated (``bench eval --backend/--workers``): in-process HF unless noted
        "rollout": result.run_info.get("rollout") or {"backend": "hf", "workers": 0},
    }


def _sample_lines(result: EvalResult) -> list[dict[str, Any]]:
    seed = int(result.run_info["config"]["seed"])
    hashes = result.run_info["dataset_sha256"]
    order = {name: i for i, name in enumerate(hashes)}
    lines = []
    for row in result.samples.itertuples(index=False):
        answer = getattr(row, "answer", None)
        lines.append(
            {
                "seed": seed,
                "dataset": str(row.dataset),
                "dataset_sha256": hashes[str(row.dataset)],
                "task_id": str(row.problem_id),
                "task_index": int(row.task_index),
                "sample_idx": int(row.sample_idx),
                "answer": None if answer is None or answer != answer else str(answer),  # NaN from pandas
                "correct": bool(row.correct),
                "reward": float(row.reward),
                "team_tokens": int(row.team_tokens),
                "tool_calls": int(row.tool_calls),
            }
        )
    lines.sort(key=lambda s: (order[s["dataset"]], s["task_index"], s["sample_idx"]))
    return lines


def suite_problems(suite: str | Suite, protocol: str | None = None) -> dict[str, int]:
    """Problems per dataset of the *registered* suite of that name (the whole suite, not a selection),
    or of its registered ``protocol`` (the first N problems of every dataset; ``KeyError`` if the suite
    has no such protocol)."""
    full = _registered(suite)
    whole = {ds.name: len(ds.load_tasks()) for ds in full.datasets}
    return whole if protocol is None else full.protocol_problems(protocol, whole)


def _registered(suite: str | Suite) -> Suite:
    name = suite if isinstance(suite, str) else suite.name
    return SUITES[name] if name in SUITES else get_suite(suite)


def record_evidence(results: Sequence[EvalResult], out_dir: str | Path) -> dict[str, Any]:
    """Write the evidence file of one record made of ``results`` (one per seed, same eval otherwise)
    under ``out_dir/samples/`` and return the ``make_record`` keyword arguments that come from it:
    ``seeds``, ``metrics`` (mean over seeds), ``metrics_std``, ``macro_std`` and ``evidence``.
    """
    if not results:
        raise ValueError("record_evidence needs at least one EvalResult")
    header = eval_header(results[0])
    seeds = [int(r.run_info["config"]["seed"]) for r in results]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"one result per seed expected, got seeds {seeds}")
    for r in results[1:]:
        if eval_header(r) != header or r.run_info["dataset_sha256"] != results[0].run_info["dataset_sha256"]:
            raise ValueError("results of one record must differ only in their seed")
    samples = [line for r in results for line in _sample_lines(r)]
    _, fields = write_samples(out_dir, header, samples)
    per_seed = [r.record_metrics() for r in results]
    datasets = list(per_seed[0])
    names = list(per_seed[0][datasets[0]])

    def std(values: Sequence[float]) -> float:
        return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0

    metrics = {d: {m: float(np.mean([p[d][m] for p in per_seed])) for m in names} for d in datasets}
    metrics_std = {d: {m: std([p[d][m] for p in per_seed]) for m in names} for d in datasets}
    macro_std = {m: std([float(np.mean([p[d][m] for d in datasets])) for p in per_seed]) for m in names}
    problems = {d: int(results[0].table.loc[d, "n_problems"]) for d in datasets}
    # a run of a suite's registered protocol (e.g. the main job's first 32 problems per dataset) is a
    # full record of that protocol; any other subset is partial against the whole suite
    suite = _registered(results[0].suite)
    whole = suite_problems(suite)
    protocol = suite.protocol_of(problems, whole)
    evidence = {**fields, "problems": problems, "suite_problems": whole}
    if protocol is not None:
        evidence.update(protocol=protocol, suite_problems=suite.protocol_problems(protocol, whole))
    return {
        "seeds": seeds,
        "metrics": metrics,
        "metrics_std": metrics_std,
        "macro_std": macro_std,
        "evidence": evidence,
    }


# ------------------------------------------------------------------------------------------ grading


class SuiteGrader:
    """:class:`leaderboards.evidence.SampleGrader` over the registered suites (problems cached)."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, str], list[Any]] = {}
        # k samples x seeds often repeat an answer: grade each distinct one once (math-verify is slow)
        self._graded: dict[tuple[str, str, int, str | None], tuple[bool, float]] = {}

    def _dataset(self, suite: str, dataset: str) -> SuiteDataset:
        for ds in SUITES[suite].datasets:
            if ds.name == dataset:
                return ds
        raise KeyError(f"dataset {dataset!r} is not part of suite {suite!r}")

    def _problems(self, suite: str, dataset: str) -> list[Any]:
        key = (suite, dataset)
        if key not in self._tasks:
            self._tasks[key] = self._dataset(suite, dataset).load_tasks()
        return self._tasks[key]

    def question(self, suite: str, dataset: str, task_index: int) -> tuple[str, str]:
        """(question, gold answer) of problem ``task_index`` of ``dataset``: what an exported instance
        line shows as its input and reference (:mod:`leaderboards.export`); a search task's gold is its
        first accepted answer."""
        task = self._problems(suite, dataset)[task_index]
        if hasattr(task, "problem"):
            return str(task.problem), str(task.answer)
        return str(task.question), str(task.answers[0]) if task.answers else ""

    def suite_problems(self, suite: str, protocol: str | None = None) -> dict[str, int]:
        whole = {ds.name: len(self._problems(suite, ds.name)) for ds in SUITES[suite].datasets}
        return whole if protocol is None else SUITES[suite].protocol_problems(protocol, whole)

    def check_dataset(self, suite: str, dataset: str, sha256: str, task_ids: Sequence[str]) -> list[str]:
        tasks = self._problems(suite, dataset)[: len(task_ids)]
        ids = [str(t.id) for t in tasks]
        if ids != list(task_ids):
            bad = next(i for i, (a, b) in enumerate(zip([*ids, None], task_ids, strict=False)) if a != b)
            return [
                f"{dataset}: problem {bad} is {task_ids[bad]!r} in the samples, {ids[bad] if bad < len(ids) else None!r} in the registered dataset"
            ]
        ds = self._dataset(suite, dataset)
        expected = ds.dataset_sha256(tasks)
        if not ds.generated:
            registered = BUNDLED_DATASET_SHA256.get(ds.dataset)
            if registered is None:
                return [f"{dataset}: {ds.dataset!r} has no registered sha256 (BUNDLED_DATASET_SHA256)"]
            if expected != registered:
                return [
                    f"{dataset}: the installed file hashes to {expected}, not its registered {registered}"
                ]
        if sha256 != expected:
            return [f"{dataset}: dataset_sha256 {sha256} is not the registered dataset's {expected}"]
        return []

    def member_cost(self, suite: str, dataset: str) -> float:
        """The registered dataset's per-member cost (``env_kwargs["member_cost"]``; 0 when none)."""
        return float(self._dataset(suite, dataset).env_kwargs.get("member_cost") or 0.0)

    def grade(self, suite: str, dataset: str, task_index: int, answer: str | None) -> tuple[bool, float]:
        """Graded exactly as the env grades its final answer (math: ``grade``; search: exact match)."""
        key = (suite, dataset, task_index, answer)
        if key not in self._graded:
            self._graded[key] = self._grade(suite, dataset, task_index, answer)
        return self._graded[key]

    def _grade(self, suite: str, dataset: str, task_index: int, answer: str | None) -> tuple[bool, float]:
        task = self._problems(suite, dataset)[task_index]
        if self._dataset(suite, dataset).family == "math":
            correct = grade(answer, task.answer) if answer is not None else False
            return bool(correct), 1.0 if correct else 0.0

        em = exact_match(answer, list(task.answers)) if answer is not None else 0.0
        return bool(em), float(em)


# ------------------------------------------------------------------------------------------ reproduce


class ReproduceError(ValueError):
    """The record cannot be reproduced with what was given (wrong weights, unknown suite...)."""


@dataclass
class ReproduceReport:
    """Outcome of :func:`reproduce`: ``compared`` samples, of which ``mismatches`` differ."""

    chosen: list[tuple[int, str, int]]
    compared: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.compared > 0 and not self.mismatches


def _sampling(spec: Mapping[str, Any]) -> Any:
    if "temperature" in spec or "max_new_tokens" in spec:
        return SamplingParams(**spec)
    return {role: SamplingParams(**params) for role, params in spec.items()}


def reproduce(
    record: LeaderboardRecord,
    sample_set: SampleSet,
    model_dir: str | Path,
    *,
    n: int = 4,
    rng_seed: int = 0,
    device: str | None = None,
    log: Callable[[str], None] | None = None,
    chunks: Sequence[tuple[int, str, int]] | None = None,
) -> ReproduceReport:
    """Re-generate ``n`` randomly chosen (seed, dataset, problem) groups of ``record`` with the model in
    ``model_dir`` and compare every regenerated sample with the recorded one.

    ``chunks`` (``(seed, dataset, first problem)``, as :func:`leaderboards.reproduction.plan_reproduction`
    chooses them with a seed drawn at verification time) replaces the choice by ``n``/``rng_seed``.

    Each chosen problem is regenerated with the rest of its chunk (the batch it was generated in), so
    padding and batch composition are as in the original run: on CPU the samples must match exactly.
    Raises :class:`ReproduceError` when the weights hash is not the record's.
    """
    say = log or (lambda s: None)
    header = sample_set.header
    want = record.provenance.weights_sha256
    if want is None:
        raise ReproduceError("the record names no weights_sha256: nothing to reproduce against")
    have = weights_sha256(model_dir)
    if have != want:
        raise ReproduceError(f"{model_dir}: weights sha256 {have} is not the record's {want}")
    rollout = header.get("rollout") or {"backend": "hf", "workers": 0}
    if rollout.get("backend", "hf") != "hf":
        raise ReproduceError(
            f"samples were generated with backend {rollout['backend']!r}; reproduce re-runs HF"
        )
    if rollout.get("workers"):
        say("note: samples came from Ray workers; their batches may differ from a chunk re-run in-process")
    for key, value in header["env_kwargs"].items():
        if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
            raise ReproduceError(
                f"env kwarg {key!r} was an object ({value}); it cannot be rebuilt from the record"
            )
    from agents.hf import HFPolicy

    suite = get_suite(header["suite"]).select(header["datasets"])
    by_name = {ds.name: ds for ds in suite.datasets}
    recorded = {(s["seed"], s["dataset"], s["task_index"], s["sample_idx"]): s for s in sample_set.samples}
    groups = sorted({(s["seed"], s["dataset"], s["task_index"]) for s in sample_set.samples})
    chunk_size, k = int(header["chunk_size"]), int(header["k"])
    if chunks is None:
        chosen = random.Random(rng_seed).sample(groups, min(n, len(groups)))
        chunks = sorted({(seed, ds, (t // chunk_size) * chunk_size) for seed, ds, t in chosen})
    else:
        wanted = {(int(a), str(b), int(c)) for a, b, c in chunks}
        chunks = sorted(wanted)
        chosen = [g for g in groups if (g[0], g[1], (g[2] // chunk_size) * chunk_size) in wanted]
    report = ReproduceReport(chosen=sorted(chosen))
    policies = PolicyMap.shared(HFPolicy(str(model_dir), device=device))
    sampling = _sampling(header["sampling"])
    tasks_of: dict[str, list[Any]] = {}
    for seed, name, start in chunks:
        ds = by_name[name]
        tasks = tasks_of.setdefault(name, ds.load_tasks(header["limit"]))
        indices = list(range(start, min(start + chunk_size, len(tasks))))
        plan = [(t, g) for t in indices for g in range(k)]
        collector = RolloutCollector(
            ds.env_factory(header["workflow"], tasks, header["env_kwargs"]), policies, sampling
        )
        batch = collector.collect(indices, group_size=k, seed=_dataset_seed(seed, name))
        for new in sample_records(name, batch, plan, tasks):
            old = recorded.get((seed, name, new["task_index"], new["sample_idx"]))
            report.compared += 1
            if old is None:
                report.mismatches.append(
                    f"{name} problem {new['task_index']} sample {new['sample_idx']}: not recorded"
                )
                continue
            diff = [
                f"{f}: recorded {old[f]!r}, regenerated {new[f]!r}"
                for f in REPRODUCED_FIELDS
                if old[f] != new[f]
            ]
            if diff:
                report.mismatches.append(
                    f"seed {seed} {name} problem {new['task_index']} sample {new['sample_idx']}: "
                    + "; ".join(diff)
                )
        say(f"seed {seed} {name} problems {indices[0]}..{indices[-1]}: regenerated {len(plan)} samples")
    return report
