"""Multi-turn retrieval env: parallel searchers query a real retriever, an aggregator answers.

==============  ======================================================================================
Make            ``srpo_envs.make("MultiTurnSearch-v0", dataset=..., retriever=...)``; registered
                presets: ``MultiTurnSearch-Routed-v0``, ``MultiTurnSearch-Team-v0`` (sources by kind),
                ``MultiTurnSearch-HotpotQA-v0``
Agents          ``searcher_0..n-1``, ``aggregator``; routed: ``router`` first
Spaces          observation and action: :class:`srpo_envs.spaces.UnicodeText` (any NUL-free string
                of at most ``max_obs_chars`` / ``max_action_chars``)
Event types     ``search``, ``aggregate``; routed: ``route``
Rewards         the team outcome at episode end (exact match, below), written to every event; minus
                ``format_penalty`` for an event holding an invalid output
Datasets        ``dataset="kb"`` (the procedural knowledge base, :mod:`srpo_envs.tasks.knowledge_base`;
                ``kb_seed`` picks its invented world, a list of seeds pools several worlds' questions
                over one corpus), a bundled QA set (``hotpotqa``, ...), a local file or a hub id
                (:func:`srpo_envs.tasks.search_data.load_qa`)
==============  ======================================================================================

Each turn is two events:

* ``search`` (K = number of acting searchers): every searcher emits ``<search>query</search>``; all
  queries are consumed by *one* retrieval transition, and the passages join the shared state as
  environment text (shown to agents between ``<information>`` tags, never part of a response, so
  learners never put it in the loss);
* ``aggregate`` (K=1): the aggregator reads the question and the evidence so far and either answers
  with ``<answer>...</answer>`` (episode ends) or asks for another turn with ``<search>...</search>``
  (its text becomes a hint for the searchers). On the last turn it must answer.

The ``routed`` variant starts with a ``route`` event (K=1): the router's ``\\boxed{k}`` picks how many
searchers act in every turn. Reward: SQuAD-normalised exact match against any gold answer; F1 is
reported as a secondary metric. Search events record their tool calls (``info["tool_calls"]``).
``member_cost`` (default 0) is subtracted from the team reward per searcher per search event, so a
routed team pays for every member it sends. ``index=DIR`` searches a prebuilt ``srpo index build``
directory instead of indexing the default corpus.

Sources (``searcher_sources``): with ``"shared"`` (the default) every searcher queries the whole corpus,
so searchers that send the same query bring the same passages and a larger team buys nothing. With
``"by-kind"`` (the invented worlds only, ``dataset="kb"``) each searcher consults its own source:
``searcher_i`` searches the passages of one entity kind, :data:`KB_SOURCES` in order (people, companies,
cities, countries; a fifth searcher starts the cycle again), like a team whose members own a people
directory, a company registry and a gazetteer. A question then needs as many searchers as the furthest
source of its gold passages: a question about a person one, about a company two, a city three, a
country four (``needed_searchers``), and a member beyond that only costs. The prompts do not change.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srpo_envs.base import EventParallelEnv, Parsed, Transition, parse_route
from srpo_envs.index_build import open_index
from srpo_envs.qa_metrics import exact_match, f1
from srpo_envs.retrievers import corpus_fingerprint, make_retriever
from srpo_envs.retrievers.base import Retriever
from srpo_envs.retrievers.bm25 import build_lucene_indexes
from srpo_envs.tasks.knowledge_base import make_knowledge_base
from srpo_envs.tasks.search_data import bundled_corpus_path, load_qa

_SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL | re.IGNORECASE)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
MAX_QUERY_CHARS = 512
MAX_ANSWER_CHARS = 512
SEARCH_WORKFLOWS = ("parallel", "routed")
#: What each searcher searches: the whole corpus, or (invented worlds) its own kind of entity.
SEARCHER_SOURCES = ("shared", "by-kind")
#: The invented worlds' sources in searcher order under ``searcher_sources="by-kind"``: the largest
#: first (most questions are about people), so a router's K is how many sources it consults.
KB_SOURCES = ("person", "company", "city", "country")
_KB_KIND_RE = re.compile(r"^kb-?\d+-(person|company|city|country)\d+$")


def _last(pattern: re.Pattern[str], text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1].strip() if found else None


class MultiTurnSearchEnv(EventParallelEnv):
    """A team searches a corpus over several turns and answers a question; see module docstring."""

    metadata = {"name": "multi_turn_search_v0", "render_modes": ["ansi", "human"], "is_parallelizable": True}

    def __init__(
        self,
        dataset: str = "kb",
        *,
        workflow: str = "parallel",
        tasks: Sequence[Any] | None = None,
        retriever: Retriever | str = "bm25",
        corpus: Any = None,
        retriever_url: str | None = None,
        split: str | None = None,
        dataset_size: int | None = None,
        n_searchers: int = 2,
        max_turns: int = 2,
        top_k: int = 3,
        passage_chars: int = 300,
        default_route: int = 1,
        format_penalty: float = 0.1,
        member_cost: float = 0.0,
        index: str | Path | None = None,
        kb_seed: int | Sequence[int] = 0,
        searcher_sources: str = "shared",
        render_mode: str | None = None,
    ) -> None:
        if workflow not in SEARCH_WORKFLOWS:
            raise ValueError(f"workflow must be one of {SEARCH_WORKFLOWS}, got {workflow!r}")
        if searcher_sources not in SEARCHER_SOURCES:
            raise ValueError(f"searcher_sources must be one of {SEARCHER_SOURCES}, got {searcher_sources!r}")
        if searcher_sources == "by-kind" and (
            dataset != "kb" or index is not None or corpus is not None or retriever_url is not None
        ):
            raise ValueError(
                "searcher_sources='by-kind' splits an invented world's passages by entity kind: it needs "
                "dataset='kb' and the world's own corpus (no index=, corpus= or retriever_url=)"
            )
        if n_searchers < 1 or max_turns < 1 or top_k < 1:
            raise ValueError("need n_searchers, max_turns and top_k >= 1")
        self.workflow = workflow
        self.dataset = dataset
        self.n_searchers = int(n_searchers)
        self.max_turns = int(max_turns)
        self.top_k = int(top_k)
        self.passage_chars = int(passage_chars)
        self.default_route = min(max(1, int(default_route)), self.n_searchers)
        if member_cost < 0:
            raise ValueError(f"member_cost must be >= 0, got {member_cost}")
        self.member_cost = float(member_cost)
        self.tasks, default_corpus = _load_tasks(dataset, tasks, split, dataset_size, kb_seed)
        if index is not None:
            if retriever_url is not None or corpus is not None:
                raise ValueError(
                    "index= names the corpus and backend; do not combine it with corpus/retriever_url"
                )

            self.retriever = open_index(index) if not isinstance(retriever, Retriever) else retriever
        else:
            self.retriever = _make_retriever(
                retriever, corpus if corpus is not None else default_corpus, retriever_url
            )
        self.searcher_sources = searcher_sources
        #: One retriever per source (``by-kind``), in :data:`KB_SOURCES` order; empty when shared.
        self.source_retrievers: list[Retriever] = []
        if searcher_sources == "by-kind":
            backend = retriever if isinstance(retriever, str) else retriever.name
            self.source_retrievers = [
                _make_retriever(backend, shard, None) for shard in split_by_kind(default_corpus)
            ]
        self.searchers = [f"searcher_{i}" for i in range(self.n_searchers)]
        agents = [*self.searchers, "aggregator"]
        if workflow == "routed":
            agents = ["router", *agents]
        super().__init__(
            agents, max_steps=2 * self.max_turns + 2, format_penalty=format_penalty, render_mode=render_mode
        )
        self.task = self.tasks[0]
        self._reset_state()

    def _reset_state(self) -> None:
        self._phase = "route" if self.workflow == "routed" else "search"
        self._turn = 0
        self._team_size = self.n_searchers
        self._hint = ""
        self._evidence: list[dict[str, Any]] = []  # {"turn", "query", "passages": [Passage]}
        self._answer: str | None = None
        self._history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ state machine
    def _reset_episode(self, options: dict[str, Any]) -> None:
        self.task = self._pick_task(self.tasks, options)
        self.task_id = self.task.id
        self._reset_state()

    def _active(self) -> tuple[str, ...]:
        if self._phase == "route":
            return ("router",)
        if self._phase == "search":
            return tuple(self.searchers[: self._team_size])
        return ("aggregator",)

    def _event_type(self) -> str:
        return self._phase

    def _parse(self, agent: str, text: str) -> Parsed:
        role = self.role_of(agent)
        if role == "router":
            return parse_route(text, self.n_searchers)
        if role == "searcher":
            query = _last(_SEARCH_RE, text)
            if not query:
                return Parsed(False, None, "no non-empty <search>query</search>")
            return Parsed(True, query[:MAX_QUERY_CHARS])
        answer = _last(_ANSWER_RE, text)
        if answer is not None and 0 < len(answer) <= MAX_ANSWER_CHARS:
            return Parsed(True, ("answer", answer))
        query = _last(_SEARCH_RE, text)
        if query is not None and self._turn + 1 < self.max_turns:
            return Parsed(True, ("search", query[:MAX_QUERY_CHARS]))
        if query is not None:
            return Parsed(False, None, "last turn: the aggregator must answer with <answer>...</answer>")
        return Parsed(False, None, "no <answer>...</answer> or <search>...</search>")

    def _transition(self, outputs: dict[str, str], parsed: dict[str, Parsed]) -> Transition:
        phase = self._phase
        self._history.append({"phase": phase, "turn": self._turn, "outputs": dict(outputs)})
        info: dict[str, Any] = {}
        done = False
        if phase == "route":
            p = parsed["router"]
            self._team_size = p.value if p.valid else self.default_route
            info["team_size"] = self._team_size
            self._phase = "search"
        elif phase == "search":
            queries = {a: p.value for a, p in parsed.items() if p.valid}
            results = self._retrieve(queries)
            for (agent, query), passages in zip(queries.items(), results, strict=True):
                self._evidence.append(
                    {"turn": self._turn, "agent": agent, "query": query, "passages": passages}
                )
            info["tool_calls"] = len(queries)
            # passages the team reads, and how many ``passage_chars`` cuts (the eval's truncation rate)
            info["inputs"] = sum(len(ps) for ps in results)
            info["inputs_truncated"] = sum(len(p.text) > self.passage_chars for ps in results for p in ps)
            info["queries"] = queries
            info["retrieved_ids"] = {a: [p.id for p in ps] for a, ps in zip(queries, results, strict=True)}
            if self.source_retrievers:
                info["sources"] = {a: self.searcher_source(a) for a in queries}
            self._phase = "aggregate"
        else:
            p = parsed["aggregator"]
            if p.valid and p.value[0] == "search":
                self._hint = p.value[1]
                self._turn += 1
                self._phase = "search"
                info["decision"] = "search"
            else:
                self._answer = p.value[1] if p.valid else None
                info["decision"] = "answer"
                info["answer"] = self._answer
                done = True
        return Transition(done=done, info=info)

    def searcher_source(self, agent: str) -> str:
        """The source ``agent`` searches: ``"corpus"`` when shared, else its kind in :data:`KB_SOURCES`."""
        if not self.source_retrievers:
            return "corpus"
        return KB_SOURCES[self.searchers.index(agent) % len(KB_SOURCES)]

    def _retrieve(self, queries: dict[str, str]) -> list[list[Any]]:
        """Passages for each searcher's query, in ``queries`` order: one batched call per retriever."""
        if not queries:
            return []
        if not self.source_retrievers:
            return self.retriever.search(list(queries.values()), self.top_k)
        by_source: dict[int, list[str]] = {}
        for agent in queries:
            by_source.setdefault(KB_SOURCES.index(self.searcher_source(agent)), []).append(agent)
        found: dict[str, list[Any]] = {}
        for source, agents in by_source.items():
            batch = self.source_retrievers[source].search([queries[a] for a in agents], self.top_k)
            found.update(zip(agents, batch, strict=True))
        return [found[a] for a in queries]

    @property
    def needed_searchers(self) -> int | None:
        """Fewest searchers that can reach every gold passage of the current task under ``by-kind``
        sources (the furthest gold source's position + 1); ``None`` when sources are shared or the task
        names no gold passages."""
        if not self.source_retrievers:
            return None
        kinds = [passage_kind(pid) for pid in (self.task.meta or {}).get("gold_passage_ids") or []]
        if not kinds or None in kinds:
            return None
        return 1 + max(KB_SOURCES.index(k) for k in kinds)

    def _outcome(self) -> tuple[float, dict[str, Any]]:
        golds = list(self.task.answers)
        em = exact_match(self._answer, golds) if self._answer is not None else 0.0
        f1_value = f1(self._answer, golds) if self._answer is not None else 0.0
        facts: dict[str, Any] = {
            "correct": bool(em),
            "em": float(em),
            "f1": float(f1_value),
            "answer": self._answer,
            "gold": golds[0] if golds else "",
            "turns": self._turn + 1,
            "tool_calls": sum(1 for _ in self._evidence),
        }
        if self.workflow == "routed":
            facts["team_size"] = self._team_size
        if self.needed_searchers is not None:
            facts["needed_searchers"] = self.needed_searchers
        reward = float(em)
        if self.member_cost:
            members = sum(len(h["outputs"]) for h in self._history if h["phase"] == "search")
            facts["member_cost"] = self.member_cost * members
            reward -= facts["member_cost"]
        return reward, facts

    def _shared_state(self) -> dict[str, Any]:
        return {
            "task_id": self.task.id,
            "question": self.task.question,
            "phase": self._phase,
            "turn": self._turn,
            "team_size": self._team_size,
            "hint": self._hint,
            "history": self._history,
            "evidence": [
                {"turn": e["turn"], "query": e["query"], "ids": [p.id for p in e["passages"]]}
                for e in self._evidence
            ],
        }

    # ------------------------------------------------------------------ text
    def _information(self) -> str:
        """Retrieved passages (deduplicated, in :meth:`_read_order`) as environment text."""
        seen: set[str] = set()
        lines = []
        for p in self._read_order():
            if p.id in seen:
                continue
            seen.add(p.id)
            lines.append(f"({p.title}) {_clip(p.text, self.passage_chars)}")
        if not lines:
            return "<information>none</information>"
        return "<information>\n" + "\n".join(lines) + "\n</information>"

    def _read_order(self) -> list[Any]:
        """Retrieved passages in the order the team reads them: retrieval order, except that with
        ``by-kind`` sources each turn's passages are merged by retrieval score (a federated search's
        merge), so the source that matched a query best comes first whatever its searcher's position."""
        if not self.source_retrievers:
            return [p for e in self._evidence for p in e["passages"]]
        ordered: list[Any] = []
        for turn in dict.fromkeys(e["turn"] for e in self._evidence):
            found = [p for e in self._evidence if e["turn"] == turn for p in e["passages"]]
            ordered += sorted(found, key=lambda p: -p.score)
        return ordered

    def _observe(self, agent: str) -> str:
        question = f"Question: {self.task.question}\n"
        turn = f"Turn {self._turn + 1} of {self.max_turns}.\n"
        if self._phase == "route":
            return (
                f"{question}Role: router. Decide how many searchers (1 to {self.n_searchers}) should look for "
                "evidence. Reply with the number in \\boxed{}."
            )
        if self._phase == "search":
            past = "; ".join(e["query"] for e in self._evidence) or "none"
            hint = f"Aggregator asks: {self._hint}\n" if self._hint else ""
            return (
                f"{question}{turn}Previous queries: {past}\n{hint}{self._information()}\n"
                "Role: searcher. Write one search query inside <search>...</search>."
            )
        last = self._turn + 1 >= self.max_turns
        ask = (
            "Answer now with <answer>...</answer>."
            if last
            else ("Answer with <answer>...</answer>, or ask for more evidence with <search>...</search>.")
        )
        return f"{question}{turn}{self._information()}\nRole: aggregator. {ask}"

    def state_text(self) -> str:
        lines = [f"Question: {self.task.question}", f"Phase: {self._phase or 'done'}; turn {self._turn + 1}"]
        for h in self._history:
            for agent, text in h["outputs"].items():
                lines.append(f"[{h['phase']}] {agent}: {_clip(text, 200)}")
        lines.append(self._information())
        return "\n".join(lines)

    @property
    def retrieved_ids(self) -> list[str]:
        """Ids of every passage retrieved so far in the episode, in retrieval order, without repeats."""
        return list(dict.fromkeys(p.id for e in self._evidence for p in e["passages"]))

    @property
    def gold_titles(self) -> list[str]:
        """Titles of the current task's gold passages (subject first for 2-hop KB questions)."""
        meta = self.task.meta or {}
        titles = list(meta.get("gold_titles") or meta.get("supporting_titles") or [])
        if titles:
            return titles
        found = (self.passage_title(pid) for pid in meta.get("gold_passage_ids") or [])
        return [t for t in found if t]

    @property
    def answer(self) -> str:
        """The first gold answer (what an oracle agent knows)."""
        return self.task.answers[0]

    def passage_title(self, passage_id: str) -> str | None:
        """Title of a corpus passage, where the retriever holds the corpus locally."""
        by_id = getattr(self.retriever, "_by_id", None)
        passage = by_id.get(passage_id) if by_id else None
        return passage.title if passage is not None else None


