"""srpo_envs: PettingZoo ParallelEnvs for multi-agent LLM teams, one recorded decision event per step."""

from srpo_envs.base import EventParallelEnv
from srpo_envs.events import Event, EventLog
from srpo_envs.registry import EnvKwargsError, EnvSpec, make, register, registry

register(
    "MathVerify-v0",
    "srpo_envs.math_verify:MathVerifyEnv",
    description="Math verification, n proposers -> aggregator (workflow= selects others), MATH500.",
    workflow="proposers-aggregator",
    dataset="math500",
)
register(
    "MathVerify-SolverVerifier-v0",
    "srpo_envs.math_verify:MathVerifyEnv",
    description="Solver proposes, verifier accepts/rejects, solver revises; MATH500.",
    workflow="solver-verifier",
    dataset="math500",
)
register(
    "MathVerify-Routed-v0",
    "srpo_envs.math_verify:MathVerifyEnv",
    description="A router picks how many proposers act, then the aggregator answers; MATH500.",
    workflow="routed",
    dataset="math500",
)
register(
    "ProcArith-v0",
    "srpo_envs.math_verify:MathVerifyEnv",
    description="Procedural multi-step arithmetic (CPU scale), n proposers -> aggregator.",
    workflow="proposers-aggregator",
    dataset="procedural",
)
register(
    "MultiTurnSearch-v0",
    "srpo_envs.search:MultiTurnSearchEnv",
    description="Parallel searchers + aggregator over a procedural knowledge base (BM25 via pyserini).",
    dataset="kb",
    workflow="parallel",
)
register(
    "MultiTurnSearch-Routed-v0",
    "srpo_envs.search:MultiTurnSearchEnv",
    description="A router picks how many searchers act; procedural knowledge base, BM25.",
    dataset="kb",
    workflow="routed",
)
register(
    "MultiTurnSearch-Team-v0",
    "srpo_envs.search:MultiTurnSearchEnv",
    description="A router picks 1..5 searchers, each consulting its own source (people, companies, cities, "
    "countries); procedural knowledge base, BM25, one passage per searcher.",
    dataset="kb",
    workflow="routed",
    n_searchers=5,
    searcher_sources="by-kind",
    top_k=1,
)
register(
    "MultiTurnSearch-HotpotQA-v0",
    "srpo_envs.search:MultiTurnSearchEnv",
    description="HotpotQA questions over the bundled 22,633-passage corpus, BM25 via pyserini.",
    dataset="hotpotqa",
    workflow="parallel",
)
register(
    "Verifiers-v0",
    "srpo_envs.verifiers_env:VerifiersEnv",
    description="Any verifiers environment (taskset=<id>): its model calls as K=1 events, its rubric as reward.",
    requires=("verifiers",),
)

__all__ = ["EnvKwargsError", "Event", "EventLog", "EnvSpec", "EventParallelEnv", "make", "register", "registry"]
