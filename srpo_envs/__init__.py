"""srpo_envs: PettingZoo ParallelEnvs for multi-agent LLM teams, one recorded decision event per step."""

from srpo_envs.base import EventParallelEnv
from srpo_envs.events import Event, EventLog
from srpo_envs.registry import EnvSpec, make, register, registry

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

__all__ = ["Event", "EventLog", "EnvSpec", "EventParallelEnv", "make", "register", "registry"]