def episode_retrieved_ids(events: Sequence[Any]) -> set[str]:
    """Ids of every passage the search events of an episode (``env.events``) retrieved, read from the
    ``info["retrieved_ids"]`` each search transition records; empty for events that hold none."""
    return {
        pid
        for e in events
        for ids in ((getattr(e, "info", None) or {}).get("retrieved_ids") or {}).values()
        for pid in ids
    }


def passage_kind(passage_id: str) -> str | None:
    """The entity kind of an invented world's passage id (``kb3-company7`` -> ``company``); ``None`` for
    any other id."""
    found = _KB_KIND_RE.match(passage_id)
    return found.group(1) if found else None


def split_by_kind(passages: Sequence[Any]) -> list[list[Any]]:
    """An invented world's passages (one world or several pooled) as one list per :data:`KB_SOURCES` kind,
    in that order; ``ValueError`` if a passage id names no kind or a kind has no passage."""
    shards: dict[str, list[Any]] = {k: [] for k in KB_SOURCES}
    for p in passages:
        kind = passage_kind(p.id)
        if kind is None:
            raise ValueError(f"passage id {p.id!r} is not an invented world's (kb<seed>-<kind><i>)")
        shards[kind].append(p)
    empty = [k for k, ps in shards.items() if not ps]
    if empty:
        raise ValueError(f"no passages of kind {empty} to give their searchers")
    return [shards[k] for k in KB_SOURCES]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _load_tasks(
    dataset: str,
    tasks: Sequence[Any] | None,
    split: str | None,
    size: int | None,
    kb_seed: int | Sequence[int],
) -> tuple[list[Any], Any]:
    """Tasks and the default corpus for them (the KB's own passages, or the bundled paragraphs).

    Several ``kb_seed`` s pool their worlds: every world's questions (world by world, each in its
    fixed order) over one corpus of all their passages. Passage and task ids carry their world
    (``kb<seed>-...``), so evidence and gold ids never mix."""
    if dataset == "kb":
        seeds = [int(kb_seed)] if isinstance(kb_seed, int) else [int(s) for s in kb_seed]
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"kb_seed must be a world seed or distinct seeds, got {kb_seed!r}")
        passages, kb_tasks = [], []
        for seed in seeds:
            world_passages, world_tasks = make_knowledge_base(seed=seed, split=split or "train")
            passages += world_passages
            kb_tasks += world_tasks
        chosen = list(tasks) if tasks is not None else kb_tasks
        return chosen[:size] if size else chosen, passages

    chosen = list(tasks) if tasks is not None else load_qa(dataset, split=split, limit=size)
    return chosen, bundled_corpus_path()


