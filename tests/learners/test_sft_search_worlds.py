"""Many-world search SFT: episodes in invented training worlds, the premature-answer habit, eval worlds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from learners.sft import SFTConfig, _premature, build_search_examples, training_worlds
from srpo_envs.tasks.knowledge_base import SFT_WORLD_SEED_BASE, make_knowledge_base


def _env(gold: list[str]) -> SimpleNamespace:
    return SimpleNamespace(unwrapped=SimpleNamespace(gold_titles=gold))


def test_premature_answer_replaces_only_the_request_for_the_bridge() -> None:
    two_hop = _env(["Zoukfeia", "Brelmatton"])
    assert _premature(two_hop, "aggregator", "<search>Brelmatton</search>") == "<answer>Brelmatton</answer>"
    assert _premature(two_hop, "aggregator", "<search>Zoukfeia</search>") is None  # the subject again
    assert _premature(two_hop, "searcher", "<search>Brelmatton</search>") is None
    assert _premature(two_hop, "aggregator", "<answer>1981</answer>") is None
    assert _premature(_env(["Zoukfeia"]), "aggregator", "<search>Zoukfeia</search>") is None


def test_training_worlds_never_include_an_evaluation_world() -> None:
    assert training_worlds(SFTConfig(domain="search", kb_seed=3)) == [3]
    worlds = training_worlds(SFTConfig(domain="search", kb_worlds=3, eval_kb_seeds=(0, 1)))
    assert worlds == [SFT_WORLD_SEED_BASE, SFT_WORLD_SEED_BASE + 1, SFT_WORLD_SEED_BASE + 2]
    with pytest.raises(ValueError, match="overlap the training worlds"):
        SFTConfig(domain="search", kb_worlds=3, eval_kb_seeds=(SFT_WORLD_SEED_BASE + 2,))
    with pytest.raises(ValueError, match="premature_answer"):
        SFTConfig(domain="search", premature_answer=1.5)


@pytest.mark.slow  # builds two BM25 worlds
def test_examples_come_from_several_worlds_with_the_habit(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    cfg = SFTConfig(domain="search", kb_worlds=2, premature_answer=1.0, search_episodes=24, seed=1)
    examples = build_search_examples(tok, cfg)
    prompts = [tok.decode(p) for p, _, _ in examples]
    for world in (SFT_WORLD_SEED_BASE, SFT_WORLD_SEED_BASE + 1):
        subjects = {t.question for t in make_knowledge_base(seed=world, split="train")[1]}
        assert any(q in p for p in prompts for q in subjects), f"no episode in world {world}"
    # with the habit always on, an aggregator that would ask for a two-hop question's bridge entity
    # answers with it instead: every answer kept is the gold answer or that bridge, and some are bridges
    expected: dict[str, tuple[set[str], str | None]] = {}
    for world in (SFT_WORLD_SEED_BASE, SFT_WORLD_SEED_BASE + 1):
        corpus, tasks = make_knowledge_base(seed=world, split="train")
        title = {p.id: p.title for p in corpus}
        for t in tasks:
            gold = t.meta["gold_passage_ids"]
            expected[t.question] = (set(t.answers), title[gold[1]] if len(gold) == 2 else None)
    kinds = []
    for (_, t, role), prompt in zip(examples, prompts, strict=True):
        text = tok.decode(t)
        if role != "aggregator" or "<answer>" not in text:
            continue
        answer = text.split("<answer>")[1].split("</answer>")[0].strip()
        answers, bridge = next(v for q, v in expected.items() if q in prompt)
        assert answer in answers or answer == bridge
        kinds.append("bridge" if answer == bridge else "gold")
    assert "bridge" in kinds


def test_length_groups_cut_sorted_draws_into_batches_of_similar_length() -> None:
    """``length_groups``: G batches per draw, each a run of the length-sorted draw, so padding shrinks."""
    import torch

    from learners.sft import _length_grouped

    examples = [([0] * n, [1], "searcher") for n in (5, 50, 7, 60, 9, 70, 11, 80) * 4]
    batches = _length_grouped(examples, 4, 3, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 4]
    spans = sorted(
        (min(len(examples[i][0]) for i in b), max(len(examples[i][0]) for i in b)) for b in batches
    )
    assert all(hi_a <= lo_b for (_, hi_a), (lo_b, _) in zip(spans, spans[1:], strict=False))
    with pytest.raises(ValueError, match="length_groups"):
        SFTConfig(length_groups=-1)


def test_search_worlds_corpus_reads_only_training_worlds() -> None:
    """The ``search-worlds`` tokenizer text comes from training worlds, never an evaluation world."""
    from agents.corpus import search_corpus

    texts = search_corpus(120, worlds=2)
    joined = "\n".join(texts)
    for world in (SFT_WORLD_SEED_BASE, SFT_WORLD_SEED_BASE + 1):
        assert any(f"({p.title})" in joined for p in make_knowledge_base(seed=world, split="train")[0])
    for world in (0, 1):  # world 0 is the single-world warm start's, world 1 quick-search's evaluation
        assert not any(p.title in joined for p in make_knowledge_base(seed=world, split="all")[0])
    with pytest.raises(ValueError, match="worlds"):
        search_corpus(10, worlds=-1)


def test_prebuilt_worlds_are_found_by_the_envs_made_afterwards(tmp_path, monkeypatch) -> None:
    """``prebuild_kb_indexes`` builds each world once (one JVM for the batch); an env of such a world
    then opens its index from the cache instead of starting an indexer of its own."""
    pytest.importorskip("pyserini")
    from srpo_envs.search import MultiTurnSearchEnv, prebuild_kb_indexes

    monkeypatch.setenv("SRPO_CACHE_DIR", str(tmp_path))
    seeds = [SFT_WORLD_SEED_BASE + 900, SFT_WORLD_SEED_BASE + 901]
    assert prebuild_kb_indexes(seeds) == 2
    assert prebuild_kb_indexes(seeds) == 0
    env = MultiTurnSearchEnv(dataset="kb", kb_seed=seeds[1])
    assert env.retriever.index_built is False
    passage = make_knowledge_base(seed=seeds[1], split="all")[0][0]
    assert env.retriever.search([passage.title], 1)[0][0].id == passage.id


def test_copy_spacing_teacher_names_tokenize_as_in_the_prompt(tiny_model_dir) -> None:
    """With ``copy_spacing`` every name a search example's target copies (a query, a request, an answer)
    is the same run of token ids as somewhere in its prompt, and the env still reads the name."""
    from transformers import AutoTokenizer

    pytest.importorskip("pyserini")
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    cfg = SFTConfig(domain="search", search_episodes=12, copy_spacing=True, premature_answer=0.5)
    examples = build_search_examples(tok, cfg)
    assert len(examples) > 20

    def runs(ids: list[int], n: int) -> set[tuple[int, ...]]:
        return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}

    for prompt, target, _ in examples:
        text = tok.decode(target, skip_special_tokens=True)
        tag = "answer" if "<answer>" in text else "search"
        name = text.split(f"<{tag}>")[1].split(f"</{tag}>")[0]
        assert name.startswith(" ") and name.strip() == name[1:]
        ids = tok(name, add_special_tokens=False)["input_ids"]
        assert tuple(ids) in runs(prompt, len(ids)), f"{name!r} tokenizes unlike its prompt"
        assert tuple(ids) in runs(target, len(ids))


def test_subject_retrieved_tells_a_team_that_found_the_subject_from_one_that_did_not() -> None:
    """``kb_search_stats``' ``subject_found``: an oracle team retrieves every question's first-hop
    passage, a team querying a word no passage holds never does."""
    pytest.importorskip("pyserini")
    import srpo_envs
    from agents.scripted import ScriptedTeam
    from learners.sft import subject_retrieved

    env = srpo_envs.make("MultiTurnSearch-v0", split="test", dataset_size=6)
    lost = ScriptedTeam.fixed({"searcher": "<search>qqzx</search>", "aggregator": "<answer>none</answer>"})
    for team, expected in ((ScriptedTeam.search_oracle(env), True), (lost, False)):
        for i in range(6):
            obs, infos = env.reset(seed=i, options={"task_index": i})
            while env.agents:
                obs, _, _, _, infos = env.step(team.act(obs, infos))
            first_hop = env.unwrapped.task.meta["gold_passage_ids"][0]
            assert subject_retrieved(env.unwrapped.events, first_hop) is expected


def test_routed_teacher_examples_teach_every_route(tiny_model_dir) -> None:
    """The routed search workflow's teacher writes a route per episode, 1..n_searchers uniformly: a
    warm start built from it can send every team size (the parallel teacher wrote none, so the shipped
    search warm start never routed and every route fell back to one searcher)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    cfg = SFTConfig(domain="search", search_workflow="routed", n_searchers=5, search_episodes=40, seed=2)
    examples = build_search_examples(tok, cfg)
    routes = [tok.decode(t) for _, t, role in examples if role == "router"]
    assert len(routes) == 40
    ks = {int(r.split("\\boxed{")[1].split("}")[0]) for r in routes}
    assert ks == {1, 2, 3, 4, 5}
    assert all("searchers (1 to 5)" in tok.decode(p) for p, _, role in examples if role == "router")
    assert {role for _, _, role in examples} == {"router", "searcher", "aggregator"}
    with pytest.raises(ValueError, match="search_workflow"):
        SFTConfig(domain="search", search_workflow="proposers-aggregator")
