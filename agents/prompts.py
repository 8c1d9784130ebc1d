"""Role prompts: one readable table per domain (math, search), overridable per role.

The env's observation already states the task and the role's job; the system prompt fixes the
output format the env parses. Keep them short: tiny models have short contexts, and every prompt
token is paid for in every rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.policy import ChatMessages

MATH_PROMPTS: dict[str, str] = {
    "proposer": "You solve math problems step by step and end with the final answer in \\boxed{}.",
    "solver": "You solve math problems step by step and end with the final answer in \\boxed{}.",
    "verifier": "You check a proposed solution. End with \\boxed{accept} or \\boxed{reject}.",
    "aggregator": "You read candidate solutions and give the final answer in \\boxed{}.",
    "router": "You decide how many proposers should work on a problem. Answer with \\boxed{k}.",
}

SEARCH_PROMPTS: dict[str, str] = {
    "searcher": "You write one search query for the question inside <search>...</search>.",
    "aggregator": (
        "You read retrieved passages. Answer with <answer>...</answer>, or ask for another round of "
        "search with <search>...</search>."
    ),
    "router": "You decide how many searchers should look for evidence. Answer with \\boxed{k}.",
}

PROMPT_TABLES: dict[str, dict[str, str]] = {"math": MATH_PROMPTS, "search": SEARCH_PROMPTS}


@dataclass
class RolePrompts:
    """Turns (role, observation) into chat messages; ``overrides`` replace a role's system prompt."""

    domain: str = "math"
    """Which prompt table: ``math`` or ``search`` (:data:`PROMPT_TABLES`)."""
    overrides: Mapping[str, str] = field(default_factory=dict)
    use_system: bool = True

    def system(self, role: str) -> str:
        if role in self.overrides:
            return self.overrides[role]
        table = PROMPT_TABLES.get(self.domain)
        if table is None:
            raise KeyError(f"no prompt table for domain {self.domain!r}; known: {sorted(PROMPT_TABLES)}")
        return table.get(role, "")

    def messages(self, role: str, observation: str) -> ChatMessages:
        system = self.system(role) if self.use_system else ""
        msgs: ChatMessages = [{"role": "system", "content": system}] if system else []
        msgs.append({"role": "user", "content": observation})
        return msgs


def prompts_for_env(env: object, overrides: Mapping[str, str] | None = None) -> RolePrompts:
    """The prompt table matching an env (by its metadata name); an env that states its roles' system
    prompts (a ``role_prompts`` mapping, as ``Verifiers-v0`` does with its taskset's) has them used, and
    ``overrides`` win over both."""
    unwrapped = getattr(env, "unwrapped", env)
    name = str(getattr(unwrapped, "metadata", {}).get("name", ""))
    domain = "search" if "search" in name else "math"
    own = dict(getattr(unwrapped, "role_prompts", None) or {})
    return RolePrompts(domain=domain, overrides={**own, **dict(overrides or {})})
