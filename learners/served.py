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

Asynchronous runs (``--max-staleness N``): the generator thread serves each batch the adapters of the
version its bound assigns, written from the learner's snapshot of that version
(:meth:`ServedAdapters.sync` with ``snapshot``) while the learner updates the live weights; the server then
holds one adapter per role at a time, as in a synchronous run (evaluation, under the same lock, serves
the current version and the generator's next push the older one again).

Same distribution, checked. Every request names a complete neutral sampling set
(:data:`agents.openai_policy.NEUTRAL_SAMPLING`: a stock server would otherwise fill ``top_k``,
``repetition_penalty``, ... from the model's generation config) or the user's explicit
``--served-sampling``. Before training, a probe collects one episode through the server and compares its
behaviour log-probs with the learner's recompute of the same tokens (:func:`check_logprobs`): beyond
``--logprob-tolerance`` (mean absolute difference per response token) the run stops with the numbers,
before any update; every iteration's ``rollout/logprob_abs_diff`` is held to the same gate. Truncation
(top_k, top_p < 1, min_p) shows as server log-probs *above* the learner's (the kept tokens' mass is
renormalised); raw log-probs (no ``--logprobs-mode processed_logprobs``) at ``T != 1`` and penalties
show as differences of either sign.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents.openai_policy import NEUTRAL_SAMPLING, NEUTRAL_VLLM_SAMPLING, OpenAIPolicy
from agents.policy import PolicyMap
from agents.ray_rollout import distinct_models

#: Why ``--backend openai`` needs ``--sharing lora``.
SHARED_REFUSAL = (
    "backend=openai trains LoRA adapters (--sharing lora): an OpenAI-compatible vLLM server loads new "
    "adapters at runtime (POST /v1/load_lora_adapter) but has no endpoint that replaces a model's full "
    "weights, so after the first update a shared or per-role model on the server would no longer be the "
    "policy being trained"
)


class LogprobMismatchError(ValueError):
    """The server's behaviour log-probs are not the learner's: its samples follow another distribution."""


def check_logprobs(
    server: Sequence[Sequence[float]],
    learner: Sequence[Sequence[float]],
    masks: Sequence[Sequence[int | float]],
    tolerance: float,
    *,
    when: str,
    sent: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Compare the server's log-probs of the sampled tokens with the learner's; refuse beyond ``tolerance``.

    ``masks``: 1 on the response tokens the loss trains on (the rest is env text). Returns
    ``{"mean_abs", "max_abs", "mean_signed", "tokens", "rows"}`` (``mean_signed``: server - learner);
    raises :class:`LogprobMismatchError` with those numbers when ``mean_abs > tolerance``.
    """
    total = signed = worst = 0.0
    tokens = 0
    for srv, lrn, mask in zip(server, learner, masks, strict=True):
        for a, b, m in zip(srv, lrn, mask, strict=True):
            if m:
                d = float(a) - float(b)
                total += abs(d)
                signed += d
                worst = max(worst, abs(d))
                tokens += 1
    out = {
        "mean_abs": total / max(tokens, 1),
        "max_abs": worst,
        "mean_signed": signed / max(tokens, 1),
        "tokens": float(tokens),
        "rows": float(len(server)),
    }
    if not out["mean_abs"] <= tolerance:  # NaN too: a NaN log-prob (from either side) is no agreement
        hint = (
            "server above learner on average: a truncated distribution (top_k, top_p < 1, min_p) renormalised "
            "onto fewer tokens"
            if out["mean_signed"] > 0.5 * out["mean_abs"]
            else "differences of both signs or below: penalties (repetition/presence/frequency), raw log-probs "
            "at T != 1 (start vllm with --logprobs-mode processed_logprobs), or another model or dtype"
        )
        fields = ", ".join(f"{k}={v}" for k, v in sorted((sent or {}).items()))
        raise LogprobMismatchError(
            f"the server's log-probs disagree with the learner's {when}: mean |server - learner| = "
            f"{out['mean_abs']:.4f} nats per token > --logprob-tolerance {tolerance:g} (max {out['max_abs']:.4f}, "
            f"mean server - learner {out['mean_signed']:+.4f}, over {tokens} response tokens of {len(server)} "
            f"rows). The server does not sample from the softmax(logits / T) the learner trains on ({hint}); "
            f"the requests sent {fields or 'the neutral sampling set'}. Fix the server, or raise "
            "--logprob-tolerance to train on these rows anyway (truncated importance sampling then corrects "
            "up to --tis-cap)"
        )
    return out


def request_sampling(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sampling fields every rollout request carries: the neutral set, then the user's ``extra``."""

    return {**NEUTRAL_SAMPLING, **NEUTRAL_VLLM_SAMPLING, **dict(extra or {})}


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

    def sync(
        self,
        rollout: PolicyMap,
        learner: PolicyMap,
        force: bool = False,
        snapshot: tuple[Sequence[int], Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> list[str]:
        """Serve every role's adapter whose learner version differs from the one served; return those roles.

        ``snapshot``: ``(versions, model states)`` of the learner taken earlier (``Trainer._snapshot``:
        versions in ``learner.policies`` order, states as :func:`agents.ray_rollout.model_states` names
        them): serve those weights and versions instead of the live ones. The asynchronous generator
        serves the older version its batch is bound to while the learner updates the live weights; an
        adapter's name is its role and version, so a snapshot's and the live model's adapter of one
        version are the same adapter."""
        from agents.vllm import save_lora_adapter

        policies = learner.policies
        models = [id(getattr(p, "model", p)) for p in distinct_models(learner)]
        pushed = []
        for role, view in rollout.items():
            src = learner[role]
            if snapshot is None:
                version, state = int(src.policy_version), None
            else:
                version = int(snapshot[0][next(i for i, p in enumerate(policies) if p is src)])
                state = snapshot[1][f"model{models.index(id(src.model))}"]
            if not force and view.policy_version == version and role in self.loaded:
                continue
            name = f"{role}@{self.run}-v{version}"
            where = save_lora_adapter(src.model, role, self.directory / name.replace("@", "-"), state_dict=state)
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


__all__ = [
    "SHARED_REFUSAL",
    "LogprobMismatchError",
    "ServedAdapters",
    "check_logprobs",
    "request_sampling",
    "served_rollout_policies",
]
