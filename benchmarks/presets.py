"""Named settings of the benchmark commands, kept apart from the code that runs them.

What lives here: the suites ``srpo bench compare``/``ablation``/``quick`` can train on
(:data:`TRAINING_ENVS`), the shipped warm starts they begin from, the RL settings of the CPU-scale
runs (:data:`QUICK_TRAIN`, :data:`QUICK_SETTINGS`) and the variant sets a comparison trains
(:data:`ALGORITHMS`, :data:`ABLATIONS`); the suites' decision settings are read from the shipped
experiment files ``benchmarks/experiments/<suite>.toml`` (:data:`DECISION_DIR`). Changing an experiment
means editing this file or those; the runners (:mod:`benchmarks.cli`, :mod:`benchmarks.compare`) read these
names and hold no numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.suites import (
    BENCH_QUICK_PROBLEMS,
    QUICK_COLUMNS_MAX_PROPOSERS,
    QUICK_SEARCH_MAX_SEARCHERS,
    QUICK_SEARCH_MEMBER_COST,
    QUICK_SEARCH_TEAM_SOURCES,
    QUICK_SEARCH_TEAM_TOP_K,
    ROUTED_MEMBER_COST,
    SUITES,
)
from learners.algorithms import ALGORITHMS as REGISTERED_ALGORITHMS
from learners.presets import GYM_MIXTURE
from learners.profiles import TINY
from srpo_common import plugins

_CHECKPOINTS = Path(__file__).resolve().parent.parent / "agents" / "checkpoints"
#: Where ``srpo bench quick`` looks for shipped warm-started tiny models before building them.
BUNDLED_MODEL = _CHECKPOINTS / "mini-sft"
BUNDLED_SEARCH_MODEL = _CHECKPOINTS / "mini-search-sft"
#: The many-world search warm start (``--recipe search-worlds``): it reads, so quick-search starts from it.
BUNDLED_SEARCH_WORLDS_MODEL = _CHECKPOINTS / "mini-search-worlds-sft"
#: mini-search-worlds-sft with a router that sends 1..5 searchers (``--recipe search-worlds-routed``).
BUNDLED_SEARCH_WORLDS_ROUTED_MODEL = _CHECKPOINTS / "mini-search-worlds-routed-sft"
BUNDLED_COLUMNS_MODEL = _CHECKPOINTS / "mini-columns-sft"
#: mini-columns-sft with a router that sends 1..5 proposers (``--recipe columns5``).
BUNDLED_COLUMNS5_MODEL = _CHECKPOINTS / "mini-columns5-sft"
#: The invented world quick-search's RL runs train in: one neither the warm start trained in (its worlds
#: start at ``srpo_envs.tasks.knowledge_base.SFT_WORLD_SEED_BASE``) nor the suite evaluates in
#: (``benchmarks.suites.QUICK_SEARCH_EVAL_KB_SEED``), so RL rewards reading, not recall (docs/results/quick-search.md
#: has what RL in a training world gave).
QUICK_SEARCH_TRAIN_KB_SEED = 3


@dataclass(frozen=True)
class TrainingEnv:
    """Where a CPU-scale suite's RL runs train: the env, its workflow and train-split kwargs."""

    env_id: str
    workflow: str
    env_kwargs: dict[str, Any]
    bundled_model: Path  # the shipped warm start for this suite
    recipe: str  # the ``learners.presets.RECIPES`` entry (``srpo model sft --recipe``) that rebuilds it


#: quick-gym's warm start: mini-columns-sft, then the gym recipe's reasoning-gym passes.
BUNDLED_GYM_MODEL = _CHECKPOINTS / "mini-gym-sft"

