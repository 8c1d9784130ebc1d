"""A procedural knowledge base: invented entities, short passages, 1-hop and 2-hop questions.

Why: real QA benchmarks are too hard for a tiny CPU model and leak pre-training knowledge. Here
every fact is invented (names are built from random syllables), so the only way to answer is to
search, and a ~200-entity world is small enough that a tiny model can learn the
search -> read -> answer loop on CPU in minutes.

The world: countries, cities, companies and people.

* city ``located_in`` country; country ``capital`` city (one of its cities);
* company ``founded_by`` person, ``headquartered_in`` city, ``founded_in`` year;
* person ``born_in`` city, ``born_year``, ``profession``, ``works_for`` company.

Every relation is a function of its subject, and every name is unique, so each answer is
uniquely determined. Each entity gets one passage (title = its name) stating only its own facts,
so the gold passage of a 1-hop question is the passage of the entity it names, and a 2-hop
question needs the subject's passage to find a bridge entity, then the bridge's passage.

The world is a pure function of ``(n_entities, seed)``. The train/test split is a hash bucket of
the question text, so train and test never share a question (they do share the world: test
measures answering unseen questions about seen passages; use another seed for an unseen world).
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field

from srpo_envs.retrievers.base import Passage
from srpo_envs.tasks.search_data import QATask

TEST_BUCKETS = 2  # of 10: ~20% of questions are test questions
#: First kb_seed of the worlds a many-world warm start trains on (``learners.sft`` ``kb_worlds``). Seeds
#: below it -- 0, the quick-search world, and the small seeds used as unseen evaluation worlds -- are
#: never trained on, so an answer there has to come from what the model retrieves and reads.
SFT_WORLD_SEED_BASE = 1000

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "st",
    "th",
    "tr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "l", "n", "r", "s", "m", "k"]
_COUNTRY_SUFFIX = ["ia", "land", "stan", "ora", "mark"]
_CITY_SUFFIX = ["port", "ford", "holm", "ton", "grad", "vale", "burg"]
_COMPANY_SUFFIX = ["Systems", "Labs", "Works", "Foods", "Motors", "Textiles", "Shipping", "Pharma"]
_PROFESSIONS = [
    "architect",
    "chemist",
    "painter",
    "engineer",
    "violinist",
    "surgeon",
    "journalist",
    "botanist",
]


@dataclass
class _World:
    countries: list[str]
    cities: list[str]
    companies: list[str]
    people: list[str]
    city_country: dict[str, str] = field(default_factory=dict)
    capital: dict[str, str] = field(default_factory=dict)
    founder: dict[str, str] = field(default_factory=dict)
    hq: dict[str, str] = field(default_factory=dict)
    founded: dict[str, int] = field(default_factory=dict)
    born_in: dict[str, str] = field(default_factory=dict)
    born_year: dict[str, int] = field(default_factory=dict)
    profession: dict[str, str] = field(default_factory=dict)
    employer: dict[str, str] = field(default_factory=dict)


class _Names:
    """Unique invented words: no two stems equal, case-insensitively, across the whole world."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()

    def stem(self, syllables: int) -> str:
        for _ in range(10_000):
            word = "".join(
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                for _ in range(syllables)
            )
            if len(word) >= 4 and word not in self.used:
                self.used.add(word)
                return word
        raise RuntimeError("ran out of invented names; lower n_entities")