#: Local retrievers shared by all envs of a process, keyed by backend and corpus identity: a rollout
#: runs one env per sample, and each must not start its own index or embedding model.
_SHARED_RETRIEVERS: dict[tuple[str, str], Retriever] = {}
_SHARED_LOCK = threading.Lock()
#: Recent (query, k) results a shared BM25 retriever keeps: the G samples of an RL group mostly send the
#: same query (docs/data.md has the hit rate and what it saves).
QUERY_CACHE = 4096


def _make_retriever(retriever: Retriever | str, corpus: Any, url: str | None) -> Retriever:
    if isinstance(retriever, Retriever):
        return retriever

    if url is not None or retriever == "remote":
        if url is None:
            raise ValueError("retriever='remote' needs retriever_url")
        return make_retriever("remote", url=url)
    identity = (
        str(Path(corpus).resolve()) if isinstance(corpus, str | Path) else corpus_fingerprint(list(corpus))
    )
    with _SHARED_LOCK:
        key = (retriever, identity)
        if key not in _SHARED_RETRIEVERS:
            kwargs = {"cache_size": QUERY_CACHE} if retriever == "bm25" else {}
            _SHARED_RETRIEVERS[key] = make_retriever(retriever, corpus, **kwargs)
        return _SHARED_RETRIEVERS[key]


