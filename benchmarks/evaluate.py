"""The eval runner: k team attempts per problem on every dataset of a suite, cached and resumable.

``evaluate`` rolls out each dataset with :class:`agents.rollout.RolloutCollector` (``group_size=k``)
in chunks of ``chunk_size`` problems, turns every episode into one per-sample record (the columns
:mod:`benchmarks.metrics` expects, plus reward, Ks and turns) and aggregates them into Avg@k /
pass@k / cost tables.

Caching and resume
------------------
With ``cache_dir`` every finished chunk is written atomically as one JSONL file under
``<cache_dir>/<run key>/<dataset>/``. The run key is the sha256 of everything that changes a
sample: suite datasets, workflow, k, sampling, seed, env kwargs, chunk size and the identity of the
policies (class, ``policy_version``, model path, plus a caller ``cache_key`` such as a weights
hash). The chunk file name also carries a hash of the chunk's problems (id, text, answers), so
edited data never reuses stale samples. An interrupted run therefore resumes by loading finished
chunks and computing only the missing ones, and results do not depend on chunking history: every
request's sampling seed is derived from (dataset seed, problem index, sample index, step, agent)
by the collector, never from the order work was done in.

The cache cannot see weights that change in place without a version bump; pass ``cache_key``
(the CLI passes the weights' sha256) when that can happen.

A cached chunk is trusted only if it passes two checks: the sha256 of its bytes matches the
``<chunk>.sha256`` file written beside it (an edit, a flipped byte or a truncated write), and every
record is well-formed and consistent (``correct`` exactly when ``reward > 0``; integer, non-negative
costs; the planned problem and sample). A chunk that fails is recomputed, a warning names it, and
``run_info["runtime"]["chunks_rejected"]`` counts it: corruption costs time, never a wrong number.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from agents.policy import Policy, PolicyMap, SamplingParams
from agents.rollout import RolloutCollector
from benchmarks.metrics import macro_row, metrics_to_record_dict, per_dataset, validate_samples
from benchmarks.report import make_console, plot_k_histogram
from benchmarks.suites import Suite, SuiteDataset, get_suite, task_fingerprint
from leaderboards.evidence import reward_consistent
from leaderboards.schema import git_commit, make_record, package_version
from srpo_common import atomic_write_bytes, atomic_write_text
from srpo_envs.search import episode_retrieved_ids

if TYPE_CHECKING:
    from leaderboards.schema import LeaderboardRecord

__all__ = [
    "CACHE_VERSION",
    "EvalResult",
    "RECORD_METRICS",
    "SAMPLE_RECORD_COLUMNS",
    "evaluate",
    "print_table",
    "sample_records",
]

log = logging.getLogger(__name__)

#: Bump when the per-sample record layout or the chunk file layout changes (old caches are ignored).
CACHE_VERSION = 3
#: Per-dataset metrics put into leaderboard records (``avg@k`` is renamed ``avg@<k>`` there).
RECORD_METRICS: tuple[str, ...] = (
    "avg@k",
    "pass@{k}",
    "team_tokens_per_problem",
    "tool_calls_per_problem",
    "utility",
)
#: Columns of the per-sample frame, in order (the first six are :data:`benchmarks.metrics.SAMPLE_COLUMNS`).
SAMPLE_RECORD_COLUMNS: tuple[str, ...] = (
    "dataset",
    "problem_id",
    "sample_idx",
    "correct",
    "team_tokens",
    "tool_calls",
    "reward",
    "ks",
    "turns",
    "event_types",
    "task_index",
    "episode_id",
    "answer",
    "inputs",
    "inputs_truncated",
    "evidence_recall",
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


# ---------------------------------------------------------------------------------------- results


@dataclass
class EvalResult:
    """The outcome of :func:`evaluate`.

    Attributes:
        suite: suite name. workflow / k: as evaluated.
        samples: one row per (dataset, problem, sample) -- the raw data every number derives from.
        table: :func:`benchmarks.metrics.per_dataset` table (index: dataset, suite order).
        macro: :func:`benchmarks.metrics.macro_row` (rates averaged over datasets, totals summed).
        run_info: everything needed to reproduce the run (config, seeds, dataset hashes,
            retriever/corpus, policy versions, package version, git commit) plus runtime facts.
    """

    suite: str
    workflow: str
    k: int
    samples: pd.DataFrame
    table: pd.DataFrame
    macro: pd.Series
    run_info: dict[str, Any] = field(default_factory=dict)

    @property
    def ks(self) -> tuple[int, ...]:
        return tuple(sorted({1, self.k}))

    def record_metrics(self) -> dict[str, dict[str, float]]:
        """``dataset -> {metric -> value}`` for a leaderboard record (see :data:`RECORD_METRICS`)."""
        columns = [c.format(k=self.k) for c in RECORD_METRICS]
        return metrics_to_record_dict(self.table, self.k, columns=columns)

    def to_record(
        self,
        algorithm: str,
        *,
        model_id: str | None = None,
        weights_sha256: str | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> LeaderboardRecord:
        """A validated, hashed :class:`leaderboards.schema.LeaderboardRecord` of this result.

        ``kwargs`` go to :func:`leaderboards.schema.make_record` (``date``, ``weights_path``,
        ``version``, ``commit``...). The record's macro is recomputed there as the plain mean over
        datasets, which is what its validator checks. For a record that points to its per-sample evidence
        (so ``srpo leaderboard validate`` can regrade it), pass the fields
        :func:`benchmarks.evidence.record_evidence` returns: ``to_record(..., **record_evidence([r], out))``
        (evidence builds on this module, not the reverse: the import-linter contract in pyproject.toml).
        """

        if model_id is None and weights_sha256 is None and "weights_path" not in kwargs:
            raise ValueError("a leaderboard record needs model_id= or weights_sha256= (or weights_path=)")
        corpus = self.run_info.get("corpus") or {}
        kwargs.setdefault("version", self.run_info.get("package_version"))
        kwargs.setdefault("commit", self.run_info.get("git_commit"))
        kwargs.setdefault("metrics", self.record_metrics())
        kwargs.setdefault("seeds", [int(self.run_info["config"]["seed"])])
        return make_record(
            suite=self.suite,
            k=self.k,
            algorithm=algorithm,
            workflow=self.workflow,
            name=name,
            model_id=model_id,
            weights_sha256=weights_sha256,
            config=self.run_info["config"],
            dataset_sha256=self.run_info["dataset_sha256"],
            retriever=corpus.get("retriever"),
            corpus=corpus.get("corpus"),
            corpus_sha256=corpus.get("corpus_sha256"),
            **kwargs,
        )

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary: run info, per-dataset metrics and the macro row (NaN -> null)."""
        table = {
            str(ds): {str(c): _finite_or_none(v) for c, v in row.items()}
            for ds, row in self.table.to_dict(orient="index").items()
        }
        return {
            "suite": self.suite,
            "workflow": self.workflow,
            "k": self.k,
            "datasets": table,
            "macro": {str(c): _finite_or_none(v) for c, v in self.macro.items()},
            "run_info": self.run_info,
        }

    def save(self, out_dir: str | Path, *, stem: str = "eval") -> dict[str, Path]:
        """Write ``<stem>.json`` (summary), ``<stem>_samples.parquet`` and ``<stem>_samples.csv``."""
        out = Path(out_dir)
        paths = {
            "json": atomic_write_text(
                out / f"{stem}.json",
                json.dumps(self.summary(), indent=2, sort_keys=True, allow_nan=False, default=_jsonable)
                + "\n",
            )
        }
        buf = _parquet_bytes(self.samples)
        paths["parquet"] = atomic_write_bytes(out / f"{stem}_samples.parquet", buf)
        flat = self.samples.copy()
        for col in ("ks", "event_types"):
            if col in flat.columns:
                flat[col] = flat[col].map(lambda v: json.dumps(list(v)))
        paths["csv"] = atomic_write_text(
            out / f"{stem}_samples.csv", flat.to_csv(index=False, lineterminator="\n")
        )
        if self.workflow == "routed":
            values = {str(ds): grp["ks"].map(team_k).to_numpy() for ds, grp in self.samples.groupby("dataset")}
            paths["k_histogram"] = plot_k_histogram(
                values,
                out / f"{stem}_k_histogram.png",
                title=f"{self.suite}: team size K chosen by the router",
                xlabel="K (proposers/searchers sent)",
            )
        return paths

    def k_histogram(self) -> pd.DataFrame:
        """Counts of the team size K per dataset (rows) and K value (columns), from the samples."""
        k = self.samples["ks"].map(team_k)
        hist = pd.crosstab(self.samples["dataset"], k).reindex(list(self.table.index)).fillna(0)
        hist.columns = [int(c) for c in hist.columns]
        return hist.astype(int)


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _jsonable(obj: Any) -> Any:
    """JSON fallback for config values: dataclasses as dicts, paths as strings, others by type."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return obj.as_posix()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, np.generic):
        return obj.item()
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def _plain(obj: Any) -> Any:
    """A JSON round-trip, so configs hash and compare the same way they are saved."""
    return json.loads(json.dumps(obj, sort_keys=True, default=_jsonable))


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------------------------------- records


def sample_records(
    dataset: str, batch: Any, plan: Sequence[tuple[int, int]], tasks: Sequence[Any]
) -> list[dict]:
    """Per-sample records of one :class:`agents.rollout.RolloutBatch` collected for ``plan``.

    ``plan`` lists ``(task_index, sample_idx)`` in the collector's order (tasks outer, samples
    inner), which is the order of ``batch.episodes``. The episode's task id is checked against the
    planned task, so a mismatch between env and suite data fails loudly instead of mislabelling.
    """
    if len(batch.episodes) != len(plan):
        raise RuntimeError(f"{dataset}: {len(batch.episodes)} episodes for {len(plan)} planned samples")
    out = []
    events = getattr(batch, "events", None) or {}
    for (t, g), ep in zip(plan, batch.episodes, strict=True):
        if ep.task_id != tasks[t].id:
            raise RuntimeError(f"{dataset}: episode of task {ep.task_id!r} where {tasks[t].id!r} was planned")
        out.append(
            {
                "dataset": dataset,
                "problem_id": str(ep.task_id),
                "sample_idx": int(g),
                "correct": bool(ep.correct),
                "team_tokens": int(ep.team_tokens),
                "tool_calls": int(ep.tool_calls),
                "reward": float(ep.reward),
                "ks": [int(x) for x in ep.ks],
                "turns": int(ep.turns),
                "event_types": [str(x) for x in ep.event_types],
                "task_index": int(t),
                "episode_id": str(ep.episode_id),
                "answer": _final_answer(events.get(ep.episode_id, ())),
                **_input_counts(events.get(ep.episode_id, ())),
                "evidence_recall": evidence_recall(tasks[t], events.get(ep.episode_id, ())),
            }
        )
    return out


def evidence_recall(task: Any, events: Sequence[Any]) -> float | None:
    """The share of the task's gold passages (``meta["gold_passage_ids"]``) that some search event of
    the episode retrieved (``info["retrieved_ids"]``); ``None`` where the task names none (math, QA
    sets without passage ids).

    Why: a search team can fail by not finding the evidence or by misreading what it found; exact
    match alone cannot tell them apart, and an attempt that retrieved every gold passage bounds what
    better reading could answer."""

    gold = list((getattr(task, "meta", None) or {}).get("gold_passage_ids") or [])
    if not gold:
        return None
    found = episode_retrieved_ids(events)
    return sum(g in found for g in gold) / len(gold)


def _input_counts(events: Sequence[Any]) -> dict[str, int]:
    """Texts one agent read from another in this episode, and how many the env's input limit cut
    (``info["inputs"]`` / ``info["inputs_truncated"]``; 0/0 for envs that do not report them)."""
    infos = [getattr(e, "info", None) or {} for e in events]
    return {
        "inputs": sum(int(i.get("inputs", 0)) for i in infos),
        "inputs_truncated": sum(int(i.get("inputs_truncated", 0)) for i in infos),
    }


def team_k(ks: Sequence[int]) -> int:
    """The team size of one episode: its largest event (the proposers/searchers the team sent)."""
    return int(max(ks)) if len(ks) else 0


def team_columns(samples: pd.DataFrame) -> pd.DataFrame:
    """Per-dataset ``mean_k`` (team size per attempt), ``trunc_rate`` (cut inputs / inputs; NaN
    when no agent read another's text) and ``evidence_rate`` (:func:`evidence_found`), beside
    accuracy in every eval table."""
    rows = {}
    for ds, grp in samples.groupby("dataset", sort=False, observed=True):
        inputs = float(grp["inputs"].sum()) if "inputs" in grp else 0.0
        cut = float(grp["inputs_truncated"].sum()) if "inputs_truncated" in grp else 0.0
        rows[ds] = {
            "mean_k": float(np.mean([team_k(list(v)) for v in grp["ks"]])),
            "trunc_rate": cut / inputs if inputs else math.nan,
            "evidence_rate": evidence_found(grp),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def evidence_found(samples: pd.DataFrame) -> float:
    """The share of attempts that retrieved every gold passage of their question (``evidence_recall``
    of 1), over the attempts whose question names gold passages; NaN when none does (or the frame was
    saved before the column existed)."""
    if "evidence_recall" not in samples:
        return math.nan
    known = pd.to_numeric(samples["evidence_recall"], errors="coerce").dropna()
    return float((known >= 1.0).mean()) if len(known) else math.nan


def _final_answer(events: Sequence[Any]) -> str | None:
    """The answer the env graded: the last event that recorded one (``info["answer"]``), else None."""
    for event in reversed(list(events)):
        info = getattr(event, "info", None) or {}
        if "answer" in info:
            answer = info["answer"]
            return None if answer is None else str(answer)
    return None


# ---------------------------------------------------------------------------------------- cache


def _policy_identity(policy: Policy) -> dict[str, Any]:
    """What distinguishes one policy's samples from another's, as far as can be seen from outside."""
    model = getattr(policy, "model", None)
    name = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None
    )
    return {
        "class": f"{type(policy).__module__}.{type(policy).__qualname__}",
        "policy_version": int(getattr(policy, "policy_version", 0)),
        "model": str(name) if name else None,
        "adapter": getattr(policy, "adapter_name", None),
        "key": getattr(policy, "eval_cache_key", None),
    }


def _policies_info(policies: PolicyMap) -> dict[str, Any]:
    info: dict[str, Any] = {"roles": {role: _policy_identity(p) for role, p in policies.items()}}
    if policies.default is not None:
        info["default"] = _policy_identity(policies.default)
    info["policy_versions"] = {role: int(p.policy_version) for role, p in policies.items()}
    if policies.default is not None:
        info["policy_versions"]["*"] = int(policies.default.policy_version)
    return info


def _checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_chunk(path: Path, records: Sequence[dict]) -> None:
    """The chunk, then its checksum: a crash in between leaves a chunk that fails its check (recomputed)."""
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode("utf-8")
    atomic_write_bytes(path, data)
    atomic_write_text(_checksum_path(path), hashlib.sha256(data).hexdigest() + "\n")


def _record_problem(r: Any, costed: bool = False) -> str | None:
    """Why a cached sample record cannot be trusted, or ``None`` when it is well-formed and consistent
    (``costed``: the env charges a per-member cost, so a correct answer may earn a reward <= 0)."""
    if not isinstance(r, dict) or set(r) != set(SAMPLE_RECORD_COLUMNS):
        return "fields differ from the sample record layout"
    ints = ("sample_idx", "team_tokens", "tool_calls", "turns", "task_index")
    if any(isinstance(r[c], bool) or not isinstance(r[c], int) or r[c] < 0 for c in ints):
        return f"one of {ints} is not a non-negative integer"
    if not isinstance(r["correct"], bool):
        return "correct is not a boolean"
    reward = r["reward"]
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return "reward is not a finite number"
    if not reward_consistent(r["correct"], float(reward), costed):
        return f"correct={r['correct']} contradicts reward={reward}"
    if r["answer"] is not None and not isinstance(r["answer"], str):
        return "answer is neither a string nor null"
    if not isinstance(r["ks"], list) or not isinstance(r["event_types"], list):
        return "ks/event_types are not lists"
    recall = r["evidence_recall"]
    if recall is not None and (
        isinstance(recall, bool) or not isinstance(recall, int | float) or not 0.0 <= recall <= 1.0
    ):
        return "evidence_recall is neither null nor a number in [0, 1]"
    return None


def _load_chunk(
    path: Path, expected: set[tuple[str, int]], costed: bool = False
) -> tuple[list[dict] | None, str | None]:
    """``(records, None)`` for a finished, intact chunk; ``(None, reason)`` for one that exists but
    cannot be trusted; ``(None, None)`` when there is none yet."""
    if not path.is_file():
        return None, None
    try:
        data = path.read_bytes()
        stored = _checksum_path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if hashlib.sha256(data).hexdigest() != stored:
        return None, "checksum mismatch (the file changed after it was written)"
    try:
        records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    except ValueError as exc:
        return None, f"not JSON lines ({exc})"
    for n, r in enumerate(records, start=1):
        problem = _record_problem(r, costed)
        if problem is not None:
            return None, f"record {n}: {problem}"
    keys = {(str(r["problem_id"]), int(r["sample_idx"])) for r in records}
    if keys != expected or len(records) != len(expected):
        return None, "it does not hold exactly the planned samples"
    return records, None


def _dataset_seed(seed: int, name: str) -> int:
    """Collector seed of one dataset: distinct per dataset so sampling noise is not shared across them."""
    return int(hashlib.sha256(f"srpo-eval|{seed}|{name}".encode()).hexdigest()[:8], 16)


# ---------------------------------------------------------------------------------------- evaluate


def evaluate(
    policies: PolicyMap | Policy,
    suite: str | Suite,
    workflow: str,
    k: int,
    *,
    sampling: SamplingParams | Mapping[str, SamplingParams],
    limit: int | None = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
    chunk_size: int = 16,
    datasets: Sequence[str] | None = None,
    cache_key: str | None = None,
    collector_factory: Any = None,
) -> EvalResult:
    """Evaluate a team on a suite with ``k`` samples (episodes) per problem.

    Args:
        policies: role -> policy map (a bare policy is shared by all roles).
        suite: a registered suite name (:data:`benchmarks.suites.SUITES`) or a :class:`Suite`.
        workflow: the env workflow (checked against every dataset's family).
        k: samples per problem; Avg@k and pass@k use all of them.
        sampling: sampling params for all roles, or per role (``"default"`` for the rest).
        limit: at most this many problems per dataset (first in file order); the suite's own
            per-dataset limit applies too.
        seed: run seed; each dataset's collector seed is derived from it and the dataset name.
        cache_dir: where finished chunks are cached; ``None`` disables caching and resume.
        env_kwargs: extra env kwargs for every dataset (e.g. ``n_proposers``, ``max_turns``); values
            that are not JSON (a retriever object) enter the config and cache key by type only.
        progress: show a progress bar (stderr).
        chunk_size: problems per collect call (and per cache file).
        datasets: evaluate only these datasets of the suite.
        cache_key: extra identity for the cache key (e.g. a weights sha256).
        collector_factory: ``(env_fn, policies, sampling) -> collector`` (default
            :class:`agents.rollout.RolloutCollector`); e.g. :meth:`agents.ray_rollout.RolloutWorkerPool.collector`
            fans the chunks out to Ray workers. Samples do not depend on it (per-request seeds).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    policy_map = policies if isinstance(policies, PolicyMap) else PolicyMap.shared(policies)
    the_suite = get_suite(suite)
    if datasets is not None:
        the_suite = the_suite.select(datasets)
    for ds in the_suite.datasets:
        ds.check_workflow(workflow)
    env_kwargs = dict(env_kwargs or {})
    started = time.time()

    # Load every dataset first: a bad dataset fails before any GPU time is spent.
    loaded: list[tuple[SuiteDataset, list[Any]]] = [(ds, ds.load_tasks(limit)) for ds in the_suite.datasets]
    sampling_info = (
        dataclasses.asdict(sampling)
        if isinstance(sampling, SamplingParams)
        else {role: dataclasses.asdict(s) for role, s in sorted(sampling.items())}
    )
    policies_info = _policies_info(policy_map)
    config = _plain(
        {
            "suite": the_suite.name,
            "datasets": [ds.spec() for ds, _ in loaded],
            "workflow": workflow,
            "k": k,
            "ks": sorted({1, k}),
            "limit": limit,
            "n_problems": {ds.name: len(tasks) for ds, tasks in loaded},
            "seed": seed,
            "sampling": sampling_info,
            "env_kwargs": env_kwargs,
            "chunk_size": chunk_size,
        }
    )
    key_material = {
        "cache_version": CACHE_VERSION,
        # chunk_size is not part of the key: chunk files are named by their problem range, and samples
        # do not depend on how problems were batched (per-request seeds)
        **{c: config[c] for c in ("suite", "datasets", "workflow", "k", "seed", "sampling", "env_kwargs")},
        "policies": {"roles": policies_info["roles"], "default": policies_info.get("default")},
        "cache_key": cache_key,
    }
    run_key = _sha(_plain(key_material))
    run_dir = Path(cache_dir).expanduser() / run_key[:20] if cache_dir is not None else None
    if run_dir is not None:
        atomic_write_text(
            run_dir / "config.json", json.dumps(_plain(key_material), indent=2, sort_keys=True) + "\n"
        )

    corpora = [c for c in (ds.corpus_info(env_kwargs) for ds, _ in loaded) if c is not None]
    run_info: dict[str, Any] = {
        "config": config,
        "seeds": {"seed": seed, "collect_seeds": {ds.name: _dataset_seed(seed, ds.name) for ds, _ in loaded}},
        "dataset_sha256": {ds.name: ds.dataset_sha256(tasks) for ds, tasks in loaded},
        "corpus": _merge_corpora(corpora),
        "policies": policies_info,
        "package_version": package_version(),
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "cache": {"dir": str(run_dir) if run_dir is not None else None, "key": run_key},
    }

    total = sum(len(tasks) for _, tasks in loaded) * k
    bar = _progress_bar(total, the_suite.name, progress)
    records: list[dict] = []
    chunks_total = chunks_cached = chunks_rejected = 0
    try:
        for ds, tasks in loaded:
            collector: RolloutCollector | None = None
            ds_seed = _dataset_seed(seed, ds.name)
            correct = done = 0
            for start in range(0, len(tasks), chunk_size):
                chunks_total += 1
                indices = list(range(start, min(start + chunk_size, len(tasks))))
                plan = [(t, g) for t in indices for g in range(k)]
                expected = {(str(tasks[t].id), g) for t, g in plan}
                path = None
                chunk: list[dict] | None = None
                if run_dir is not None:
                    content = _sha([task_fingerprint(tasks[t]) for t in indices])[:12]
                    name = f"chunk-{indices[0]:06d}-{indices[-1] + 1:06d}-{content}.jsonl"
                    path = run_dir / _UNSAFE.sub("_", ds.name) / name
                    chunk, problem = _load_chunk(path, expected, bool(env_kwargs.get("member_cost")))
                    if problem is not None:
                        chunks_rejected += 1
                        log.warning("cache chunk %s rejected, recomputing it: %s", path, problem)
                if chunk is not None:
                    chunks_cached += 1
                else:
                    if collector is None:
                        env_fn = ds.env_factory(workflow, tasks, env_kwargs)
                        make = collector_factory or RolloutCollector
                        collector = make(env_fn, policy_map, sampling)
                    batch = collector.collect(indices, group_size=k, seed=ds_seed)
                    chunk = sample_records(ds.name, batch, plan, tasks)
                    if path is not None:
                        _write_chunk(path, chunk)
                records.extend(chunk)
                correct += sum(bool(r["correct"]) for r in chunk)
                done += len(chunk)
                bar.set_postfix_str(f"{ds.name} acc={correct / max(done, 1):.3f}", refresh=False)
                bar.update(len(chunk))
            if collector is not None:
                _close_envs(collector)
    finally:
        bar.close()

    samples = validate_samples(pd.DataFrame.from_records(records, columns=list(SAMPLE_RECORD_COLUMNS)))
    for col in ("team_tokens", "tool_calls"):
        samples[col] = samples[col].astype(np.int64)
    table = per_dataset(samples, ks=sorted({1, k})).join(team_columns(samples))
    table = table.reindex(list(the_suite.dataset_names))
    run_info["runtime"] = {
        "seconds": round(time.time() - started, 3),
        "chunks": chunks_total,
        "chunks_cached": chunks_cached,
        "chunks_rejected": chunks_rejected,
    }
    return EvalResult(
        suite=the_suite.name,
        workflow=workflow,
        k=k,
        samples=samples,
        table=table,
        macro=_macro(table),
        run_info=run_info,
    )


def _macro(table: pd.DataFrame) -> pd.Series:
    """:func:`macro_row`, with NaN for a column that is undefined for some dataset (e.g. utility at zero
    tokens) instead of an error: one undefined ratio should not hide the rest of the table."""
    numeric = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c])]
    defined = [c for c in numeric if not table[c].isna().any()]
    row = macro_row(table, defined) if defined else pd.Series(dtype=np.float64, name="macro")
    return row.reindex(numeric)