#: Suites ``bench compare``/``ablation``/``quick`` can train on (evaluation is on the suite's test split).
TRAINING_ENVS: dict[str, TrainingEnv] = {
    "quick-math": TrainingEnv(
        "ProcArith-v0",
        "proposers-aggregator",
        # balanced: all 111 one-operation train problems and as many two-operation ones (see
        # docs/results/warm-starts.md for why the cap matters)
        {"difficulty": [1, 2], "max_operand": 9, "dataset_size": 111},
        BUNDLED_MODEL,
        "math",
    ),
    "quick-columns": TrainingEnv(
        "ProcArith-v0",
        "proposers-aggregator",
        {"dataset": "procedural-columns", "difficulty": [2, 3]},
        BUNDLED_COLUMNS_MODEL,
        "columns",
    ),
    # the two reasoning-gym families mixed, 512 training questions (the held-out split excludes them)
    "quick-gym": TrainingEnv(
        "MathVerify-v0",
        "proposers-aggregator",
        {"dataset": "reasoning-gym:composite", "dataset_config": GYM_MIXTURE, "dataset_size": 512},
        BUNDLED_GYM_MODEL,
        "gym",
    ),
    # RL in a world the warm start never saw; the suite evaluates in another unseen one
    "quick-search": TrainingEnv(
        "MultiTurnSearch-v0",
        "parallel",
        {"kb_seed": QUICK_SEARCH_TRAIN_KB_SEED},
        BUNDLED_SEARCH_WORLDS_MODEL,
        "search-worlds",
    ),
    # the routed search suite: a router sends 1..5 searchers each round, each costs team reward
    "quick-search-routed": TrainingEnv(
        "MultiTurnSearch-v0",
        "routed",
        {
            "kb_seed": QUICK_SEARCH_TRAIN_KB_SEED,
            "n_searchers": QUICK_SEARCH_MAX_SEARCHERS,
            "member_cost": QUICK_SEARCH_MEMBER_COST,
        },
        BUNDLED_SEARCH_WORLDS_ROUTED_MODEL,
        "search-worlds-routed",
    ),
    # the team suite: each searcher consults its own source, so a question needs 1..4 of them; it starts
    # from the routed warm start (a routed SFT pass in this team read worse: docs/results/search-team.md)
    "quick-search-team": TrainingEnv(
        "MultiTurnSearch-v0",
        "routed",
        {
            "kb_seed": QUICK_SEARCH_TRAIN_KB_SEED,
            "n_searchers": QUICK_SEARCH_MAX_SEARCHERS,
            "member_cost": QUICK_SEARCH_MEMBER_COST,
            "searcher_sources": QUICK_SEARCH_TEAM_SOURCES,
            "top_k": QUICK_SEARCH_TEAM_TOP_K,
        },
        BUNDLED_SEARCH_WORLDS_ROUTED_MODEL,
        "search-worlds-routed",
    ),
    # the routed column suite: K varies per event (the router sends 1..3 proposers) and each member
    # costs ROUTED_MEMBER_COST of team reward, so the router has a reason to choose
    "quick-columns-routed": TrainingEnv(
        "ProcArith-v0",
        "routed",
        {"dataset": "procedural-columns", "difficulty": [2, 3], "member_cost": ROUTED_MEMBER_COST},
        BUNDLED_COLUMNS_MODEL,
        "columns",
    ),
    # the set-normalisation ablation's suite: the router sends 1..5 proposers, so K reaches the paper's 5
    "quick-columns-routed5": TrainingEnv(
        "ProcArith-v0",
        "routed",
        {
            "dataset": "procedural-columns",
            "difficulty": [2, 3],
            "member_cost": ROUTED_MEMBER_COST,
            "n_proposers": QUICK_COLUMNS_MAX_PROPOSERS,
        },
        BUNDLED_COLUMNS5_MODEL,
        "columns5",
    ),
    # the paper's suites: train on MATH's training split (its held-out 5% is excluded, see
    # srpo_envs.tasks.math_data) and evaluate on the six benchmarks
    "math": TrainingEnv(
        "MathVerify-v0", "proposers-aggregator", {"dataset": "math_train"}, BUNDLED_MODEL, "math"
    ),
    "math-routed": TrainingEnv(
        "MathVerify-v0",
        "routed",
        {"dataset": "math_train", "member_cost": ROUTED_MEMBER_COST},
        BUNDLED_MODEL,
        "math",
    ),
    # no search training set is bundled: at CPU scale the search suites train on the procedural KB's
    # train questions (a real run trains on NQ + HotpotQA train files via `srpo train`)
    "search": TrainingEnv("MultiTurnSearch-v0", "parallel", {}, BUNDLED_SEARCH_MODEL, "search"),
    "search-routed": TrainingEnv(
        "MultiTurnSearch-v0", "routed", {"member_cost": ROUTED_MEMBER_COST}, BUNDLED_SEARCH_MODEL, "search"
    ),
}

plugins.watch("training env", TRAINING_ENVS)  # type: ignore[arg-type]  # a plugin may add, not replace


