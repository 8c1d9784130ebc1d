"""The policy interface every rollout backend implements (transformers, vLLM, test doubles).

A *policy* turns :class:`GenerationRequest` s into :class:`Generation` s and carries a
``policy_version`` that the learner bumps after every weight update, so each row records which weights
produced it (staleness / off-policy corrections). A :class:`PolicyMap` routes requests by role to
policies and covers the three ways a multi-agent system shares parameters:

* one model shared by all roles (``PolicyMap.shared``): requests of all roles go in one batch;
* a separate model per role (``PolicyMap({"solver": p1, "verifier": p2})``);
* one base model with a LoRA adapter per role (``agents.lora.lora_policy_map``): each role is a view
  of the same ``PeftModel`` that activates its adapter for its batch group.

Behaviour log-prob convention (what ``Generation.logprobs`` holds)
------------------------------------------------------------------
For a request sampled at temperature ``T > 0`` the log-prob of generated token ``y_t`` is::

    log_softmax(logits_t / T)[y_t]        # full vocabulary; top_p NOT applied

where ``logits_t`` are the model's raw float32 logits for the prefix (prompt ids + the ids generated
so far). For greedy requests (``T <= 0``) it is ``log_softmax(logits_t)[y_t]`` (i.e. ``T = 1``).

Why: a learner recomputes ``log pi(y_t)`` from one forward pass over ``prompt_ids + token_ids`` at the
same temperature; with this convention the two agree to float32 round-off (tested <= 1e-5 on the tiny
models), so the importance ratio ``pi_new / pi_behaviour`` is exactly 1 for on-policy data. Top-p only
truncates the *sampling* distribution: the token actually drawn always lies inside the nucleus, and
the renormalised nucleus log-prob would differ from any learner recompute by ``-log(nucleus mass)``.
Learners that want the truncated distribution must apply the same nucleus in their recompute.
Backends: :class:`agents.hf.HFPolicy` follows this exactly (float32: <= 1e-5 against
:meth:`~agents.hf.HFPolicy.compute_logprobs`); :class:`agents.vllm.VLLMPolicy` follows it for
``top_p == 1`` and returns nucleus-renormalised values for ``top_p < 1`` (see :mod:`agents.vllm`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

ChatMessages = list[dict[str, str]]
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response.

    ``temperature <= 0`` means greedy decoding. ``stop`` strings end generation at the token that
    completes one of them (see :class:`Generation`). ``seed`` makes one request reproducible on its own,
    whatever else is in the batch. ``ignore_eos`` keeps generating past EOS (benchmarks, fixed-length
    rollouts); it is an addition to the fields the interface requires.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if isinstance(self.stop, str):  # a bare string is one stop string, not its characters
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One agent's turn: who asks (``agent``, ``role``) and what to continue.

    ``prompt`` is raw text (continued as is) or chat messages (rendered with the tokenizer's chat
    template, or a plain ``role: content`` transcript when it has none). ``prompt_ids``, when given,
    bypasses tokenisation entirely: multi-turn callers that already hold exact ids use it to avoid
    re-tokenisation drift.
    """

    agent: str
    role: str
    prompt: str | ChatMessages
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_ids: list[int] | None = None


@dataclass
class Generation:
    """One sampled response.

    ``token_ids`` are exactly the ids the policy sampled (never re-tokenised), including the EOS token
    when EOS ended the sequence and the token that completed a stop string. ``logprobs`` has one entry
    per ``token_ids`` entry (convention: module docstring). ``text`` is ``decode(token_ids)`` without
    special tokens, cut right after the first stop string when one matched (the stop string is kept,
    so text and ids end at the same place). ``finish_reason`` is ``"stop"`` (EOS or a stop string;
    ``stop_reason`` holds the EOS id or the matched string) or ``"length"`` (``max_new_tokens``).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int]
    policy_version: int
    finish_reason: FinishReason
    stop_reason: int | str | None = None
    #: why this generation cannot train (None: it can): e.g. a served model that returned text but no
    #: token ids, so ``token_ids`` are a re-tokenisation and ``logprobs`` unknown (:mod:`agents.openai_policy`)
    evaluation_only: str | None = None


@runtime_checkable
class Policy(Protocol):
    """Anything that samples responses for requests and reports the version of its weights."""

    policy_version: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One :class:`Generation` per request, in request order."""
        ...


class PolicyMap:
    """Role -> policy routing with batched dispatch.

    ``generate`` groups requests by the policy object their role maps to (so a shared model sees one
    batch of all roles, and each LoRA view sees the batch of its own role) and returns generations in
    request order. ``default`` serves roles that are not listed.
    """

    def __init__(self, policies: Mapping[str, Policy] | None = None, default: Policy | None = None) -> None:
        self._policies: dict[str, Policy] = dict(policies or {})
        self.default = default
        if not self._policies and default is None:
            raise ValueError("PolicyMap needs at least one policy or a default")

    @classmethod
    def shared(cls, policy: Policy, roles: Sequence[str] = ()) -> PolicyMap:
        """One model for every role (listed or not)."""
        return cls(dict.fromkeys(roles, policy), default=policy)

    @classmethod
    def per_role(cls, policies: Mapping[str, Policy]) -> PolicyMap:
        """A separate policy per role; an unknown role is an error."""
        return cls(policies)

    def __getitem__(self, role: str) -> Policy:
        try:
            return self._policies[role]
        except KeyError:
            if self.default is None:
                raise KeyError(f"no policy for role {role!r}; roles: {sorted(self._policies)}") from None
            return self.default

    def __contains__(self, role: object) -> bool:
        return role in self._policies or self.default is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._policies)

    def items(self) -> list[tuple[str, Policy]]:
        return list(self._policies.items())

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self._policies)

    @property
    def policies(self) -> list[Policy]:
        """The distinct policy objects (a shared model appears once)."""
        seen: dict[int, Policy] = {}
        for p in [*self._policies.values(), *([self.default] if self.default is not None else [])]:
            seen.setdefault(id(p), p)
        return list(seen.values())

    def policy_version(self, role: str) -> int:
        return self[role].policy_version

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        groups: dict[int, tuple[Policy, list[int]]] = {}
        for i, req in enumerate(requests):
            pol = self[req.role]
            groups.setdefault(id(pol), (pol, []))[1].append(i)
        out: list[Generation | None] = [None] * len(requests)
        for pol, idx in groups.values():
            gens = pol.generate([requests[i] for i in idx])
            if len(gens) != len(idx):
                raise RuntimeError(
                    f"{type(pol).__name__}.generate returned {len(gens)} for {len(idx)} requests"
                )
            for i, g in zip(idx, gens, strict=True):
                out[i] = g
        return out  # type: ignore[return-value]


__all__ = [
    "ChatMessages",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "Policy",
    "PolicyMap",
    "SamplingParams",
]
