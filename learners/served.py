"""``srpo train --backend openai``: rollouts from a vLLM server over the OpenAI-compatible API.

The learner trains one LoRA adapter per role (``--sharing lora``) and serves each new version to the
server through vLLM's runtime adapter API (``POST /v1/load_lora_adapter``, then ``unload`` of the
version it replaces); every rollout request names its role's current adapter, so every row records
the policy version that generated it, exactly as with the colocated engine
(:func:`agents.vllm.sync_rollout_engine`). The rows carry the server's exact token ids and behaviour
log-probs (:mod:`agents.openai_policy`); :class:`learners.scale.ScaleOut` recomputes ``pi_old`` and
the truncated importance weights as for the in-process vLLM engine, and refuses rows a server marked
evaluation-only.

Why LoRA only: the stock OpenAI-compatible server has no endpoint that replaces a model's full
weights (:data:`SHARED_REFUSAL`), while adapters are loaded and unloaded at runtime. The server needs::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --max-lora-rank R \\
        --max-loras N_ROLES --logprobs-mode processed_logprobs

and must be able to read the run directory (the adapters are written to ``OUT/served-adapters``).
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Any

from agents.openai_policy import OpenAIPolicy
from agents.policy import PolicyMap

#: Why ``--backend openai`` needs ``--sharing lora``.
SHARED_REFUSAL = (
    "backend=openai trains LoRA adapters (--sharing lora): an OpenAI-compatible vLLM server loads new "
    "adapters at runtime (POST /v1/load_lora_adapter) but has no endpoint that replaces a model's full "
    "weights, so after the first update a shared or per-role model on the server would no longer be the "
    "policy being trained"
)


def served_rollout_policies(base_url: str, roles: list[str] | tuple[str, ...], **kwargs: Any) -> PolicyMap:
    """Role -> a view of one :class:`OpenAIPolicy` on ``base_url`` (the adapter names come at the first sync)."""
    base = OpenAIPolicy(None, base_url, **kwargs)
    base.check_server()  # fails fast: no server, or a server that serves no base model
    return PolicyMap.per_role({role: base.view(base.model or "", policy_version=-1) for role in roles})


class ServedAdapters:
    """Pushes the learner's per-role adapters to the server whenever their version moves."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()
        self.run = secrets.token_hex(3)  # adapter names are unique per run: a server may outlive a run
        self.loaded: dict[str, tuple[str, Path]] = {}

    def sync(self, rollout: PolicyMap, learner: PolicyMap, force: bool = False) -> list[str]:
        """Serve every role's adapter whose learner version differs from the one served; return those roles."""
        from agents.vllm import save_lora_adapter

        pushed = []
        for role, view in rollout.items():
            src = learner[role]
            version = int(src.policy_version)
            if not force and view.policy_version == version and role in self.loaded:
                continue
            name = f"{role}@{self.run}-v{version}"
            where = save_lora_adapter(src.model, role, self.directory / name.replace("@", "-"))
            view.load_lora_adapter(name, where)
            old = self.loaded.get(role)
            self.loaded[role] = (name, where)
            view.model = name
            view.policy_version = version
            if old is not None:
                view.unload_lora_adapter(old[0])
                shutil.rmtree(old[1], ignore_errors=True)
            pushed.append(role)
        return pushed


__all__ = ["SHARED_REFUSAL", "ServedAdapters", "served_rollout_policies"]