def register_training_env(suite: str, env: TrainingEnv) -> TrainingEnv:
    """Make ``suite`` (a registered :class:`benchmarks.suites.Suite`) trainable by ``srpo bench compare |
    ablation | power``: where its RL runs train and the warm start they begin from (a plugin's door; a taken
    name is refused)."""
    if suite in TRAINING_ENVS:
        raise ValueError(f"suite {suite!r} already has a training env")
    if suite not in SUITES:
        raise ValueError(f"register the suite {suite!r} first (benchmarks.suites.register_suite)")
    TRAINING_ENVS[suite] = env
    return env


#: RL settings of the CPU-scale runs: one on-policy minibatch per iteration, a small learning rate
#: (larger ones destabilise the 2.4M-parameter warm start).
QUICK_TRAIN: dict[str, Any] = {
    "tasks_per_iter": 8,
    "group_size": 4,
    "epochs": 1,
    "rows_per_batch": 256,
    "lr": 3e-5,
}

#: The suites ``srpo bench quick`` runs, in order: column addition with a router that picks K (each
#: member costs reward; RL removes a carry habit on held-out problems) and the search team whose
#: searchers each consult their own source (the search half: a question needs 1..4 of them).
#: ``quick-search`` (two searchers, one corpus), ``quick-columns``, ``quick-columns-routed5`` and
#: ``quick-math`` run with ``--suites``. The job's 10-minute budget on 2 cores holds the column suite's
#: three algorithms at two seeds and SRPO alone on the team at two seeds (docs/results/main-job.md).
QUICK_SUITES: tuple[str, ...] = ("quick-columns-routed", "quick-search-team")
#: Training seeds of a ``bench quick`` suite unless ``--seeds`` is given (a suite's ``seeds`` setting
#: overrides it).
QUICK_SEEDS: tuple[int, ...] = (0, 1)
#: ``bench quick`` trains this many runs at a time as Ray tasks (cores split between them); 0: one at a
#: time in this process. Measured on 2 cores (``benchmarks.perf.bench_memory``): in-process 397 s and 1.74 GB
#: for the whole job, 2 workers 387 s and 3.62 GB (each run takes twice as long on one thread), so the
#: default stays one process; workers pay off with more cores or a Ray cluster.
QUICK_WORKERS = 0

#: The column suites' RL: 16 tasks x G=8 per iteration, each rollout batch split into two minibatches
#: (the second step is off-policy, so the clipped objectives act), lr 1e-4.
#: These are the tiny-model settings ``srpo train`` gives a shipped model by default (learners.profiles.TINY:
#: one place for both), with the update perf.bench_iteration recommends (prefix-tree forward, memory
#: bounded by a token budget).
_COLUMNS_TRAIN: dict[str, Any] = {**QUICK_TRAIN, "iterations": 4, **TINY}

#: quick-search's RL: the column suites' off-policy update (two minibatches per rollout batch, prefix
#: tree, token budget) on 16 questions x G=8 per iteration for 16 iterations (G=8 so that a group's
#: samples differ in reward; measured settings in docs/results/quick-search.md). Its learning rate is spelled out here,
#: not inherited: a later key beats an earlier one, so an edit of ``QUICK_TRAIN["lr"]`` never reached
#: this suite (``_COLUMNS_TRAIN`` sets its own); this line is the search learning rate. A search
#: prompt carries three passages, so its micro-batches hold 2048 tokens (the prefix tree's attention
#: grows with the square of the budget; the time is the same) and MAPPO's critic reads the question and
#: the latest 128 tokens of the state (the newest passages): the main job's memory and time budget
#: (docs/results/main-job.md has the measurements).
_SEARCH_TRAIN: dict[str, Any] = {
    **_COLUMNS_TRAIN,
    "iterations": 16,
    "lr": 1e-4,
    "max_tokens_per_microbatch": 2048,
    "critic_max_tokens": 128,
}

#: The suites' decision settings live in shipped experiment files, one per suite
#: (``benchmarks/experiments/<suite>.toml``, the files ``srpo bench compare --config <suite>`` runs): each
#: holds the seeds, eval, training-env kwargs and ``[train]`` overrides a decision run of the suite takes
#: over its ``bench quick`` settings, with the reasons as comments. The four tables below are read from
#: them, so the file is the one place a decision setting is changed.
DECISION_DIR = Path(__file__).resolve().parent / "experiments"