def _build_world(n_entities: int, seed: int) -> _World:
    rng = random.Random(f"srpo-kb:{n_entities}:{seed}")
    names = _Names(rng)
    n_countries = max(2, n_entities // 20)
    n_cities = max(2 * n_countries, n_entities // 5)
    n_companies = max(2, n_entities // 5)
    n_people = n_entities - n_countries - n_cities - n_companies
    countries = [names.stem(2).capitalize() + rng.choice(_COUNTRY_SUFFIX) for _ in range(n_countries)]
    cities = [names.stem(2).capitalize() + rng.choice(_CITY_SUFFIX) for _ in range(n_cities)]
    companies = [f"{names.stem(2).capitalize()} {rng.choice(_COMPANY_SUFFIX)}" for _ in range(n_companies)]
    people = [f"{names.stem(2).capitalize()} {names.stem(2).capitalize()}" for _ in range(n_people)]
    w = _World(countries, cities, companies, people)
    for i, city in enumerate(cities):  # round-robin first, so every country has at least two cities
        w.city_country[city] = countries[i % n_countries] if i < 2 * n_countries else rng.choice(countries)
    for country in countries:
        w.capital[country] = rng.choice([c for c in cities if w.city_country[c] == country])
    for person in people:
        w.born_in[person] = rng.choice(cities)
        w.born_year[person] = rng.randint(1940, 2000)
        w.profession[person] = rng.choice(_PROFESSIONS)
        w.employer[person] = rng.choice(companies)
    for company in companies:
        w.founder[company] = rng.choice(people)
        w.hq[company] = rng.choice(cities)
        w.founded[company] = rng.randint(1900, 2020)
    return w


def _passages(w: _World, pid: dict[str, str]) -> list[Passage]:
    out = []
    for c in w.countries:
        text = f"{c} is a country. The capital of {c} is {w.capital[c]}."
        out.append(Passage(pid[c], c, text))
    for c in w.cities:
        text = f"{c} is a city in the country of {w.city_country[c]}."
        out.append(Passage(pid[c], c, text))
    for c in w.companies:
        text = f"{c} is a company founded in {w.founded[c]} by {w.founder[c]}. Its headquarters are in {w.hq[c]}."
        out.append(Passage(pid[c], c, text))
    for p in w.people:
        article = "an" if w.profession[p][0] in "aeiou" else "a"
        text = (
            f"{p} is {article} {w.profession[p]} born in {w.born_year[p]} in the city of {w.born_in[p]}. "
            f"{p} works for {w.employer[p]}."
        )
        out.append(Passage(pid[p], p, text))
    return out


def _questions(w: _World, pid: dict[str, str]) -> list[tuple[str, str, str, list[str]]]:
    """(relation, question, answer, gold passage ids in hop order). Entities are passed as names;
    the gold chain is the subject's passage, then (2-hop) the bridge entity's passage."""
    q: list[tuple[str, str, str, list[str]]] = []

    def add(relation: str, question: str, answer: object, *chain: str) -> None:
        q.append((relation, question, str(answer), [pid[name] for name in chain]))

    for c in w.countries:
        add("capital", f"What is the capital of {c}?", w.capital[c], c)
    for c in w.cities:
        add("city_country", f"In which country is the city of {c}?", w.city_country[c], c)
    for c in w.companies:
        f, h = w.founder[c], w.hq[c]
        add("founder", f"Who founded {c}?", f, c)
        add("headquarters", f"In which city is {c} headquartered?", h, c)
        add("founded_year", f"In what year was {c} founded?", w.founded[c], c)
        add("hq_country", f"In which country is {c} headquartered?", w.city_country[h], c, h)
        add("founder_birthplace", f"In which city was the founder of {c} born?", w.born_in[f], c, f)
        add("founder_birth_year", f"In what year was the founder of {c} born?", w.born_year[f], c, f)
    for p in w.people:
        b, e = w.born_in[p], w.employer[p]
        add("born_in", f"In which city was {p} born?", b, p)
        add("born_year", f"In what year was {p} born?", w.born_year[p], p)
        add("profession", f"What is the profession of {p}?", w.profession[p], p)
        add("works_for", f"Which company does {p} work for?", e, p)
        add("birth_country", f"In which country was {p} born?", w.city_country[b], p, b)
        add("employer_founder", f"Who founded the company that {p} works for?", w.founder[e], p, e)
        add("employer_hq", f"In which city is the company that {p} works for headquartered?", w.hq[e], p, e)
    return q


def _split_of(question: str) -> str:
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 10
    return "test" if bucket < TEST_BUCKETS else "train"


def make_knowledge_base(
    n_entities: int = 200, seed: int = 0, split: str = "train", max_hops: int = 2
) -> tuple[list[Passage], list[QATask]]:
    """Return ``(corpus, tasks)`` for one invented world.

    ``corpus`` has one passage per entity (``n_entities`` in all; ids ``kb<seed>-<kind><i>``) and
    is the same for every split. ``tasks`` are the questions of ``split`` (``train``, ``test`` or
    ``all``) with at most ``max_hops`` hops (1 or 2), in a fixed order. Task ``meta`` holds
    ``hops``, ``relation``, ``gold_passage_ids`` (hop order), ``evidence_in_corpus=True`` and the
    world's ``kb_seed``/``kb_size``. 200 entities give ~1,000 questions.
    """
    if n_entities < 20:
        raise ValueError("n_entities must be >= 20 (a few countries, cities, companies and people)")
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    if max_hops not in (1, 2):
        raise ValueError("max_hops must be 1 or 2")
    corpus, tasks = _cached_world(int(n_entities), int(seed), split, int(max_hops))
    return list(corpus), list(tasks)


#: Worlds kept built per process. Why: a rollout makes one env per sample and every env of a pooled
#: ``kb_seed`` list loads every world (64 worlds: ~0.7 s and ~35 MB per env, gigabytes over a
#: rollout's envs); cached, the envs share one copy of each world's frozen passages and tasks.
#: 256 worlds hold ~150 MB; a warm start drawing from 1,024 worlds rebuilds the ones it evicted.
KB_CACHE_WORLDS = 256


@functools.lru_cache(maxsize=KB_CACHE_WORLDS)
def _cached_world(
    n_entities: int, seed: int, split: str, max_hops: int
) -> tuple[tuple[Passage, ...], tuple[QATask, ...]]:
    """One world's ``(corpus, tasks)`` as immutable tuples (:func:`make_knowledge_base` hands out list
    copies, so a caller's list edits never reach another caller)."""
    w = _build_world(n_entities, seed)
    pid: dict[str, str] = {}
    for kind, names in (
        ("country", w.countries),
        ("city", w.cities),
        ("company", w.companies),
        ("person", w.people),
    ):
        for i, name in enumerate(names):
            pid[name] = f"kb{seed}-{kind}{i}"
    corpus = _passages(w, pid)
    tasks = []
    for i, (relation, question, answer, gold) in enumerate(_questions(w, pid)):
        qsplit = _split_of(question)
        if len(gold) > max_hops or (split != "all" and qsplit != split):
            continue
        meta = {
            "hops": len(gold),
            "relation": relation,
            "gold_passage_ids": gold,
            "evidence_in_corpus": True,
            "split": qsplit,
            "kb_seed": seed,
            "kb_size": n_entities,
        }
        tasks.append(QATask(f"kb{seed}-n{n_entities}-q{i}", question, (answer,), "procedural_kb", meta))
    return tuple(corpus), tuple(tasks)