def _merge_corpora(corpora: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One retriever/corpus entry for the record: the shared one, or the distinct names joined."""
    if not corpora:
        return None
    unique = {json.dumps(c, sort_keys=True): c for c in corpora}
    if len(unique) == 1:
        return next(iter(unique.values()))
    return {
        "retriever": ",".join(sorted({str(c["retriever"]) for c in corpora}))[:200],
        "corpus": ",".join(sorted({str(c["corpus"]) for c in corpora}))[:200],
        "corpus_sha256": None,
        "parts": list(unique.values()),
    }


def _close_envs(collector: Any) -> None:
    """Close the collector's envs once (search envs share one retriever, closed by the first)."""
    if callable(getattr(collector, "close", None)):  # a remote collector closes its workers' envs
        collector.close()
        return
    closed: set[int] = set()
    for env in getattr(collector, "_envs", []):
        retriever = getattr(env, "retriever", None)
        if retriever is not None and id(retriever) in closed:
            continue
        if retriever is not None:
            closed.add(id(retriever))
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # closing is best effort; the results are already in hand
                log.warning("closing env failed: %s", exc)


class _NoBar:
    def update(self, n: int) -> None: ...

    def set_postfix_str(self, s: str, refresh: bool = True) -> None: ...

    def close(self) -> None: ...


def _progress_bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True, file=sys.stderr)


