"""Warm-start a (tiny) model on teacher demonstrations for every role of an env domain.

RL on a randomly initialised model never sees a reward. ``sft`` teaches the output *formats* and a
first competence. Domain ``math``: examples come from playing every math workflow with a scripted
teacher team (proposers right with probability ``p_correct``; a majority-vote aggregator; a truthful
verifier; a random router) on the procedural *train* split. Proposer/solver examples are kept only
where the teacher was right, so the model never imitates wrong arithmetic, while the aggregator and
verifier see realistic disagreeing candidates. Domain ``search``: searchers and aggregator of the
KB search env, taught by ``ScriptedTeam.search_teacher`` (which reads before it queries), again
keeping only outputs worth imitating. The loss covers response tokens only.

The result should solve a measurable fraction of held-out problems but far from all, leaving RL
room to improve; ``sft`` prints and saves that accuracy (``sft_report.json``).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from agents.hf import HFPolicy, encode_request
from agents.policy import GenerationRequest, PolicyMap, SamplingParams
from agents.prompts import RolePrompts
from agents.rollout import RolloutCollector
from agents.scripted import ScriptedTeam, search_teacher_correct
from agents.tiny import init_tiny
from learners.presets import RECIPES
from srpo_common import atomic_write_text
from srpo_envs.grading import extract_answer, grade
from srpo_envs.math_verify import MathVerifyEnv
from srpo_envs.search import (
    SEARCH_WORKFLOWS,
    SEARCHER_SOURCES,
    MultiTurnSearchEnv,
    episode_retrieved_ids,
    prebuild_kb_indexes,
)
from srpo_envs.tasks import reasoning_gym_data
from srpo_envs.tasks.knowledge_base import SFT_WORLD_SEED_BASE, make_knowledge_base
from srpo_envs.tasks.math_data import PROCEDURAL_FAMILIES
from srpo_envs.tasks.procedural import slipped_solution

#: What an SFT run teaches: every role of the math envs, or the searchers and aggregator of the KB search env.
SFT_DOMAINS = ("math", "search")


@dataclass
class SFTConfig:
    """Warm-start settings; defaults reach ~20-60% proposers-aggregator accuracy on CPU in minutes.

    Each field's docstring is its ``srpo model sft --help`` text (the options are generated from it).
    """

    steps: int = 1000
    """Optimizer steps of the first pass."""
    batch_size: int = 16
    """Examples per optimizer step."""
    lr: float = 2e-3
    """Peak learning rate of the first pass (linear warmup, then cosine decay to 0)."""
    warmup: int = 50
    """Warmup steps."""
    refine_steps: int = 600
    """Steps of a second pass with a fresh optimizer, refine_lr and new teacher examples (seed + 1); 0: none."""
    refine_lr: float = 1e-3
    """Learning rate of the second pass."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    difficulties: tuple[int, ...] = (1, 2)
    """math: procedural difficulties the examples are drawn from."""
    dataset: str = "procedural"
    """math: the dataset, procedural (nested arithmetic), procedural-columns (column addition) or a
    reasoning-gym family with worked solutions (reasoning-gym:chain_sum, reasoning-gym:basic_arithmetic), or
    reasoning-gym:composite mixing them (one pass on the mixture: alternating single-family passes forget)."""
    dataset_config: dict[str, Any] = field(default_factory=dict)
    """math: a reasoning-gym family's generator settings (chain_sum's max_terms, max_digits...)."""
    carry_slip: float = 0.0
    """procedural-columns, or a reasoning-gym sum of two numbers: probability that a correct teacher solution
    is replaced by the same solution with its first carry forgotten (kept although wrong): a systematic,
    problem-independent error that RL on training problems removes on held-out ones too
    (srpo_envs.tasks.procedural.slipped_solution, reasoning_gym_data.slipped_solution)."""
    max_operand: int = 9
    """math: largest operand of the procedural problems."""
    tasks_per_difficulty: int = 1200
    """math: procedural train tasks per difficulty (teacher episodes are spread over the workflows)."""
    workflows: tuple[str, ...] = ("proposers-aggregator", "solver-verifier", "routed")
    """math: the workflows the teacher team plays."""
    n_proposers: int = 3
    """math: proposers of the teacher team; its random router sends 1..n_proposers of them (routed)."""
    p_correct: float = 0.6
    """Probability that a scripted teacher proposer/searcher is right."""
    seed: int = 0
    """Seed of the teacher play, the example order and the model's sampling."""
    eval_problems: int = 64
    """Held-out test problems the warm start is evaluated on."""
    eval_temperature: float = 1.0
    """Sampling temperature of that evaluation."""
    max_new_tokens: int = 48
    """Tokens per response in that evaluation."""
    save_dtype: str = "float32"
    """dtype of the saved weights: float32, or bfloat16 for a half-size checkpoint (what the repo ships)."""
    domain: str = "math"
    """math: procedural arithmetic, every math workflow; search: searchers + aggregator on the KB search
    env (MultiTurnSearch-v0), taught by ScriptedTeam.search_teacher."""
    search_episodes: int = 3000
    """search: episodes of teacher play per pass (train questions, cycled)."""
    kb_seed: int = 0
    """search: seed of the invented knowledge base (the world played when kb_worlds is 0)."""
    search_workflow: str = "parallel"
    """search: the workflow the teacher team plays, parallel or routed (its router sends 1..n_searchers)."""
    n_searchers: int = 2
    """search: searchers of the teacher team (routed: the most its router sends)."""
    searcher_sources: str = "shared"
    """search: what each searcher searches: shared (the whole corpus) or by-kind (its own entity kind)."""
    search_top_k: int = 3
    """search: passages each searcher's query retrieves."""
    kb_worlds: int = 0
    """search: 0 plays every episode in the world kb_seed, so the model can memorise its facts; N > 0
    plays each episode in one of N invented training worlds (kb_seed SFT_WORLD_SEED_BASE + 0..N-1, drawn
    per episode, never a world the evaluation uses), so answering takes reading what was retrieved."""
    premature_answer: float = 0.0
    """search: probability that, on a two-hop question, the teacher aggregator answers with the bridge
    entity it would have searched for next (kept although wrong): a habit RL removes, since such an
    answer scores 0 and asking for the second hop can score 1."""
    eval_kb_seeds: tuple[int, ...] = ()
    """search: worlds of the held-out evaluation (default: kb_seed); unseen worlds when kb_worlds > 0."""
    prompt_loss_weight: float = 0.0
    """Weight of a language-modelling loss on the prompt tokens, added to the response loss (each a
    mean over its tokens). 0: responses only. Search observations repeat each name they mention
    (title, then text), so predicting the prompt teaches the copy that reading needs: on responses
    alone (~160 target tokens a step) a many-world warm start sat at loss ~2.4 with no copying after
    750 steps; with the prompt weighted 0.5, then 1.0, it began copying names within ~1,500 steps."""
    copy_spacing: bool = False
    """search: the teacher writes a space after <search> and <answer>, so a name it copies tokenizes as
    in the passage it comes from (ScriptedTeam.search_teacher copy_spacing)."""
    length_groups: int = 0
    """0: every batch is batch_size examples drawn at random. G > 0: draw G batches' examples at once,
    sort them by length and cut them into G batches (in random order), so a batch pads to a similar
    length: search prompts vary 3x in length and padding otherwise doubles the cost of a step."""

    def __post_init__(self) -> None:
        if self.domain not in SFT_DOMAINS:
            raise ValueError(f"domain must be one of {SFT_DOMAINS}, got {self.domain!r}")

        if self.search_workflow not in SEARCH_WORKFLOWS:
            raise ValueError(
                f"search_workflow must be one of {SEARCH_WORKFLOWS}, got {self.search_workflow!r}"
            )
        if self.n_searchers < 1 or self.search_top_k < 1:
            raise ValueError(f"n_searchers and search_top_k must be >= 1, got {self.n_searchers}, {self.search_top_k}")
        if self.searcher_sources not in SEARCHER_SOURCES:
            raise ValueError(f"searcher_sources must be one of {SEARCHER_SOURCES}, got {self.searcher_sources!r}")
        worked = [f"{reasoning_gym_data.PREFIX}{f}" for f in reasoning_gym_data.WORKED_SOLUTIONS]
        composite = f"{reasoning_gym_data.PREFIX}composite"
        if self.dataset not in (*PROCEDURAL_FAMILIES, *worked, composite):
            raise ValueError(
                f"dataset must be one of {(*PROCEDURAL_FAMILIES, *worked, composite)}, got {self.dataset!r}"
            )
        if self.dataset == composite:  # a mixture: every family in it needs srpo's worked solutions
            mixed = [d["name"] if isinstance(d, dict) else d.name for d in self.dataset_config.get("datasets") or []]
            unworked = [name for name in mixed if name not in reasoning_gym_data.WORKED_SOLUTIONS]
            if not mixed or unworked:
                raise ValueError(
                    f"a reasoning-gym:composite SFT dataset mixes families with worked solutions "
                    f"({', '.join(reasoning_gym_data.WORKED_SOLUTIONS)}); got {', '.join(unworked) or 'none'}"
                )
        if self.dataset_config and not self.dataset.startswith(reasoning_gym_data.PREFIX):
            raise ValueError(f"dataset_config applies to a reasoning-gym dataset, not {self.dataset!r}")
        if self.save_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"save_dtype must be float32 or bfloat16, got {self.save_dtype!r}")
        if self.prompt_loss_weight < 0:
            raise ValueError(f"prompt_loss_weight must be >= 0, got {self.prompt_loss_weight}")
        if self.length_groups < 0:
            raise ValueError(f"length_groups must be >= 0, got {self.length_groups}")
        if self.kb_worlds < 0 or not 0.0 <= self.premature_answer <= 1.0:
            raise ValueError("kb_worlds must be >= 0 and premature_answer in [0, 1]")
        trained = training_worlds(self)
        if self.kb_worlds and set(trained) & set(self.eval_kb_seeds):
            raise ValueError(f"eval_kb_seeds {self.eval_kb_seeds} overlap the training worlds {trained}")


