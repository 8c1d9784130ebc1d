"""Benchmark suites: named lists of datasets, each knowing how to load its problems and build its env.

A :class:`Suite` is data only. Nothing here imports an env module until an env is actually built, so
the math suites work on an install (or a checkout) where the search env or its retrieval extras are
missing, and listing suites never touches a corpus.

Registered suites (:data:`SUITES`):

* ``math``: MATH500, AIME24, AIME25, AMC23, Minerva, OlympiadBench (bundled) via ``MathVerify-v0``;
* ``search``: nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle (bundled samples)
  via the multi-turn search env over the bundled corpus;
* ``quick-math``: the procedural arithmetic test split at difficulties 1 and 2 (64 problems each):
  a CPU-scale smoke benchmark a tiny model can move on;
* ``quick-columns``: column addition (2 and 3 digits), test split: every held-out problem uses only
  facts training problems use, the suite where RL on training problems can move held-out accuracy;
* ``quick-search``: the test questions of the procedural knowledge base (``dataset="kb"``) in a
  world no warm start or RL run trains in (:data:`QUICK_SEARCH_EVAL_KB_SEED`);
* routed variants ``math-routed``, ``search-routed``, ``quick-columns-routed`` and
  ``quick-search-routed`` (up to :data:`QUICK_SEARCH_MAX_SEARCHERS` searchers): the same datasets,
  run by default with the ``routed`` workflow (a router sends 1..n proposers/searchers) and a
  per-member cost (:data:`ROUTED_MEMBER_COST`) in the team reward, so their tables report the chosen
  K (mean and histogram) and team cost beside accuracy.

Every dataset reports a sha256 for result provenance: the bytes of the bundled file for bundled
sets, and for generated sets (procedural arithmetic, the KB) the canonical JSON of the evaluated
task ids, texts and answers, since there is no file to hash and the generator code could change.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import srpo_envs
from learners.presets import GYM_FAMILIES
from srpo_common import plugins, sha256_json
from srpo_envs.index_build import index_corpus_info
from srpo_envs.tasks import math_data, reasoning_gym_data, search_data
from srpo_envs.tasks.knowledge_base import make_knowledge_base
from srpo_envs.tasks.math_data import load_math
from srpo_envs.tasks.search_data import bundled_corpus_sha256, load_qa, sha256_file

__all__ = [
    "MATH_WORKFLOWS",
    "SEARCH_WORKFLOWS",
    "SUITES",
    "Suite",
    "SuiteDataset",
    "get_suite",
    "register_suite",
    "task_fingerprint",
    "tasks_sha256",
]

Family = Literal["math", "search"]

#: Workflows of the math env (mirrors ``srpo_envs.math_verify.WORKFLOWS``; the env re-checks).
MATH_WORKFLOWS: tuple[str, ...] = ("solver-verifier", "proposers-aggregator", "routed")
#: Workflows of the search env (mirrors ``srpo_envs.search.SEARCH_WORKFLOWS``, kept here so that
#: validating a CLI argument does not import the search env).
SEARCH_WORKFLOWS: tuple[str, ...] = ("parallel", "routed")
_WORKFLOWS: dict[str, tuple[str, ...]] = {"math": MATH_WORKFLOWS, "search": SEARCH_WORKFLOWS}
#: Where the search env lives when no registered id is given (imported only when an env is built).
SEARCH_ENTRY_POINT = "srpo_envs.search:MultiTurnSearchEnv"


def task_fingerprint(task: Any) -> dict[str, Any]:
    """What identifies a task's content: id, text and gold answer(s), for math and QA tasks alike."""
    text = getattr(task, "problem", None)
    if text is None:
        text = getattr(task, "question", "")
    answers = getattr(task, "answers", None)
    if answers is None:
        answers = [getattr(task, "answer", "")]
    return {"id": str(task.id), "text": str(text), "answers": [str(a) for a in answers]}


def tasks_sha256(tasks: Sequence[Any]) -> str:
    """sha256 of the canonical JSON of the tasks' fingerprints (order matters: it is the eval order)."""
    return sha256_json([task_fingerprint(t) for t in tasks])