def oracle_query(env: MultiTurnSearchEnv, searcher_index: int) -> str:
    """The query an oracle searcher sends: the title of a gold passage (or the question)."""
    titles = env.gold_titles
    if titles:
        return titles[searcher_index % len(titles)]
    return env.task.question


def prebuild_kb_indexes(
    kb_seeds: Sequence[int], cache_dir: str | Path | None = None, searcher_sources: str = "shared"
) -> int:
    """Build the BM25 index of every invented world in ``kb_seeds`` that is not cached yet, in batches
    (one JVM per :data:`~srpo_envs.retrievers.bm25.INDEXER_BATCH` worlds); returns how many were built.

    Why: a ``MultiTurnSearch-v0`` env of a world indexes its 200 passages on first use, and a fresh JVM
    per world (~3.3 s) would dominate a warm start that plays in a thousand worlds. Envs made afterwards
    (``dataset="kb"``, ``kb_seed`` in ``kb_seeds``, the default ``bm25`` retriever) find their index cached;
    ``searcher_sources="by-kind"`` also builds each world's four source indexes.
    """

    corpora = []
    for seed in kb_seeds:
        passages, _ = make_knowledge_base(seed=seed, split="all")
        corpora.append((passages, corpus_fingerprint(passages)))
        if searcher_sources == "by-kind":
            corpora += [(shard, corpus_fingerprint(shard)) for shard in split_by_kind(passages)]
    return sum(built for _, built in build_lucene_indexes(corpora, cache_dir))