def _end_id(tokenizer: Any) -> int:
    """The token a response ends with: the chat turn end when the tokenizer has one, else EOS."""
    vocab = tokenizer.get_vocab()
    if "<|im_end|>" in vocab:
        return int(vocab["<|im_end|>"])
    return int(tokenizer.eos_token_id)


def build_examples(tokenizer: Any, cfg: SFTConfig) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, target ids, role) from scripted teacher play on the domain's train split."""
    if cfg.domain == "search":
        return build_search_examples(tokenizer, cfg)

    prompts = RolePrompts("math")
    end = _end_id(tokenizer)
    rng = random.Random(cfg.seed)
    examples: list[tuple[list[int], list[int], str]] = []
    for difficulty in cfg.difficulties:
        for workflow in cfg.workflows:
            env = MathVerifyEnv(
                workflow=workflow,
                dataset=cfg.dataset,
                difficulty=difficulty,
                max_operand=cfg.max_operand,
                dataset_size=cfg.tasks_per_difficulty,
                dataset_config=cfg.dataset_config or None,
                n_proposers=cfg.n_proposers,
            )
            team = ScriptedTeam.noisy_oracle(env, p_correct=cfg.p_correct, seed=rng.randint(0, 2**31))
            for i in range(cfg.tasks_per_difficulty // len(cfg.workflows)):
                for obs, infos, actions in team.play(env, rng.randint(0, 2**31), i % len(env.tasks)):
                    for agent, text in actions.items():
                        role = infos[agent]["role"]
                        solves = role in ("proposer", "solver")
                        if solves and cfg.carry_slip > 0 and rng.random() < cfg.carry_slip:
                            slipped = slipped_solution(env.task) or reasoning_gym_data.slipped_solution(
                                env.task
                            )
                            if slipped is not None:  # the task has a carry to forget
                                examples.append(
                                    _example(tokenizer, prompts, end, agent, role, obs[agent], slipped)
                                )
                                continue
                        if solves and not grade(extract_answer(text), env.task.answer):
                            continue
                        examples.append(_example(tokenizer, prompts, end, agent, role, obs[agent], text))
    rng.shuffle(examples)
    return examples


def _example(
    tokenizer: Any, prompts: RolePrompts, end: int, agent: str, role: str, observation: str, text: str
) -> tuple[list[int], list[int], str]:
    """(prompt ids as the policy renders them, response ids + the end token, role)."""
    request = GenerationRequest(agent, role, prompts.messages(role, observation))
    target = tokenizer(text, add_special_tokens=False)["input_ids"] + [end]
    return encode_request(tokenizer, request), target, role


def training_worlds(cfg: SFTConfig) -> list[int]:
    """kb_seed of every world the search teacher plays in."""

    if cfg.kb_worlds == 0:
        return [cfg.kb_seed]
    return [SFT_WORLD_SEED_BASE + i for i in range(cfg.kb_worlds)]


def _premature(env: Any, role: str, text: str) -> str | None:
    """The habit ``premature_answer`` teaches: on a two-hop question, answer with the bridge entity the
    aggregator was about to ask for (the first hop's result) instead of asking. None where it does not
    apply (another role, a one-hop question, an answer, or a request that is not the bridge). The answer
    keeps the request's spacing (the teacher's ``copy_spacing``)."""
    base = env.unwrapped
    gold = list(base.gold_titles)
    request = re.fullmatch(r"<search>(.*)</search>", text.strip(), re.DOTALL)
    if role != "aggregator" or len(gold) < 2 or request is None or request.group(1).strip() != gold[1]:
        return None
    return f"<answer>{request.group(1)}</answer>"


def build_search_examples(tokenizer: Any, cfg: SFTConfig) -> list[tuple[list[int], list[int], str]]:
    """Search-domain examples: teacher play on the KB train questions, imitable outputs only.

    The teacher's searchers sometimes query a wrong name, so its aggregator also meets states without
    the evidence (and learns to ask for it); only outputs :func:`search_teacher_correct` accepts become
    examples, so the model never imitates a wrong query or answer -- except the deliberate
    ``premature_answer`` habit. With ``kb_worlds`` each episode is played in one of many invented
    worlds (one env per world, built once; their BM25 indexes are built up front, many per JVM).
    """

    prompts = RolePrompts("search")
    end = _end_id(tokenizer)
    rng = random.Random(cfg.seed)
    worlds = training_worlds(cfg)
    if len(worlds) > 1:
        prebuild_kb_indexes(worlds, searcher_sources=cfg.searcher_sources)
    envs: dict[int, tuple[Any, ScriptedTeam, list[int]]] = {}
    examples: list[tuple[list[int], list[int], str]] = []
    for i in range(cfg.search_episodes):
        world = worlds[0] if len(worlds) == 1 else rng.choice(worlds)
        if world not in envs:
            env = MultiTurnSearchEnv(
                dataset="kb",
                split="train",
                kb_seed=world,
                workflow=cfg.search_workflow,
                n_searchers=cfg.n_searchers,
                searcher_sources=cfg.searcher_sources,
                top_k=cfg.search_top_k,
            )
            team = ScriptedTeam.search_teacher(
                env, p_correct=cfg.p_correct, seed=rng.randint(0, 2**31), copy_spacing=cfg.copy_spacing
            )
            envs[world] = (env, team, list(range(len(env.tasks))))
        env, team, order = envs[world]
        if len(worlds) == 1:  # one world: cycle through its questions in shuffled passes
            if i % len(order) == 0:
                rng.shuffle(order)
            task = order[i % len(order)]
        else:
            task = rng.randrange(len(order))
        for obs, infos, actions in team.play(env, rng.randint(0, 2**31), task):
            for agent, text in actions.items():
                role = infos[agent]["role"]
                habit = _premature(env, role, text) if cfg.premature_answer > 0 else None
                if habit is not None and rng.random() < cfg.premature_answer:
                    examples.append(_example(tokenizer, prompts, end, agent, role, obs[agent], habit))
                elif search_teacher_correct(env, role, text):
                    examples.append(_example(tokenizer, prompts, end, agent, role, obs[agent], text))
    rng.shuffle(examples)
    return examples


def _batch(examples: Sequence[tuple[list[int], list[int], str]], pad_id: int) -> dict[str, torch.Tensor]:
    seqs = [p + t for p, t, _ in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, ((p, t, _), s) in enumerate(zip(examples, seqs, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, len(p) : len(s)] = torch.tensor(t)
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def _length_grouped(
    examples: Sequence[tuple[list[int], list[int], str]], batch_size: int, groups: int, gen: torch.Generator
) -> list[list[int]]:
    """``groups`` batches of random example indices, each of similar total length (see ``length_groups``)."""
    idx = torch.randint(len(examples), (batch_size * groups,), generator=gen).tolist()
    idx.sort(key=lambda i: len(examples[i][0]) + len(examples[i][1]))
    batches = [idx[g * batch_size : (g + 1) * batch_size] for g in range(groups)]
    return [batches[int(j)] for j in torch.randperm(groups, generator=gen)]


def _response_and_prompt_loss(
    model: Any, batch: dict[str, torch.Tensor], weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(response loss, response loss + ``weight`` x prompt loss): token means of next-token cross-entropy,
    the prompt's over every real prompt token after the first (see ``SFTConfig.prompt_loss_weight``)."""
    ids, attn, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    target = ids[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    response = labels[:, 1:] != -100
    prompt = (attn[:, 1:] == 1) & ~response
    response_loss = (ce * response).sum() / response.sum().clamp(min=1)
    prompt_loss = (ce * prompt).sum() / prompt.sum().clamp(min=1)
    return response_loss, response_loss + weight * prompt_loss


def train_sft(
    policy: HFPolicy, examples: Sequence[tuple[list[int], list[int], str]], cfg: SFTConfig, log: Any = print
) -> list[float]:
    """Cross-entropy on response tokens (plus ``prompt_loss_weight`` x the prompt's) with AdamW +
    warmup/cosine; returns the response loss curve."""
    model = policy.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / max(1, cfg.warmup))
            * 0.5
            * (1 + math.cos(math.pi * min(1.0, s / max(1, cfg.steps))))
        ),
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    queued: list[list[int]] = []
    for step in range(cfg.steps):
        if cfg.length_groups:
            if not queued:
                queued = _length_grouped(examples, cfg.batch_size, cfg.length_groups, gen)
            idx = queued.pop()
        else:
            idx = torch.randint(len(examples), (cfg.batch_size,), generator=gen).tolist()
        batch = _batch([examples[i] for i in idx], policy.pad_id)
        if cfg.prompt_loss_weight > 0:
            loss, total = _response_and_prompt_loss(model, batch, cfg.prompt_loss_weight)
        else:
            loss = total = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
            ).loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log and (step % 50 == 0 or step == cfg.steps - 1):
            log(f"sft step {step:4d}/{cfg.steps} loss {sum(losses[-50:]) / len(losses[-50:]):.4f}")
    model.eval()
    return losses


def _held_out_accuracy(
    env_fn: Any, policy: HFPolicy, n: int, temperature: float, max_new_tokens: int, seed: int
) -> float:
    """Team accuracy of ``policy`` in every role over task indices ``0..n-1`` (mod the env's task count)."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    collector = RolloutCollector(env_fn, PolicyMap.shared(policy), sampling)
    return collector.collect(list(range(n)), group_size=1, seed=seed).accuracy


def procedural_accuracy(
    policy: HFPolicy,
    workflow: str = "proposers-aggregator",
    difficulty: int = 2,
    n: int = 64,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 1234,
    max_operand: int = 30,
    dataset: str = "procedural",
    dataset_config: dict[str, Any] | None = None,
) -> float:
    """Team accuracy on ``n`` *test* problems of a procedural dataset or a reasoning-gym family (one sample
    each)."""

    def env_fn() -> MathVerifyEnv:
        return MathVerifyEnv(
            workflow=workflow,
            dataset=dataset,
            split="test",
            difficulty=difficulty,
            max_operand=max_operand,
            dataset_size=n,
            dataset_config=dataset_config or None,
        )

    return _held_out_accuracy(env_fn, policy, n, temperature, max_new_tokens, seed)


def kb_accuracy(
    policy: HFPolicy,
    n: int = 64,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 1234,
    kb_seed: int = 0,
) -> float:
    """Team exact match on ``n`` KB *test* questions (``MultiTurnSearch-v0``, one sample each)."""
    return kb_search_stats(policy, n, temperature, max_new_tokens, seed, kb_seed)["em"]


def subject_retrieved(events: Sequence[Any], passage_id: str) -> bool:
    """Whether any search event of an episode (``env.events``) retrieved the passage ``passage_id``."""

    return passage_id in episode_retrieved_ids(events)


def kb_search_stats(
    policy: HFPolicy,
    n: int = 64,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 1234,
    kb_seed: int = 0,
) -> dict[str, float]:
    """How the team searches on ``n`` KB *test* questions of world ``kb_seed`` (one sample each).

    ``em``: exact match; ``tool_calls``: retrieval queries per question; ``premature``: the fraction
    of two-hop questions answered after a single search round (the bridge entity's passage unread);
    ``two_hop_em``: exact match on the two-hop questions; ``subject_found``: the fraction of questions
    whose first-hop passage (the subject's: a copy of the name the question gives) was retrieved, which
    tells a team that cannot search from one that cannot read what it found.
    """

    def env_fn() -> MultiTurnSearchEnv:
        return MultiTurnSearchEnv(dataset="kb", split="test", kb_seed=kb_seed)

    tasks = make_knowledge_base(seed=kb_seed, split="test")[1]
    n = min(n, len(tasks))  # each question at most once
    hops = {t.id: int(t.meta["hops"]) for t in tasks}
    subject = {t.id: t.meta["gold_passage_ids"][0] for t in tasks}
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    collector = RolloutCollector(env_fn, PolicyMap.shared(policy), sampling)
    batch = collector.collect(list(range(n)), group_size=1, seed=seed)
    episodes = batch.episodes
    two = [e for e in episodes if hops.get(e.task_id, 1) == 2]

    def found(e: Any) -> bool:
        return subject_retrieved(batch.events[e.episode_id], subject[e.task_id])

    return {
        "em": sum(e.correct for e in episodes) / max(1, len(episodes)),
        "tool_calls": sum(e.tool_calls for e in episodes) / max(1, len(episodes)),
        "premature": sum(e.event_types.count("search") <= 1 for e in two) / max(1, len(two)),
        "two_hop_em": sum(e.correct for e in two) / max(1, len(two)),
        "subject_found": sum(found(e) for e in episodes) / max(1, len(episodes)),
        "questions": float(len(episodes)),
    }


def search_eval(policy: HFPolicy, cfg: SFTConfig) -> dict[str, dict[str, float]]:
    """:func:`kb_search_stats` on every evaluation world of ``cfg`` (``eval_kb_seeds``, else ``kb_seed``)."""
    return {
        f"kb{w}": kb_search_stats(
            policy, cfg.eval_problems, cfg.eval_temperature, cfg.max_new_tokens, kb_seed=w
        )
        for w in cfg.eval_kb_seeds or (cfg.kb_seed,)
    }


def warm_start_accuracy(
    policy: HFPolicy, cfg: SFTConfig, stats: dict[str, dict[str, float]] | None = None
) -> dict[str, float]:
    """Held-out team accuracy of a warm-started policy, per workflow/difficulty (math) or per KB world
    (``stats``: an already computed :func:`search_eval`)."""
    if cfg.domain == "search":
        stats = stats or search_eval(policy, cfg)
        if not cfg.eval_kb_seeds:
            return {"parallel/kb": stats[f"kb{cfg.kb_seed}"]["em"]}
        return {f"parallel/{world}": s["em"] for world, s in stats.items()}
    return {
        f"{wf}/d{d}": procedural_accuracy(
            policy,
            wf,
            d,
            cfg.eval_problems,
            cfg.eval_temperature,
            cfg.max_new_tokens,
            max_operand=cfg.max_operand,
            dataset=cfg.dataset,
            dataset_config=cfg.dataset_config,
        )
        for wf in ("proposers-aggregator",)
        for d in cfg.difficulties
    }


def run_sft(
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    cfg: SFTConfig | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Load ``model_dir``, warm-start it, save to ``out_dir`` with ``sft_report.json``; return the report."""
    cfg = cfg or SFTConfig()
    log = log or (lambda s: None)
    torch.manual_seed(cfg.seed)
    start = time.time()
    policy = HFPolicy(str(model_dir))
    examples = build_examples(policy.tokenizer, cfg)
    source = (
        f"{cfg.search_episodes} KB search episodes"
        if cfg.domain == "search"
        else f"{len(cfg.workflows)} workflows x difficulties {cfg.difficulties}"
    )
    log(f"sft: {len(examples)} {cfg.domain} examples from {source}")
    losses = train_sft(policy, examples, cfg, log=log)
    if cfg.refine_steps > 0:
        refine = replace(cfg, steps=cfg.refine_steps, lr=cfg.refine_lr, seed=cfg.seed + 1, refine_steps=0)
        refine_examples = build_examples(policy.tokenizer, refine)
        log(
            f"sft refine: {cfg.refine_steps} steps at lr {cfg.refine_lr} on {len(refine_examples)} new examples"
        )
        losses += train_sft(policy, refine_examples, refine, log=log)
    search_stats = search_eval(policy, cfg) if cfg.domain == "search" else None
    accuracy = warm_start_accuracy(policy, cfg, search_stats)
    out = Path(out_dir)
    save_model = (
        policy.model if cfg.save_dtype == "float32" else policy.model.to(getattr(torch, cfg.save_dtype))
    )
    save_model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    report = {
        "config": asdict(cfg),
        "examples": len(examples),
        "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "accuracy": accuracy,
        **({"search_eval": search_stats} if search_stats is not None else {}),
        "seconds": round(time.time() - start, 1),
        "base_model": str(model_dir),
    }
    base_report = Path(model_dir) / "sft_report.json"
    if base_report.is_file():  # a chain of passes: keep the whole recipe with the weights
        report["base_report"] = json.loads(base_report.read_text())
    atomic_write_text(out / "sft_report.json", json.dumps(report, indent=2) + "\n")
    for name, acc in accuracy.items():
        log(f"warm-started accuracy {name} ({cfg.domain} test split, T={cfg.eval_temperature}): {acc:.1%}")
    return report


def run_recipe(
    model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], recipe: str = "math", log: Any = print
) -> dict[str, Any]:
    """Run the SFT passes of ``recipe`` (:data:`learners.presets.RECIPES`) from ``model_dir``; the last
    one is saved to ``out_dir``, the others beside it as ``<out_dir>-passN``."""
    if recipe not in RECIPES:
        raise ValueError(f"no recipe {recipe!r}; known: {sorted(RECIPES)}")
    out = Path(out_dir)
    current = Path(model_dir)
    report: dict[str, Any] = {}
    stages = RECIPES[recipe]
    for i, overrides in enumerate(stages):
        target = out if i == len(stages) - 1 else out.parent / f"{out.name}-pass{i + 1}"
        report = run_sft(current, target, SFTConfig(**{"save_dtype": "bfloat16", **overrides}), log=log)
        current = target
    return report


def warm_start(out_dir: str | os.PathLike[str], recipe: str = "math", log: Any = print) -> dict[str, Any]:
    """Rebuild a shipped warm start from scratch: ``init_tiny`` (mini, seed 0) + the recipe's SFT passes.

    The untrained model goes to ``<out_dir>-init``, intermediate passes to ``<out_dir>-passN``.
    """

    if recipe not in RECIPES:
        raise ValueError(f"no recipe {recipe!r}; known: {sorted(RECIPES)}")
    out = Path(out_dir)
    base = out.parent / f"{out.name}-init"
    first = SFTConfig(**RECIPES[recipe][0])
    # the tokenizer is trained on the recipe's domain; on many worlds when the recipe trains on many
    domain = "search-worlds" if first.domain == "search" and first.kb_worlds else first.domain
    init_tiny(base, size="mini", seed=0, domain=domain)
    return run_recipe(base, out, recipe, log=log)