@dataclass(frozen=True)
class SuiteDataset:
    """One dataset of a suite.

    Args:
        name: the name reported in tables and leaderboard records.
        family: ``"math"`` or ``"search"``: which env and workflows apply.
        dataset: the env's ``dataset=`` argument (a bundled name, ``"procedural"``, ``"kb"``...).
        split: split passed to the loader (procedural/KB: ``"test"``; bundled sets: ``None``).
        limit: default number of problems (first ``limit`` in file order); ``None`` = all.
        env_id: a registered env id to build with ``srpo_envs.make``; ``None`` uses ``entry_point``.
        entry_point: ``"module:Class"`` used when ``env_id`` is ``None``.
        env_kwargs: fixed env/loader kwargs of this dataset (e.g. ``difficulty`` or ``kb_seed``).
    """

    name: str
    family: Family
    dataset: str
    split: str | None = None
    limit: int | None = None
    env_id: str | None = None
    entry_point: str | None = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in _WORKFLOWS:
            raise ValueError(f"family must be one of {sorted(_WORKFLOWS)}, got {self.family!r}")
        if self.env_id is None and self.entry_point is None:
            raise ValueError(f"dataset {self.name!r} needs env_id or entry_point")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")

    # ------------------------------------------------------------------ description
    @property
    def workflows(self) -> tuple[str, ...]:
        return _WORKFLOWS[self.family]

    @property
    def generated(self) -> bool:
        """True for datasets generated by code (no file to hash): procedural, the invented KB, reasoning-gym."""
        return self.dataset.startswith(("procedural", reasoning_gym_data.PREFIX)) or self.dataset == "kb"

    def check_workflow(self, workflow: str) -> None:
        if workflow not in self.workflows:
            raise ValueError(
                f"workflow {workflow!r} does not apply to {self.family} dataset {self.name!r}; "
                f"choose one of {', '.join(self.workflows)}"
            )

    def spec(self) -> dict[str, Any]:
        """JSON description of *which* data and env this is (limit excluded: see ``effective_limit``)."""
        return {
            "name": self.name,
            "family": self.family,
            "dataset": self.dataset,
            "split": self.split,
            "env_id": self.env_id,
            "entry_point": self.entry_point if self.env_id is None else None,
            "env_kwargs": dict(self.env_kwargs),
        }

    def effective_limit(self, limit: int | None = None) -> int | None:
        """The number of problems evaluated: the smaller of this dataset's default and ``limit``."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        limits = [x for x in (self.limit, limit) if x is not None]
        return min(limits) if limits else None

    # ------------------------------------------------------------------ data
    def load_tasks(self, limit: int | None = None) -> list[Any]:
        """The evaluated problems, in a fixed order; a smaller limit gives a prefix of a larger one."""
        n = self.effective_limit(limit)
        kwargs = dict(self.env_kwargs)
        if self.family == "math":
            if self.dataset.startswith("procedural"):
                extra = {k: kwargs[k] for k in ("difficulty", "max_operand") if k in kwargs}
                return load_math(self.dataset, split=self.split or "test", limit=n, **extra)
            return load_math(self.dataset, split=self.split, limit=n, dataset_config=kwargs.get("dataset_config"))
        if self.dataset == "kb":
            _, tasks = _knowledge_base(int(kwargs.get("kb_seed", 0)), self.split or "test")
            return list(tasks[:n]) if n is not None else list(tasks)

        return load_qa(self.dataset, split=self.split, limit=n)

    def dataset_sha256(self, tasks: Sequence[Any] | None = None) -> str:
        """Provenance hash: the bundled/local file's bytes, or the generated tasks' canonical JSON."""
        if not self.generated:
            data = math_data if self.family == "math" else search_data
            bundled: Mapping[str, str] = math_data.MATH_DATASETS if data is math_data else search_data.SEARCH_DATASETS
            if self.dataset in bundled or Path(self.dataset).expanduser().is_file():
                return data.dataset_sha256(self.dataset)
        return tasks_sha256(tasks if tasks is not None else self.load_tasks())

    # ------------------------------------------------------------------ envs
    def env_factory(
        self,
        workflow: str,
        tasks: Sequence[Any] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> Callable[[], Any]:
        """A zero-argument env builder for :class:`agents.rollout.RolloutCollector`.

        The env gets exactly ``tasks`` (default: :meth:`load_tasks`), so ``task_index`` i of a
        rollout is problem i of this dataset. Search envs after the first share the first env's
        retriever: building one index per parallel rollout would cost minutes and gigabytes.
        """
        self.check_workflow(workflow)
        chosen = list(tasks) if tasks is not None else self.load_tasks()
        kwargs: dict[str, Any] = {**dict(self.env_kwargs), **dict(env_kwargs or {})}
        if self.family == "math":
            kwargs.pop("max_operand", None)
        if self.split is not None:
            kwargs.setdefault("split", self.split)
        if self.env_id is not None:
            env_id = self.env_id

            def build(**kw: Any) -> Any:
                return srpo_envs.make(env_id, **kw)
        else:
            module, _, attr = str(self.entry_point).partition(":")
            entry = self.entry_point

            def build(**kw: Any) -> Any:
                try:
                    cls = getattr(importlib.import_module(module), attr)
                except (ImportError, AttributeError) as exc:
                    raise ImportError(f"cannot load env {entry!r} for dataset {self.name!r}: {exc}") from exc
                return cls(**kw)

        shared: dict[str, Any] = {}

        def make_env() -> Any:
            env = build(workflow=workflow, dataset=self.dataset, tasks=chosen, **{**kwargs, **shared})
            if self.family == "search" and not shared and hasattr(env, "retriever"):
                shared["retriever"] = env.retriever
            return env

        return make_env

    def corpus_info(self, env_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Retriever and corpus of a search dataset (``None`` for math): what a record must name."""
        if self.family != "search":
            return None
        kwargs = {**dict(self.env_kwargs), **dict(env_kwargs or {})}
        retriever = kwargs.get("retriever", "bm25")
        if "retriever_url" in kwargs:
            retriever_name = f"remote:{kwargs['retriever_url']}"
        elif isinstance(retriever, str):
            retriever_name = retriever
        else:
            retriever_name = type(retriever).__name__
        corpus = kwargs.get("corpus")
        if kwargs.get("index") is not None:
            return index_corpus_info(kwargs["index"])
        if "retriever_url" in kwargs or retriever == "remote" or not isinstance(retriever, str):
            return {"retriever": retriever_name, "corpus": "external", "corpus_sha256": None}
        if corpus is not None:
            if isinstance(corpus, str | bytes) or hasattr(corpus, "__fspath__"):
                path = Path(corpus).expanduser()  # type: ignore[arg-type]
                return {"retriever": retriever_name, "corpus": path.name, "corpus_sha256": sha256_file(path)}
            return {
                "retriever": retriever_name,
                "corpus": "custom",
                "corpus_sha256": _passages_sha256(corpus),
            }
        if self.dataset == "kb":
            seed = int(kwargs.get("kb_seed", 0))
            passages, _ = _knowledge_base(seed, "all")
            return {
                "retriever": retriever_name,
                "corpus": f"kb(seed={seed},n={len(passages)})",
                "corpus_sha256": _passages_sha256(passages),
            }

        return {"retriever": retriever_name, "corpus": "bundled", "corpus_sha256": bundled_corpus_sha256()}


