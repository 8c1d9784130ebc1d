"""Agents: policies (transformers, vLLM, OpenAI-compatible servers, scripted teams), tiny models, rollouts.

The main names import from the package itself, lazily (``import agents`` loads no torch)."""

from srpo_common.lazy import lazy_exports

_EXPORTS = {
    "HFPolicy": "agents.hf",
    "Policy": "agents.policy",
    "PolicyMap": "agents.policy",
    "SamplingParams": "agents.policy",
    "RolloutBatch": "agents.rollout",
    "RolloutCollector": "agents.rollout",
    "ScriptedTeam": "agents.scripted",
    "init_tiny": "agents.tiny",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
