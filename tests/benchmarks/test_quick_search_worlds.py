"""quick-search measures reading, not memory: its evaluation world is one no training run has seen."""

from __future__ import annotations

from benchmarks.presets import QUICK_SEARCH_TRAIN_KB_SEED, TRAINING_ENVS
from benchmarks.suites import SUITES
from learners.presets import RECIPES
from learners.sft import SFTConfig, training_worlds
from srpo_envs.tasks.knowledge_base import make_knowledge_base


def _eval_worlds() -> set[int]:
    return {int(ds.env_kwargs.get("kb_seed", 0)) for ds in SUITES["quick-search"].datasets}


def _rl_world() -> int:
    """The world quick-search's RL runs train in (the env's default kb_seed is 0)."""
    return int(TRAINING_ENVS["quick-search"].env_kwargs.get("kb_seed", 0))


def test_quick_search_evaluates_in_worlds_neither_sft_nor_rl_trained_in() -> None:
    recipe = TRAINING_ENVS["quick-search"].recipe
    assert recipe == "search-worlds"
    sft_worlds = {w for stage in RECIPES[recipe] for w in training_worlds(SFTConfig(**stage))}
    rl_world = _rl_world()
    assert rl_world == QUICK_SEARCH_TRAIN_KB_SEED
    assert _eval_worlds() and not _eval_worlds() & (sft_worlds | {rl_world})


def test_quick_search_eval_world_shares_no_passage_or_question_with_the_rl_world() -> None:
    (eval_world,) = _eval_worlds()
    eval_passages, eval_tasks = make_knowledge_base(seed=eval_world, split="test")
    train_passages, train_tasks = make_knowledge_base(seed=_rl_world(), split="all")
    assert not {p.title for p in eval_passages} & {p.title for p in train_passages}
    assert not {t.question for t in eval_tasks} & {t.question for t in train_tasks}
    assert [t.meta["kb_seed"] for t in SUITES["quick-search"].datasets[0].load_tasks(4)] == [eval_world] * 4


def test_envs_of_a_pooled_world_list_share_one_copy_of_each_world() -> None:
    """A rollout makes one env per sample; with a 64-world ``kb_seed`` list each env used to build and
    keep every world again (~35 MB and ~0.7 s per env: a decision run's workers reached 6 GB). Now the
    worlds are built once per process and shared, while each caller still gets lists of its own."""
    import srpo_envs

    seeds = list(range(3, 7))
    a = srpo_envs.make("MultiTurnSearch-v0", dataset="kb", kb_seed=seeds, workflow="parallel")
    b = srpo_envs.make("MultiTurnSearch-v0", dataset="kb", kb_seed=seeds, workflow="parallel")
    ta, tb = a.unwrapped.tasks, b.unwrapped.tasks
    assert len(ta) == len(tb) > 0 and all(x is y for x, y in zip(ta, tb, strict=True))
    corpus, tasks = make_knowledge_base(seed=3)
    again_corpus, again_tasks = make_knowledge_base(seed=3)
    assert corpus[0] is again_corpus[0] and tasks[0] is again_tasks[0]
    tasks.clear()  # a caller's list is its own
    assert make_knowledge_base(seed=3)[1] == again_tasks and len(again_tasks) > 0