def _knowledge_base(seed: int, split: str) -> tuple[list[Any], list[Any]]:
    """``(passages, tasks)`` of the procedural KB."""

    passages, tasks = make_knowledge_base(seed=seed, split=split)
    return list(passages), list(tasks)


def _passages_sha256(passages: Sequence[Any]) -> str:
    return sha256_json([{"id": p.id, "title": p.title, "text": p.text} for p in passages])


@dataclass(frozen=True)
class Suite:
    """A named list of datasets evaluated together; the macro average weighs each dataset equally.

    ``default_k`` is the samples per problem a command uses when none is given: 16 for the paper's
    math suites (Avg@16 / Pass@16, as the paper reports them); ``None`` leaves it to the command.
    ``protocols`` names fixed smaller problem sets of the suite (name -> the first N problems of every
    dataset), such as :data:`BENCH_QUICK_PROTOCOL`, what the main job evaluates: a record of exactly
    that set is a full record of the protocol (ranked with its like), not a partial run of the suite.
    """

    name: str
    datasets: tuple[SuiteDataset, ...]
    description: str = ""
    default_workflow: str = "proposers-aggregator"
    default_k: int | None = None
    protocols: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [d.name for d in self.datasets]
        if not names:
            raise ValueError(f"suite {self.name!r} has no datasets")
        if len(set(names)) != len(names):
            raise ValueError(f"suite {self.name!r} has duplicate dataset names: {names}")
        bad = {p: n for p, n in self.protocols.items() if not (isinstance(n, int) and n >= 1)}
        if bad:
            raise ValueError(f"suite {self.name!r}: a protocol's problems per dataset must be >= 1: {bad}")

    @property
    def dataset_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.datasets)

    def protocol_problems(self, protocol: str, whole: Mapping[str, int]) -> dict[str, int]:
        """Problems per dataset of ``protocol``, given the whole suite's (``whole``); ``KeyError`` if the
        suite has no such protocol."""
        if protocol not in self.protocols:
            raise KeyError(
                f"suite {self.name!r} has no protocol {protocol!r} (it has {sorted(self.protocols)})"
            )
        return {d: min(n, self.protocols[protocol]) for d, n in whole.items()}

    def protocol_of(self, problems: Mapping[str, int], whole: Mapping[str, int]) -> str | None:
        """The protocol whose problem set ``problems`` (per dataset) is exactly; ``None`` for a
        whole-suite record (``problems == whole``) or a partial one."""
        if dict(problems) == dict(whole):
            return None
        return next(
            (p for p in sorted(self.protocols) if self.protocol_problems(p, whole) == dict(problems)), None
        )

    def select(self, names: Sequence[str]) -> Suite:
        """The same suite restricted to ``names`` (in suite order); unknown names are an error."""
        unknown = sorted(set(names) - set(self.dataset_names))
        if unknown:
            raise KeyError(
                f"suite {self.name!r} has no datasets {unknown}; it has {list(self.dataset_names)}"
            )
        keep = tuple(d for d in self.datasets if d.name in set(names))
        return Suite(self.name, keep, self.description, self.default_workflow, self.default_k, self.protocols)