# ---------------------------------------------------------------------------------------- display


def print_table(result: EvalResult, console: Any = None) -> Any:
    """Print the per-dataset table and the macro row with rich; returns the ``rich.table.Table``."""
    from rich.table import Table

    console = console or make_console()
    ks = result.ks
    table = Table(
        title=f"{result.suite} / {result.workflow} / k={result.k}",
        caption="avg@k: mean accuracy over the k samples; pass@k: unbiased estimator; "
        "utility: correct samples per 1M team tokens; mean K: team size per attempt; "
        "trunc: share of agent-to-agent inputs cut by the env's input limit; "
        "gold found: share of attempts that retrieved every gold passage (search)",
    )
    table.add_column("dataset", style="bold", no_wrap=True)
    for name in (
        "problems",
        "avg@k",
        *(f"pass@{x}" for x in ks if x != 1),
        "tokens/problem",
        "tools/problem",
        "mean K",
        "trunc",
        "gold found",
        "utility",
    ):
        table.add_column(name, justify="right")

    def cells(row: Mapping[str, Any]) -> list[str]:
        vals = [f"{int(row['n_problems'])}", _fmt(row["avg@k"], ".3f")]
        vals += [_fmt(row[f"pass@{x}"], ".3f") for x in ks if x != 1]
        vals += [_fmt(row["team_tokens_per_problem"], ".1f"), _fmt(row["tool_calls_per_problem"], ".2f")]
        vals += [_fmt(row.get("mean_k", math.nan), ".2f"), _fmt(row.get("trunc_rate", math.nan), ".3f")]
        vals.append(_fmt(row.get("evidence_rate", math.nan), ".3f"))
        vals.append(_fmt(row["utility"], ".1f"))
        return vals

    for ds, row in result.table.iterrows():
        table.add_row(str(ds), *cells(row))
    table.add_section()
    table.add_row("macro", *cells(result.macro), style="bold")
    console.print(table)
    return table


def _fmt(value: Any, spec: str) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "-" if math.isnan(v) else format(v, spec)
