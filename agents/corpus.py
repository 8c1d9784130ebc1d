"""What a tiny model's tokenizer is trained on: its special tokens and the texts of each domain.

A domain is the kind of env a model is built for: ``math`` (the math envs' prompts, candidate
solutions and verdicts) or ``search`` (the KB search env's questions, queries, passages and answers).
:func:`default_corpus` plays the domain's env with a scripted team and keeps every observation and
action (:func:`math_corpus`, :func:`search_corpus`), so the BPE learns the words the model will
actually read and write, and adds :func:`fallback_corpus`, general procedural text (LaTeX, chat turns,
made-up words, unicode) that fills the vocabulary to ~3.5k tokens so the tokenizer also handles text
the envs do not produce.

This lives in ``agents`` (not beside the tasks in ``srpo_envs``) because playing an env needs the
scripted agents, and the env package must not depend on the agent package.
"""

from __future__ import annotations

import random

from agents.scripted import ScriptedTeam
from srpo_envs.math_verify import MathVerifyEnv
from srpo_envs.search import MultiTurnSearchEnv
from srpo_envs.tasks.knowledge_base import SFT_WORLD_SEED_BASE, make_knowledge_base

#: Special tokens, in id order (ids 0..3).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
EOS_TOKEN, IM_START, IM_END, PAD_TOKEN = SPECIAL_TOKENS


#: Domains a tiny tokenizer can be trained for: the math envs' texts, or the KB search env's in world 0
#: (``search``) or across many training worlds (``search-worlds``, for a warm start that must read).
CORPORA = ("math", "search", "search-worlds")


def math_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Texts of the math envs: every math workflow played by a noisy scripted team on procedural tasks."""

    texts: list[str] = []
    rng = random.Random(seed)
    workflows = ("proposers-aggregator", "solver-verifier", "routed")
    per = max(1, n // (len(workflows) * 4))
    for workflow in workflows:
        for difficulty in (1, 2, 3):
            env = MathVerifyEnv(
                workflow=workflow, dataset="procedural", difficulty=difficulty, dataset_size=per
            )
            team = ScriptedTeam.noisy_oracle(env, p_correct=0.6, seed=rng.randint(0, 2**31))
            for i in range(per):
                for obs, _, actions in team.play(env, rng.randint(0, 2**31), i):
                    texts.extend(obs[a] for a in env.active_agents)
                    texts.extend(actions.values())
    return texts[: max(n, 1)] if len(texts) > n else texts


#: Invented worlds the ``search-worlds`` tokenizer reads (the first ones a many-world warm start trains on).
SEARCH_TOKENIZER_WORLDS = 16


def search_corpus(n: int = 4000, seed: int = 0, kb_seed: int = 0, worlds: int = 0) -> list[str]:
    """Texts of the KB search env: passages, then the search teacher's play on the train questions.

    The passages come first so the BPE learns the invented names' syllables. ``worlds`` = 0: every
    passage of the world ``kb_seed`` and play in it (the ``search`` corpus). ``worlds`` = N: passages
    and play spread over the first N training worlds (``SFT_WORLD_SEED_BASE`` + i, never an evaluation
    world; the ``search-worlds`` corpus). Why several: in one world every name recurs often enough to
    become about one token - a world-0 tokenizer splits its own names into ~1.9 tokens and an unseen
    world's into ~5.7 - while a model that reads must copy names it has never seen; a 16-world
    tokenizer splits seen and unseen worlds' names alike (~4.8). Its teacher writes names with
    ``copy_spacing``, as the ``search-worlds`` recipe's teacher does.
    """

    if worlds < 0:
        raise ValueError(f"worlds must be >= 0, got {worlds}")
    rng = random.Random(seed)
    i = 0
    if worlds == 0:
        passages, _ = make_knowledge_base(seed=kb_seed, split="train")
        texts: list[str] = [f"({p.title}) {p.text}" for p in passages]
        env = MultiTurnSearchEnv(dataset="kb", split="train", kb_seed=kb_seed)
        team = ScriptedTeam.search_teacher(env, p_correct=0.7, seed=seed)
        while len(texts) < n:
            for obs, _, actions in team.play(env, rng.randint(0, 2**31), i % len(env.tasks)):
                texts.extend(obs[a] for a in env.active_agents)
                texts.extend(actions.values())
            i += 1
        return texts[:n]
    seeds = [SFT_WORLD_SEED_BASE + w for w in range(worlds)]
    texts = []
    for world in seeds:
        passages, _ = make_knowledge_base(seed=world, split="train")
        texts += [f"({p.title}) {p.text}" for p in passages[: max(1, n // (2 * worlds))]]
    while len(texts) < n:
        env = MultiTurnSearchEnv(dataset="kb", split="train", kb_seed=seeds[i % len(seeds)])
        team = ScriptedTeam.search_teacher(env, p_correct=0.7, seed=rng.randint(0, 2**31), copy_spacing=True)
        for _ in range(4):
            for obs, _, actions in team.play(env, rng.randint(0, 2**31), rng.randrange(len(env.tasks))):
                texts.extend(obs[a] for a in env.active_agents)
                texts.extend(actions.values())
        i += 1
    return texts[:n]


def default_corpus(n: int = 4000, seed: int = 0, domain: str = "math") -> list[str]:
    """Tokenizer training text of a domain: the env's own texts plus :func:`fallback_corpus`."""
    if domain not in CORPORA:
        raise ValueError(f"domain must be one of {CORPORA}, got {domain!r}")
    if domain == "search-worlds":
        env_texts = search_corpus(n, seed, worlds=SEARCH_TOKENIZER_WORLDS)
    else:
        env_texts = search_corpus(n, seed) if domain == "search" else math_corpus(n, seed)
    return list(env_texts) + fallback_corpus(n, seed)