SUITES: dict[str, Suite] = {}
plugins.watch("suite", SUITES)  # type: ignore[arg-type]  # a plugin may add, not replace


def register_suite(suite: Suite) -> Suite:
    """Add a suite to :data:`SUITES`; names are unique (a changed suite gets a new name)."""
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} is already registered")
    SUITES[suite.name] = suite
    return suite


def get_suite(suite: str | Suite) -> Suite:
    if isinstance(suite, Suite):
        return suite
    try:
        return SUITES[suite]
    except KeyError:
        raise KeyError(f"unknown suite {suite!r}; known: {', '.join(sorted(SUITES))}") from None


def _math(name: str, dataset: str, **env_kwargs: Any) -> SuiteDataset:
    return SuiteDataset(name, "math", dataset, env_id="MathVerify-v0", env_kwargs=env_kwargs)


def _search(name: str, dataset: str, **kwargs: Any) -> SuiteDataset:
    return SuiteDataset(name, "search", dataset, entry_point=SEARCH_ENTRY_POINT, **kwargs)


#: Team-reward cost per member sent in the routed suites: small next to the reward of a correct
#: answer (1), large enough that a router gains by sending fewer members when more do not help.
ROUTED_MEMBER_COST = 0.05
#: Samples per problem of the paper's math tables (Avg@16, Pass@16).
PAPER_MATH_K = 16
#: The paper's math benchmarks (bundled test sets).
MATH_BENCHMARKS: tuple[tuple[str, str], ...] = (
    ("MATH500", "math500"),
    ("AIME24", "aime24"),
    ("AIME25", "aime25"),
    ("AMC23", "amc23"),
    ("Minerva", "minerva"),
    ("OlympiadBench", "olympiadbench"),
)
#: The paper's search benchmarks (bundled samples).
SEARCH_BENCHMARKS: tuple[str, ...] = (
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "musique",
    "bamboogle",
)


