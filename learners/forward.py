"""The learner's forwards: per-row response log-probs of the current policies (chunked, prefix-tree or
FSDP2 lockstep), their entropy and the frozen reference's log-probs, and ``pi_old`` in batch order.

Why one object for every forward: the PPO ratio divides a training forward by a ``pi_old`` forward, so
both must run the same kernels on the same inputs (autocast, temperature, length bucketing, prefix
packing, adapter scope, train mode) for the first ratio to be exactly 1. :class:`PolicyForward` is the
only place these contexts are entered; :mod:`learners.update` (the loss) and :mod:`learners.scale`
(``pi_old`` of another engine's rollouts, through the trainer's ``old_logprobs``) both call it.

It receives the sections it reads (``[policy]``, ``[update]``) and the rollout temperature, never the
whole ``TrainConfig``; the process layout comes in as a :class:`ForwardPlan` (``ScaleOut`` satisfies it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol

import torch

from agents.hf import HFPolicy, adapter_scope
from agents.policy import PolicyMap
from learners.batching import Batch, collate, gather_response_logprobs, micro_batch_bounds
from learners.losses import entropy_from_logits
from learners.prefix import pack_rows, packed_logprobs

__all__ = ["ForwardPlan", "PolicyForward", "generation_autocast", "train_mode"]


def generation_autocast(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype the learner's own rollouts (``backend=hf``) generate under: bf16 for a
    ``dtype=bfloat16`` run on a GPU (the weights stay float32 masters; decoding in float32 would take
    about twice the time and KV-cache memory), else None. On CPU the rollouts stay float32: bf16 CPU
    kernels are no faster there, and float32 keeps the CPU runs' rollouts as they were."""
    return torch.bfloat16 if dtype == "bfloat16" and device.type == "cuda" else None