_WORD_TEXT = (
    "the a of to and is in that it for on with as are be this by we let find so then answer solve "
    "compute total number sum product difference each value step first next finally check verify "
    "solution correct wrong problem question agent solver verifier proposer aggregator because since "
    "therefore thus hence which gives equals more less than twice half apples books coins students "
    "minutes hours days price cost area perimeter square root integer prime even odd fraction"
)
_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
_UNICODE = ("café", "naïve", "π", "≤", "≥", "×", "÷", "√", "∞", "°", "€", "日本語", "ñ", "😀", "→", "α", "β")


_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "pl")  # fmt: skip
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck")


def _pseudo_word(rng: random.Random) -> str:
    """A pronounceable made-up word: gives the BPE trainer enough distinct merges for a ~4k vocab."""
    word = "".join(
        rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3))
    )
    return word.capitalize() if rng.random() < 0.15 else word


def fallback_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Procedural text in the shapes the envs produce: arithmetic with worked solutions, LaTeX, chat.

    Deterministic for ``(n, seed)``; fills the vocabulary beyond what the envs' own texts need.
    """
    rng = random.Random(seed)
    out: list[str] = []
    ops = [("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b)]
    for i in range(n):
        kind = i % 5
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        sym, fn = rng.choice(ops)
        if kind == 0:
            out.append(
                f"Problem: What is {a} {sym} {b}?\nSolution: We compute {a} {sym} {b} = {fn(a, b)}.\n"
                f"The answer is \\boxed{{{fn(a, b)}}}."
            )
        elif kind == 1:
            out.append(
                f"$\\frac{{{a}}}{{{b}}} + \\sqrt{{{b}}} \\times {a}^{{2}} \\le \\left( x_{{{b}}} \\right)$ "
                f"so $x \\in [{-b}, {a}]$ and \\boxed{{\\frac{{{a}}}{{{b}}}}}"
            )
        elif kind == 2:
            role = rng.choice(["solver", "verifier", "proposer", "aggregator"])
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20)))
            out.append(
                f"{IM_START}system\nYou are the {role}.{IM_END}\n{IM_START}user\n{words}?{IM_END}\n"
                f"{IM_START}assistant\n{words.capitalize()}. \\boxed{{{a}}}{IM_END}\n"
            )
        elif kind == 3:
            words = [
                rng.choice(_WORDS) if rng.random() < 0.6 else _pseudo_word(rng)
                for _ in range(rng.randint(8, 30))
            ]
            if rng.random() < 0.5:
                words.insert(rng.randrange(len(words)), rng.choice(_UNICODE))
            sep = rng.choice([" ", "  ", "\n", "\n\n", "\t", ", "])
            out.append(sep.join(words) + rng.choice([".", "!", "?", ":", ";"]))
        else:
            out.append(
                f"Step 1: {a} {sym} {b} = {fn(a, b)}\nStep 2: {fn(a, b)} + {b} = {fn(a, b) + b}\n"
                f"Answer: {fn(a, b) + b}{EOS_TOKEN}"
            )
    return out