register_suite(
    Suite(
        "math",
        tuple(_math(name, ds) for name, ds in MATH_BENCHMARKS),
        "Competition math (bundled test sets), graded with math-verify.",
        default_k=PAPER_MATH_K,
    )
)
register_suite(
    Suite(
        "math-routed",
        tuple(_math(name, ds, member_cost=ROUTED_MEMBER_COST) for name, ds in MATH_BENCHMARKS),
        "The math suite with a router choosing 1..n proposers (per-member cost in the team reward).",
        default_workflow="routed",
        default_k=PAPER_MATH_K,
    )
)
register_suite(
    Suite(
        "search",
        tuple(_search(name, name) for name in SEARCH_BENCHMARKS),
        "Open-domain and multi-hop QA (bundled samples) with retrieval over the bundled corpus; EM reward. "
        "triviaqa, popqa, bamboogle and 300 of 500 musique questions have no evidence in that corpus.",
        default_workflow="parallel",
    )
)
register_suite(
    Suite(
        "search-routed",
        tuple(
            _search(name, name, env_kwargs={"member_cost": ROUTED_MEMBER_COST}) for name in SEARCH_BENCHMARKS
        ),
        "The search suite with a router choosing 1..n searchers (per-member cost in the team reward).",
        default_workflow="routed",
    )
)
#: The main job's protocol of a suite (``srpo bench quick``): the first :data:`BENCH_QUICK_PROBLEMS`
#: problems of every dataset, what fits its time budget (decisions evaluate the whole split instead).
BENCH_QUICK_PROTOCOL = "bench-quick"
BENCH_QUICK_PROBLEMS = 32
_BENCH_QUICK = {BENCH_QUICK_PROTOCOL: BENCH_QUICK_PROBLEMS}

#: quick-math uses one-digit operands: hard enough to leave a ~1-2M-parameter model room, easy enough
#: that it learns on CPU in minutes (difficulty 1 has 51 distinct test problems).
QUICK_MATH_MAX_OPERAND = 9

register_suite(
    Suite(
        "quick-math",
        tuple(
            SuiteDataset(
                f"arith-d{d}",
                "math",
                "procedural",
                split="test",
                limit=64,
                env_id="MathVerify-v0",
                env_kwargs={"difficulty": d, "max_operand": QUICK_MATH_MAX_OPERAND},
            )
            for d in (1, 2)
        ),
        "Procedural arithmetic test split (one-digit operands), difficulties 1 and 2 (<= 64 problems each).",
        protocols=_BENCH_QUICK,
    )
)


def _columns_datasets(extra_env_kwargs: dict[str, Any]) -> tuple[SuiteDataset, ...]:
    """Column addition of two 2- and 3-digit numbers, test split (<= 128 problems each)."""
    return tuple(
        SuiteDataset(
            f"columns-d{d}",
            "math",
            "procedural-columns",
            split="test",
            limit=128,
            env_id="MathVerify-v0",
            env_kwargs={"difficulty": d, **extra_env_kwargs},
        )
        for d in (2, 3)
    )


register_suite(
    Suite(
        "quick-columns",
        _columns_datasets({}),
        "Column addition of two 2- and 3-digit numbers, test split (<= 128 problems each): held-out "
        "problems use the same one-digit facts as training ones, so a skill learned by RL carries over.",
        protocols=_BENCH_QUICK,
    )
)
register_suite(
    Suite(
        "quick-columns-routed",
        _columns_datasets({"member_cost": ROUTED_MEMBER_COST}),
        "quick-columns with a router choosing 1..n proposers and a per-member cost: the CPU-scale suite "
        "where the set size K varies between events.",
        default_workflow="routed",
        protocols=_BENCH_QUICK,
    )
)
register_suite(
    Suite(
        "quick-gym",
        tuple(
            SuiteDataset(
                name.removeprefix("reasoning-gym:"),
                "math",
                name,
                split="test",
                limit=256,
                env_id="MathVerify-v0",
                env_kwargs={"dataset_config": config},
            )
            for name, config in GYM_FAMILIES.items()
        ),
        "Two reasoning-gym families, chain_sum (three one-digit numbers added and subtracted) and "
        "basic_arithmetic (a sum of two numbers of 2-3 digits), each in its family's phrasing and graded by "
        "its family's scorer, test split (of 256 drawn per family, those not among the first 2,048 "
        "training questions).",
        protocols=_BENCH_QUICK,
    )
)
#: Most proposers the quick-columns-routed5 router may send: the K up to 5 of the paper's ablation.
QUICK_COLUMNS_MAX_PROPOSERS = 5

