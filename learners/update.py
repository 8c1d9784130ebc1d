"""The update step: advantages once, then ``epochs`` x event-atomic minibatches, each collated once,
split into token-budget micro-batches (backward each with the whole minibatch's normaliser) and
stepped once; a critic (MAPPO) takes its value-loss step on the same minibatch.

:class:`PolicyUpdate` receives the ``[update]``, ``[critic]`` and ``[guard]`` sections and the run's
seed, never the whole ``TrainConfig``; the forwards come from :class:`learners.forward.PolicyForward`
and the process layout (shards, gradient all-reduce, FSDP2 lockstep, ``pi_old`` of another engine's
rows, TIS weights) from :class:`learners.scale.ScaleOut`. Everything random is seeded from
``(seed, iteration)`` (:func:`learners.seeds.iteration_seed`), so a resumed run replays the same
minibatches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from agents.policy import PolicyMap
from agents.rollout import RolloutBatch
from learners import state_check
from learners.advantages import AdvantageConfig, AdvantageResult, get_adv_estimator, member_cost_advantages
from learners.batching import (
    Batch,
    EventTable,
    MiniBatch,
    build_event_table,
    event_minibatches,
    micro_batch_bounds,
    prefix_micro_batches,
)
from learners.critic import ValueCritic
from learners.diagnostics import k_stats
from learners.distributed import all_gather_objects, all_reduce_sum
from learners.forward import PolicyForward
from learners.losses import LossConfig, get_policy_loss, kl_k3, loss_denominator, masked_sum, value_loss
from learners.scale import ScaleOut
from learners.seeds import iteration_seed

__all__ = ["PolicyUpdate", "loss_config"]


def loss_config(update: Any, norm_len: int, denominator: float | None = None) -> LossConfig:
    """The :class:`LossConfig` of the ``[update]`` section (its resolved clip range and aggregation);
    ``norm_len``: the constant length normaliser (``[rollout] max_new_tokens``)."""
    return LossConfig(
        clip_eps=update.clip_range[0],
        clip_eps_high=update.clip_range[1],
        norm=update.norm,
        agg=update.agg,
        norm_len=norm_len,
        denominator=denominator,
    )


class PolicyUpdate:
    """One iteration's update of the policies (and critic) on a rollout batch: :meth:`update`.

    ``update`` / ``critic_cfg`` / ``guard``: the ``[update]``, ``[critic]`` and ``[guard]`` sections
    (held as ``section``, ``critic_cfg``, ``guard``);
    ``seed``: the run's; ``norm_len``: ``[rollout] max_new_tokens``; ``out_dir``: named in the error of a
    run that diverged. The optimizers and the critic are the trainer's (its checkpoint holds them).
    """

    def __init__(
        self,
        forward: PolicyForward,
        scale: ScaleOut,
        policies: PolicyMap,
        params: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        critic: ValueCritic | None,
        critic_optimizer: torch.optim.Optimizer | None,
        *,
        update: Any,
        critic_cfg: Any,
        guard: Any,
        seed: int,
        norm_len: int,
        out_dir: str,
    ) -> None:
        self.forward, self.scale, self.dist = forward, scale, scale.dist
        self.policies, self.params = policies, params
        self.optimizer, self.scheduler = optimizer, scheduler
        self.critic, self.critic_optimizer = critic, critic_optimizer
        self.seed, self.out_dir = seed, out_dir
        self.configure(update, critic_cfg, guard, norm_len)
        #: the critic's values of the current batch's events (its "old" values for the value clip)
        self.event_values: torch.Tensor | None = None
        self.nonfinite_steps = 0  # optimizer steps skipped for a non-finite loss/gradient (whole run)
        self._nonfinite_streak = 0
        self.iteration = 0  # the iteration being trained (named in a divergence error)

    def configure(self, update: Any, critic_cfg: Any, guard: Any, norm_len: int) -> None:
        """Take new sections (:meth:`learners.trainer.Trainer.reconfigure`)."""
        self.section, self.critic_cfg, self.guard, self.norm_len = update, critic_cfg, guard, norm_len

    @property
    def device(self) -> torch.device:
        return self.forward.device

    @property
    def param_dtype(self) -> torch.dtype:
        return self.forward.param_dtype

    # ------------------------------------------------------------------ advantages and loss
    def advantages(self, table: EventTable) -> AdvantageResult:
        """Per-row advantages from the estimator the algorithm names (critic values if it has one)."""
        values = None
        if self.critic is not None:
            texts = [r.state_text for r in table.first_rows()]
            values = torch.zeros(len(texts), dtype=torch.float64)
            with torch.no_grad():
                for idx in self.critic.token_chunks(texts, self.section.max_tokens_per_microbatch):
                    values[idx] = self.critic([texts[i] for i in idx]).double().cpu()
        self.event_values = values
        estimator = get_adv_estimator(self.section.adv_estimator)
        adv_cfg = AdvantageConfig(
            scale=self.section.adv_scale, gamma=self.critic_cfg.gamma, gae_lambda=self.critic_cfg.gae_lambda
        )
        if self.section.member_cost_advantage == "in-outcome":
            return estimator(table, adv_cfg, values)
        result = estimator(table.without_member_cost(), adv_cfg, values)
        cost = member_cost_advantages(table)
        stats = {**result.stats, "actor/member_cost_adv_abs": float(cost.abs().mean())}
        return replace(result, advantages=result.advantages + cost, stats=stats)

    def loss_config(self, denominator: float | None = None) -> LossConfig:
        return loss_config(self.section, self.norm_len, denominator)

    def rows_per_batch(self, table: EventTable) -> int:
        """``rows_per_batch``, or the size that splits the batch into ``minibatches_per_iter``."""
        rows = sum(len(r) for r, ok in zip(table.event_rows, table.complete, strict=True) if ok)
        return self.section.rows_per_minibatch(rows)

    # ------------------------------------------------------------------ the step
    def update(self, batch: RolloutBatch, iteration: int) -> dict[str, Any]:
        """Advantages once, then ``epochs`` x minibatches of (micro-batched) loss and one step each."""
        self.iteration = iteration
        loss_fn = get_policy_loss(self.section.policy_loss)
        unit = loss_fn.unit(self.loss_config())
        # [R, T] TIS weights (per token, or a row's / an event's weight on its tokens) reach the loss as
        # LossConfig.token_weights: each row its own, in every loss; an event weight of an event loss
        # (SRPO) on the scale of its clipped ratio, c(K) of its set normalisation
        batch, token_weights, prep_stats = self.scale.prepare(
            batch,
            ratio_level=loss_fn.ratio_level(self.loss_config()),
            norm=self.section.norm if unit in ("events", "members") else "sum",
            pi_old=lambda rows: self.composed_old_logprobs(rows, iteration),
        )
        table = build_event_table(batch.rows)
        adv = self.advantages(table)
        stats: dict[str, list[float]] = {}
        dropped = 0
        skipped_before = self.nonfinite_steps
        for epoch in range(self.section.epochs):
            mbs = event_minibatches(
                table,
                rows_per_batch=self.rows_per_batch(table),
                seed=iteration_seed(self.seed, iteration, 1 + epoch),
            )
            dropped = mbs.dropped_events
            for mb in mbs:
                st = self.minibatch_step(mb, table, adv, loss_fn, unit, token_weights)
                if self.critic is not None:
                    st.update(self.critic_step(mb, table, adv))
                for k, v in st.items():
                    stats.setdefault(k, []).append(float(v))
        for pol in self.policies.policies:
            pol.bump_version()
        # Per-minibatch diagnostics averaged over the iteration's optimizer steps, namespaced by who
        # produced them; K statistics describe the rollout batch (not a minibatch).
        out: dict[str, Any] = {}
        for k, v in stats.items():
            if k in ("mean_k", "max_k"):
                continue
            out[k if "/" in k else f"actor/{k}"] = float(np.mean(v))
        out.update(adv.stats)
        out.update(prep_stats)
        out.update(k_stats(table))  # mean_k, max_k, k_hist, and the multi-member-only view
        out["rollout/events_dropped"] = float(dropped)
        out["actor/nonfinite_steps"] = float(self.nonfinite_steps - skipped_before)
        return out

    def micro_batches(
        self, mb: MiniBatch, full: Batch, collate: Callable[[MiniBatch], Batch]
    ) -> tuple[MiniBatch, Batch, list[list[int]], int]:
        """The composition one minibatch trains in: ``(this rank's shard, its collated batch, its
        micro-batches as row indices into the shard, the number of micro-batches every rank runs)``.
        ``full``: ``collate(mb)``. One function for :meth:`minibatch_step` and :meth:`composed_old_logprobs`,
        so ``pi_old`` is computed in exactly the forwards training makes."""
        if self.dist.enabled:  # normalisers span the whole minibatch; this rank computes its shard
            mb = self.scale.shard(mb)
            if mb.num_rows:  # a rank without an event still joins the gradient all-reduce (zeros)
                full = collate(mb)
        budget = self.section.max_tokens_per_microbatch
        if self.section.prefix_tree:  # events sharing prefixes together, the budget in prefix-tree nodes
            bounds = prefix_micro_batches(mb.rows, mb.event_index, budget)
        else:
            bounds = [list(range(a, b)) for a, b in micro_batch_bounds(mb.rows, mb.event_index, budget)]
        bounds = bounds if mb.num_rows else []
        n_micro = self.scale.agree_count(len(bounds))  # FSDP2: every rank runs the most any rank has
        return mb, full, bounds, n_micro

    def composed_old_logprobs(self, rows: list[Any], iteration: int) -> list[list[float]]:
        """``pi_old`` of ``rows`` (the update's batch) from the very forwards that training will make in
        its first epoch: the same shuffled event minibatches, data-parallel shard, micro-batches, prefix
        packing, per-policy chunks and padding widths, without gradient, before any optimizer step.

        Why: the ratio divides the training forward's log-probs by these. Recomputed in another
        composition (batch order, other chunk widths, other packed sequences) they differ from the
        training forward's by rounding (bf16 autocast: ~1e-3), so the first on-policy ratio was only
        about 1 and SRPO summed that noise over an event's tokens. Computed here, every minibatch of
        epoch 0 divides a forward by a bit-identical forward of the same weights: the first minibatch's
        ratio is exactly 1, and a later one's moves only by the optimizer steps before it. Each rank
        scores its shards; the results are gathered so that every rank has every row (later epochs
        shard differently). Rows of events that no minibatch holds (incomplete ones) are scored in batch
        order (:meth:`ScaleOut.old_logprobs`); they are never trained on.
        """
        table = build_event_table(rows)
        pad_id = self.policies.policies[0].pad_id

        def collate(part: MiniBatch) -> Batch:
            return part.collate(pad_id, dtype=self.param_dtype, table=table).to(self.device)

        # the minibatches of epoch 0 exactly as update() draws them (same table, size and seed)
        mbs = event_minibatches(
            table, rows_per_batch=self.rows_per_batch(table), seed=iteration_seed(self.seed, iteration, 1)
        )
        mine: dict[int, list[float]] = {}
        with torch.no_grad():
            for whole in mbs:
                mb, full, bounds, n_micro = self.micro_batches(whole, collate(whole), collate)
                assert mb.row_index is not None
                for idx in bounds:
                    sub = full if idx == list(range(full.num_rows)) else full.take(idx)
                    lp = self.forward.policy_logprobs([mb.rows[i] for i in idx], sub, extras=False)[0]
                    lp = lp.double().cpu()
                    for j, i in enumerate(idx):
                        mine[int(mb.row_index[i])] = lp[j, : len(mb.rows[i].response_ids)].tolist()
                for _ in range(n_micro - len(bounds)):  # FSDP2 lockstep, as in minibatch_step
                    for pol, _ in self.scale.forward_plan([]):
                        self.forward.lockstep_forward(pol)
        if self.dist.enabled:
            mine = {i: lp for part in all_gather_objects(mine, self.dist) for i, lp in part.items()}
        rest = [i for i in range(len(rows)) if i not in mine]  # the same on every rank (same table)
        if rest:
            mine.update(zip(rest, self.scale.old_logprobs([rows[i] for i in rest]), strict=True))
        return [mine[i] for i in range(len(rows))]

    def minibatch_step(
        self,
        mb: MiniBatch,
        table: EventTable,
        adv: AdvantageResult,
        loss_fn: Any,
        unit: str,
        token_weights: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Collate once, backward per event-atomic micro-batch with the whole minibatch's
        normaliser (so the accumulated gradient equals the one-big-batch gradient), one step.
        ``token_weights``: table-wide ``[R, T]`` per-token loss weights (token-level TIS) or None."""
        section = self.section
        pad_id = self.policies.policies[0].pad_id

        def collate(part: MiniBatch) -> Batch:
            return part.collate(
                pad_id,
                dtype=self.param_dtype,
                table=table,
                advantages=adv.advantages,
                token_weights=token_weights,
            ).to(self.device)

        full = collate(mb)
        loss_cfg = self.loss_config(loss_denominator(unit, full.response_mask, full.event_index))
        tokens = loss_denominator("tokens", full.response_mask)
        mb, full, bounds, n_micro = self.micro_batches(mb, full, collate)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        micro: list[dict[str, float]] = []
        for idx in bounds:
            sub = full if idx == list(range(full.num_rows)) else full.take(idx)
            lp, ent, ref = self.forward.policy_logprobs([mb.rows[i] for i in idx], sub)
            mask = sub.response_mask
            assert sub.advantages is not None and sub.event_index is not None
            sub_cfg = (
                loss_cfg if sub.token_weights is None else replace(loss_cfg, token_weights=sub.token_weights)
            )
            loss, st = loss_fn(lp, sub.old_logprobs, mask, sub.advantages, sub.event_index, sub_cfg)
            if ref is not None:
                kl = masked_sum(kl_k3(lp, ref), mask) / max(tokens, 1.0)
                loss = loss + section.kl_coef * kl
                st["kl_ref"] = float(kl.detach())
            if ent is not None:
                entropy = masked_sum(ent, mask) / max(tokens, 1.0)
                loss = loss - section.entropy_coef * entropy
                st["entropy"] = float(entropy.detach())
            loss.backward()
            total += float(loss.detach())
            micro.append(st)
        for _ in range(n_micro - len(bounds)):  # FSDP2 lockstep: zero-weight micro-batches
            sum(self.forward.lockstep_forward(pol) for pol, _ in self.scale.forward_plan([])).backward()
        self.scale.reduce_gradients(self.params)  # sum of the ranks' shard gradients (no-op on one)
        total = all_reduce_sum(total, self.dist)
        grad_norm = self.scale.clip_gradients(self.params, section.max_grad_norm)
        if math.isfinite(total) and math.isfinite(float(grad_norm)):
            self.optimizer.step()
            self.scheduler.step()  # the schedule counts steps taken; a skipped one is not
            self._nonfinite_streak = 0
        else:  # never let a NaN/inf reach the weights: skip the step, count it, stop if it persists
            self._skip_nonfinite_step(total, float(grad_norm))
        out = {k: float(np.mean([m[k] for m in micro if k in m])) for k in (micro[0] if micro else {})}
        if "max_k" in out:
            out["max_k"] = float(max(m["max_k"] for m in micro))
        out.update(loss=total, grad_norm=float(grad_norm))
        return out

    def critic_step(self, mb: MiniBatch, table: EventTable, adv: AdvantageResult) -> dict[str, float]:
        """One value-loss step on the minibatch's events (their states, old values and returns)."""
        assert self.critic is not None and self.critic_optimizer is not None
        assert mb.event_pos is not None and adv.returns is not None and self.event_values is not None
        pos = mb.event_pos
        texts = [table.event_row(e).state_text for e in pos.tolist()]
        self.critic_optimizer.zero_grad(set_to_none=True)
        total = 0.0
        stats: dict[str, float] = {}
        # backward per token-budget chunk, each chunk's mean weighted by its share of the events: the
        # accumulated gradient and the stats are those of the whole minibatch's mean value loss
        for idx in self.critic.token_chunks(texts, self.section.max_tokens_per_microbatch):
            values = self.critic([texts[i] for i in idx])
            sel = pos[idx]
            old = self.event_values[sel].to(device=values.device, dtype=values.dtype)
            ret = adv.returns[sel].to(device=values.device, dtype=values.dtype)
            vloss, vstats = value_loss(values, old, ret, clip_eps=self.critic_cfg.vf_clip)
            share = len(idx) / len(texts)
            (vloss * share if share != 1 else vloss).backward()
            total += float(vloss.detach()) * share
            for k, v in vstats.items():
                stats[k] = stats.get(k, 0.0) + float(v) * share
        critic_norm = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.section.max_grad_norm))
        if math.isfinite(total) and math.isfinite(critic_norm):
            self.critic_optimizer.step()
        else:  # as for the policy: a non-finite value loss never reaches the critic's weights
            self.critic_optimizer.zero_grad(set_to_none=True)
        return {"critic/value_loss": total, **{f"critic/{k}": v for k, v in stats.items()}}

    def _skip_nonfinite_step(self, loss: float, grad_norm: float) -> None:
        """Drop this minibatch's gradients instead of stepping; after ``max_nonfinite_steps`` in a row
        raise :class:`~learners.state_check.NonFiniteError` (the run stops before it saves or exports)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_steps += 1
        self._nonfinite_streak += 1
        if self._nonfinite_streak >= self.guard.max_nonfinite_steps:
            raise state_check.NonFiniteError(
                f"training diverged: {self._nonfinite_streak} optimizer steps in a row had a non-finite loss "
                f"or gradient (last: loss {loss}, grad norm {grad_norm}) at iteration {self.iteration}; "
                f"stopped without exporting; the last checkpoint in {self.out_dir} is kept (lower --lr?)"
            )