def _decision_files() -> dict[str, dict[str, Any]]:
    """suite -> its decision file's tables (``[compare]``, ``[eval]``, ``[train]``); a file must name its suite."""
    import tomllib

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(DECISION_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        suite = data.get("compare", {}).get("suite")
        if suite != path.stem:
            raise ValueError(f"{path}: [compare] suite = {suite!r}, expected {path.stem!r} (the file's name)")
        out[suite] = data
    return out


_DECISIONS = _decision_files()


#: Per-suite RL settings, eval k and eval problems per dataset of ``bench quick``.
QUICK_SETTINGS: dict[str, dict[str, Any]] = {
    # the suites' bench-quick protocol, 32 of the 128 held-out problems per size: the main job's time
    # budget (the whole split, 4x the episodes, took the job from ~10 to ~17 minutes on 2 cores);
    # decisions use DECISION_EVAL instead
    "quick-columns": {"train": dict(_COLUMNS_TRAIN), "eval_k": 2, "eval_limit": BENCH_QUICK_PROBLEMS},
    "quick-columns-routed": {"train": dict(_COLUMNS_TRAIN), "eval_k": 2, "eval_limit": BENCH_QUICK_PROBLEMS},
    "quick-columns-routed5": {"train": dict(_COLUMNS_TRAIN), "eval_k": 2, "eval_limit": BENCH_QUICK_PROBLEMS},
    # 8 iterations at half the column suites' rate with a 4-step warmup: at their settings the first Adam
    # step moved the gym warm start by approx_kl 2.4 and, at 1e-4 with the warmup, one seed of ten by 1.3
    # at iteration 3 (the divergence guard stopped both); 4 iterations moved nothing (docs/results/gym.md)
    "quick-gym": {
        "train": {**_COLUMNS_TRAIN, "iterations": 8, "warmup": 4, "lr": 5e-5},
        "eval_k": 2,
        "eval_limit": BENCH_QUICK_PROBLEMS,
    },
    "quick-math": {
        "train": {**QUICK_TRAIN, "iterations": 10},
        "eval_k": 2,
        "eval_limit": BENCH_QUICK_PROBLEMS,
    },
    # every one of the suite's 64 questions, 4 samples each: a smaller eval's noise hides RL's delta;
    # 12 iterations and one seed: what the main job's 10 minutes held beside the column suite while this was
    # its search half (until 2026-12-07; now with --suites quick-search)
    "quick-search": {
        "train": {**_SEARCH_TRAIN, "iterations": 12},
        "eval_k": 4,
        "eval_limit": 64,
        "seeds": (0,),
    },
    "quick-search-routed": {"train": dict(_SEARCH_TRAIN), "eval_k": 4, "eval_limit": 64},
    # the main job's search half. Every one of the team suite's 208 held-out questions (world 1's test
    # split), two samples each; groups kept by outcome (kept by reward, the member cost alone took the
    # router to K=1 and the team below its start); 8 iterations of three epochs over each rollout batch in
    # the 16 decision worlds (the experiment file's, read above), SRPO alone at two seeds: what decides
    # SRPO's gain over the start inside the job's budget (at one epoch, or lr 3e-4, 8 iterations left it
    # undecided: docs/results/main-job.md).
    # The decision design (experiment file) trains 32 iterations of one epoch.
    "quick-search-team": {
        "train": {
            **_SEARCH_TRAIN,
            "iterations": 8,
            "epochs": 3,
            "filter_groups": True,
            "filter_signal": "correct",
        },
        "eval_k": 2,
        "eval_limit": 256,
        "seeds": (0, 1),
        "algos": ("srpo",),
        "env_kwargs": dict(_DECISIONS["quick-search-team"]["compare"]["env_kwargs"]),
    },
}

#: Comparison variants: name -> ``TrainConfig`` overrides.
ALGORITHMS: dict[str, dict[str, Any]] = {
    "srpo": {"algo": "srpo"},
    "grpo": {"algo": "grpo"},
    "mappo": {"algo": "mappo"},
}
#: Every registered baseline ``srpo bench compare --algos`` accepts (the main job trains :data:`ALGORITHMS`).
BASELINES: dict[str, dict[str, Any]] = {
    name: {"algo": name} for name in ("srpo", "grpo", "dr-grpo", "gspo", "dr-mas", "at-grpo", "rloo", "mappo")
}
def algorithm_variants(names: list[str]) -> dict[str, dict[str, Any]]:
    """``--algos`` names -> their ``TrainConfig`` overrides: the shipped baselines, and any algorithm
    registered since (a plugin's: ``learners.algorithms.register_algorithm``); an unknown name raises
    ``ValueError`` listing the known ones."""
    known = {**BASELINES, **{n: {"algo": n} for n in REGISTERED_ALGORITHMS if n not in BASELINES}}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown algorithms {unknown}; choose from {sorted(known)}")
    return {n: known[n] for n in names}


#: The SRPO set-normalisation ablation (``srpo bench ablation``): sqrt (default), sum, mean and K=1.
ABLATIONS: dict[str, dict[str, Any]] = {
    "srpo-sqrt": {"algo": "srpo", "norm": "sqrt"},
    "srpo-sum": {"algo": "srpo", "norm": "sum"},
    "srpo-mean": {"algo": "srpo", "norm": "mean"},
    "srpo-k1": {"algo": "srpo", "norm": "k1"},
}


def ablation_variants(names: list[str]) -> dict[str, dict[str, Any]]:
    """``--norms`` names (``sum`` or ``srpo-sum``) -> their :data:`ABLATIONS` entries, in the given order;
    an unknown or repeated name raises ``ValueError`` listing the known ones."""
    known = {v["norm"]: k for k, v in ABLATIONS.items()}
    picked = [known.get(n, n) for n in names]
    unknown = [n for n, k in zip(names, picked, strict=True) if k not in ABLATIONS]
    if unknown or not picked or len(set(picked)) < len(picked):
        raise ValueError(f"normalisations {names} must be distinct and among {list(known)} (or {list(ABLATIONS)})")
    return {k: ABLATIONS[k] for k in picked}


def _seed_count(suite: str, seeds: str) -> int:
    values = [int(s) for s in seeds.split(",") if s.strip()]
    if values != list(range(len(values))):
        raise ValueError(f"{DECISION_DIR / suite}.toml: seeds must be 0..N-1 (a count), got {seeds!r}")
    return len(values)


#: ``--seeds`` default of ``srpo bench compare`` / ``ablation --suite S`` (seeds 0..N-1): as many training
#: seeds as ``srpo bench power --suite S`` says a decision at a few points needs (training seeds dominate
#: the paired difference's variance on the column suites once every held-out problem is evaluated; the
#: power table is in docs/results/algorithms.md). Suites not listed take :data:`COMPARE_DEFAULTS`.
DECISION_SEEDS: dict[str, int] = {
    suite: _seed_count(suite, d["compare"]["seeds"]) for suite, d in _DECISIONS.items() if "seeds" in d["compare"]
}
#: ``--eval-k`` / ``--eval-limit`` defaults of ``srpo bench compare`` / ``ablation`` / ``power --suite S``:
#: on the column suites every held-out problem (128 per size) with k=4, the design ``srpo bench power``
#: sizes (the power table of docs/results/algorithms.md); suites not listed take their ``bench quick`` eval
#: (:data:`QUICK_SETTINGS`).
DECISION_EVAL: dict[str, dict[str, int]] = {suite: dict(d["eval"]) for suite, d in _DECISIONS.items() if "eval" in d}
#: Env kwargs of ``bench compare`` / ``ablation`` / ``power --suite S`` over the suite's training env
#: (``bench quick`` keeps :data:`TRAINING_ENVS`' one world and its budget unless its :data:`QUICK_SETTINGS`
#: entry names ``env_kwargs``, as quick-search-team's does): quick-search's 16 invented
#: worlds, none the warm start or the held-out evaluation uses, so RL has to learn to read.
DECISION_ENV_KWARGS: dict[str, dict[str, Any]] = {
    suite: dict(d["compare"]["env_kwargs"]) for suite, d in _DECISIONS.items() if "env_kwargs" in d["compare"]
}
#: The invented worlds a quick-search *decision* run trains in (``bench compare`` / ``ablation`` /
#: ``power``): 16 worlds from :data:`QUICK_SEARCH_TRAIN_KB_SEED` on.
QUICK_SEARCH_RL_WORLDS: tuple[int, ...] = tuple(DECISION_ENV_KWARGS["quick-search"]["kb_seed"])
#: ``TrainConfig`` overrides of ``bench compare`` / ``ablation`` / ``power --suite S`` over the suite's
#: ``bench quick`` settings (search RL that moves held-out accuracy needs many worlds, dynamic sampling and
#: many iterations; docs/results/quick-search.md has what each gave).
DECISION_TRAIN: dict[str, dict[str, Any]] = {suite: dict(d["train"]) for suite, d in _DECISIONS.items() if "train" in d}
#: Defaults of ``srpo bench compare`` / ``ablation`` that are not RL settings.
COMPARE_DEFAULTS: dict[str, Any] = {
    "seeds": "0,1,2",
    "ablation_seeds": "0,1",
    "iterations": 10,
    "eval_k": 2,
    "eval_limit": 32,
}