register_suite(
    Suite(
        "quick-columns-routed5",
        _columns_datasets({"member_cost": ROUTED_MEMBER_COST, "n_proposers": QUICK_COLUMNS_MAX_PROPOSERS}),
        "quick-columns-routed with up to 5 proposers (K in 1..5 per propose event): the CPU-scale suite "
        "of the paper's set-normalisation ablation, where sqrt, sum, mean and K=1 weigh events apart.",
        default_workflow="routed",
        protocols=_BENCH_QUICK,
    )
)
#: The invented world quick-search evaluates in: never a training world of the warm start or of RL.
QUICK_SEARCH_EVAL_KB_SEED = 1

register_suite(
    Suite(
        "quick-search",
        (_search("kb", "kb", split="test", limit=64, env_kwargs={"kb_seed": QUICK_SEARCH_EVAL_KB_SEED}),),
        "Procedural knowledge-base test questions (1- and 2-hop) in an invented world no training run "
        "has seen (kb_seed 1): the team has to search and read to answer.",
        default_workflow="parallel",
    )
)
#: Most searchers the quick-search-routed router may send each round: the paper's search ablation runs
#: K up to 5 parallel searchers.
QUICK_SEARCH_MAX_SEARCHERS = 5
#: Team-reward cost per searcher per search round in quick-search-routed. Smaller than
#: :data:`ROUTED_MEMBER_COST` because a search episode pays every round (up to two) and its team wins
#: ~0.2 per question at CPU scale: five searchers for two rounds cost 0.2, one searcher once 0.02.
QUICK_SEARCH_MEMBER_COST = 0.02

register_suite(
    Suite(
        "quick-search-routed",
        (
            _search(
                "kb",
                "kb",
                split="test",
                limit=64,
                env_kwargs={
                    "kb_seed": QUICK_SEARCH_EVAL_KB_SEED,
                    "n_searchers": QUICK_SEARCH_MAX_SEARCHERS,
                    "member_cost": QUICK_SEARCH_MEMBER_COST,
                },
            ),
        ),
        "quick-search with a router choosing 1..5 parallel searchers per round and a per-searcher cost "
        "in the team reward: the CPU-scale suite of the paper's search ablation (K varies per episode).",
        default_workflow="routed",
    )
)

#: The team suite's searcher sources: each searcher its own kind of entity (srpo_envs.search.KB_SOURCES).
QUICK_SEARCH_TEAM_SOURCES = "by-kind"
#: Passages each searcher of the team suite brings: its source's best match, so the aggregator reads one
#: passage per member (at three, a five-member turn is fifteen passages, most of them noise).
QUICK_SEARCH_TEAM_TOP_K = 1

register_suite(
    Suite(
        "quick-search-team",
        (
            _search(
                "kb",
                "kb",
                split="test",
                env_kwargs={
                    "kb_seed": QUICK_SEARCH_EVAL_KB_SEED,
                    "n_searchers": QUICK_SEARCH_MAX_SEARCHERS,
                    "member_cost": QUICK_SEARCH_MEMBER_COST,
                    "searcher_sources": QUICK_SEARCH_TEAM_SOURCES,
                    "top_k": QUICK_SEARCH_TEAM_TOP_K,
                },
            ),
        ),
        "quick-search-routed where each searcher consults its own source (people, companies, cities, "
        "countries): a question needs as many searchers as the furthest source of its evidence (1-4; "
        "mean 1.76 over the 208 test questions of world 1), so the router's K matters per question.",
        default_workflow="routed",
    )
)