@contextmanager
def train_mode(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """``model.train()`` for the duration when ``on`` (transformers applies gradient checkpointing
    only in training mode); restores every submodule's previous mode.

    Every module, not the root's flag: a freshly wrapped ``PeftModel`` is in training mode around a base
    model in eval mode, and deciding by the root alone left its layers in eval mode, i.e. silently
    without checkpointing until a generation had called ``train()`` on the whole tree."""
    if not on:
        yield
        return
    modules = list(model.modules())
    modes = [m.training for m in modules]
    if all(modes):
        yield
        return
    model.train()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.training = mode


class ForwardPlan(Protocol):
    """What the forwards need from the process layout (:class:`learners.scale.ScaleOut`)."""

    def forward_plan(self, chunks: Sequence[tuple[Any, list[int]]]) -> list[tuple[Any, list[int] | None]]: ...

    def dummy_inputs(self) -> dict[str, torch.Tensor]: ...


class PolicyForward:
    """The training forwards of ``policies`` (see the module docstring).

    ``policy``: the ``[policy]`` section (``dtype``, ``gradient_checkpointing``); ``update``: the
    ``[update]`` section (``forward_rows``, ``prefix_tree``, ``pack_len``, ``max_tokens_per_microbatch``,
    ``kl_coef``, ``entropy_coef``); ``temperature``: the rollouts' (``[rollout] temperature``), which the
    log-probs are taken at; ``ref_models``: the frozen KL references by ``id`` of the trained model.
    """

    def __init__(
        self,
        policies: PolicyMap,
        plan: ForwardPlan,
        device: torch.device,
        param_dtype: torch.dtype,
        policy: Any,
        update: Any,
        temperature: float,
        ref_models: dict[int, torch.nn.Module] | None = None,
    ) -> None:
        self.policies = policies
        self.plan = plan
        self.device = device
        self.param_dtype = param_dtype
        self.ref_models = ref_models if ref_models is not None else {}
        self.configure(policy, update, temperature)

    def configure(self, policy: Any, update: Any, temperature: float) -> None:
        """Take new sections (:meth:`learners.trainer.Trainer.reconfigure`)."""
        self.policy, self.update, self.temperature = policy, update, temperature

    def autocast(self) -> Any:
        if self.policy.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def policy_logprobs(
        self, rows: list[Any], batch: Batch, extras: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``[R, T]`` log-probs of ``batch`` under the current policies, entropy and reference
        log-probs (None unless the entropy bonus / KL is on and ``extras``). ``rows`` are ``batch``'s rows."""
        update = self.update
        batch_t = batch.response_width
        groups: dict[int, tuple[HFPolicy, list[int]]] = {}
        for i, r in enumerate(rows):
            pol = self.policies[r.role]
            groups.setdefault(id(pol), (pol, []))[1].append(i)
        chunks: list[tuple[HFPolicy, list[int]]] = []
        for pol, idx in groups.values():
            # Length-sorted chunks: proposer prompts are short, aggregator prompts hold every candidate;
            # padding them to one width would multiply the forward cost (and memory) by the ratio.
            idx = sorted(idx, key=lambda i: (len(rows[i].prompt_ids), len(rows[i].response_ids)))
            step = len(idx) if update.prefix_tree else update.forward_rows  # a tree packs its own sequences
            chunks.extend((pol, idx[j : j + step]) for j in range(0, len(idx), step))
        logprobs = entropy = ref = pad = None
        shape = (len(rows), batch_t)
        for pol, idx in self.plan.forward_plan(chunks):  # FSDP2: padded to the ranks' common plan
            if idx is None:
                lock = self.lockstep_forward(pol)
                pad = lock if pad is None else pad + lock
                continue
            if update.prefix_tree:
                lp, ent, ref_lp = self.tree_logprobs(pol, [rows[i] for i in idx], extras)
            else:
                lp, ent, ref_lp = self.chunk_logprobs(pol, batch.take(idx), extras)
            t = lp.shape[1]
            index = torch.tensor(idx, device=lp.device)
            if logprobs is None:
                logprobs = torch.zeros(shape, dtype=lp.dtype, device=lp.device)
            logprobs = logprobs.index_put((index,), torch.nn.functional.pad(lp, (0, batch_t - t)))
            if ent is not None:
                if entropy is None:
                    entropy = torch.zeros(shape, dtype=ent.dtype, device=ent.device)
                entropy = entropy.index_put((index,), torch.nn.functional.pad(ent, (0, batch_t - t)))
            if ref_lp is not None:
                if ref is None:
                    ref = torch.zeros(shape, dtype=ref_lp.dtype, device=ref_lp.device)
                ref = ref.index_put((index,), torch.nn.functional.pad(ref_lp, (0, batch_t - t)))
        assert logprobs is not None
        if pad is not None:  # + 0: ties the lockstep forwards into this micro-batch's backward
            logprobs = logprobs + pad
        return logprobs, entropy, ref

    def chunk_logprobs(
        self, pol: HFPolicy, sub: Batch, extras: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One padded per-row forward: ``[n, t]`` log-probs, entropy and reference log-probs (or None)."""
        update, temperature = self.update, self.temperature
        t = sub.response_width
        with (
            adapter_scope(pol.model, pol.adapter_name),
            self.autocast(),
            train_mode(pol.model, self.policy.gradient_checkpointing),
        ):
            logits = pol.model(**sub.model_inputs(), logits_to_keep=t + 1).logits
        lp = gather_response_logprobs(logits, sub, temperature)
        ent = ref_lp = None
        if update.entropy_coef > 0 and extras:
            ent = entropy_from_logits(logits[:, -t - 1 : -1] / max(temperature, 1e-6))
        if update.kl_coef > 0 and extras:
            with torch.no_grad(), adapter_scope(pol.model, pol.adapter_name), self.autocast():
                ref_logits = self.ref_models[id(pol.model)](**sub.model_inputs(), logits_to_keep=t + 1).logits
            ref_lp = gather_response_logprobs(ref_logits, sub, temperature)
        return lp, ent, ref_lp

    def tree_logprobs(
        self, pol: HFPolicy, rows: list[Any], extras: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`chunk_logprobs` through one prefix-tree forward of ``rows`` (``prefix_tree``):
        ``[n, t]`` with ``t`` their longest response, 0 past each row's response."""
        update, temperature = self.update, self.temperature
        packed = pack_rows(
            [r.prompt_ids for r in rows], [r.response_ids for r in rows], pol.pad_id, update.pack_len
        )
        with (
            adapter_scope(pol.model, pol.adapter_name),
            self.autocast(),
            train_mode(pol.model, self.policy.gradient_checkpointing),
        ):
            lp, _, ent = packed_logprobs(
                pol.model,
                [],
                [],
                temperature,
                with_entropy=update.entropy_coef > 0 and extras,
                packed=packed,
            )
        ref_lp = None
        if update.kl_coef > 0 and extras:
            with torch.no_grad(), adapter_scope(pol.model, pol.adapter_name), self.autocast():
                ref_lp = packed_logprobs(
                    self.ref_models[id(pol.model)], [], [], temperature, packed=packed
                )[0]
        return lp, ent, ref_lp

    def old_logprobs(self, rows: list[Any]) -> list[list[float]]:
        """``pi_old``: each row's response-token log-probs under the current weights, computed by the
        training forward itself (:meth:`policy_logprobs`: the same autocast, temperature, length
        bucketing and prefix packing), without gradient, in chunks of ``max_tokens_per_microbatch``.

        Why not the sampler's log-probs or a separate float32 pass: the PPO ratio divides the training
        forward's log-probs by these, so any numerical difference (another engine, bf16 autocast vs the
        float32 sampler) would show up as a ratio != 1 before the first optimizer step and be clipped
        as if the policy had moved; computed this way the first ratio is exactly 1 wherever a training
        micro-batch forwards the same rows as a chunk here (bit-identical kernels and inputs).
        """
        pad_id = self.policies.policies[0].pad_id
        out: list[list[float]] = [[] for _ in rows]
        bounds = micro_batch_bounds(rows, torch.arange(len(rows)), self.update.max_tokens_per_microbatch)
        with torch.no_grad():
            for a, b in bounds:
                part = list(rows[a:b])
                if not any(r.response_ids for r in part):  # nothing to score (collate needs a token)
                    continue
                batch = collate(part, pad_id, dtype=self.param_dtype).to(self.device)
                lp = self.policy_logprobs(part, batch, extras=False)[0].double().cpu()
                for i, r in enumerate(part):
                    out[a + i] = lp[i, : len(r.response_ids)].tolist()
        return out

    def lockstep_forward(self, pol: HFPolicy) -> torch.Tensor:
        """A forward FSDP2 needs from this rank to match the others (:meth:`ScaleOut.forward_plan`):
        a one-token input under the same contexts as a real chunk, returned as ``0 * logits.sum()``
        so that its backward issues the model's collectives and adds exactly zero gradient."""
        with (
            adapter_scope(pol.model, pol.adapter_name),
            self.autocast(),
            train_mode(pol.model, self.policy.gradient_checkpointing),
        ):
            logits = pol.model(**self.plan.dummy_inputs(), logits_to_keep=1).logits
        return logits.sum() * 0
