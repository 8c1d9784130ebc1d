"""Scale-out wiring of the trainer: data-parallel ranks, Ray rollout workers, a vLLM rollout engine.

:class:`learners.trainer.Trainer` stays one loop; what changes when it runs on several processes or
generates elsewhere is gathered here, behind a few calls the loop makes:

* :meth:`ScaleOut.collect` — where rollouts happen. One process: the trainer's own collector. Ray
  workers (``rollout_workers > 0``): a :class:`agents.ray_rollout.RayRolloutCollector` on rank 0,
  whose batch every other rank receives. Several ranks without Ray: each rank collects a contiguous
  share of the tasks and the shares are gathered in rank order. Either way every rank ends with the
  same rollout batch, so advantages and group statistics are computed over the whole batch.
* :meth:`ScaleOut.prepare` — rows older than ``max_policy_lag`` versions are refused (whole events);
  with the vLLM backend the learner recomputes the rollout tokens' log-probs (``pi_old``, the PPO
  ratio's denominator), logs the mismatch (``rollout/logprob_abs_diff``, ``rollout/kl``) and returns
  truncated importance weights per row (sequence level, or event level for event losses such as SRPO)
  that the trainer multiplies into the advantages (:func:`learners.offpolicy.tis_row_weights` says
  why that equals weighting the loss).
* :meth:`ScaleOut.shard` / :meth:`ScaleOut.reduce_gradients` — this rank's event-atomic share of a
  minibatch and the gradient all-reduce after its backward passes (:mod:`learners.distributed`).
* :meth:`ScaleOut.sync_weights` — after every update the new weights go to the Ray workers (one
  ``ray.put``) or into the vLLM engine, with the learner's policy version.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutBatch, RolloutCollector
from learners.batching import MiniBatch, shard_minibatch
from learners.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_gradients,
    broadcast_object,
    init_distributed,
)
from learners.offpolicy import mismatch_metrics, refuse_stale_events, tis_row_weights

if TYPE_CHECKING:
    from learners.trainer import Trainer

__all__ = ["BACKENDS", "TIS_MODES", "ScaleOut"]

BACKENDS = ("hf", "vllm")
#: ``auto``: event-level weights for event losses (SRPO), sequence-level for the others, and only when
#: rollouts come from another engine (vLLM); ``off``: never.
TIS_MODES = ("auto", "off", "sequence", "event")


class ScaleOut:
    """The trainer's process layout and rollout engine (see the module docstring)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.cfg = trainer.cfg
        self.dist: DistContext = init_distributed(trainer.device)
        self.pool: Any = None
        self.rollout_policies: PolicyMap | None = None
        self._synced: list[int] | None = None

    # ------------------------------------------------------------------ device
    def rank_device(self, device: torch.device) -> torch.device:
        """Under a multi-GPU launch every rank takes its ``LOCAL_RANK`` GPU (``cuda`` without index)."""
        if self.dist.enabled and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", self.dist.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    # ------------------------------------------------------------------ collectors
    def collectors(
        self, train_env: Callable[[], Any], eval_env: Callable[[], Any], sampling: SamplingParams
    ) -> tuple[Any, Any]:
        """The train and eval collectors of this rank (Ray on rank 0, vLLM, or the learner's model)."""
        cfg, trainer = self.cfg, self.trainer
        if cfg.rollout_workers > 0:
            if not self.dist.is_main:
                return None, None  # rank 0 collects and broadcasts
            from agents.ray_rollout import HFPolicyFactory, RolloutWorkerPool, VLLMPolicyFactory

            on_gpu = trainer.device.type == "cuda"
            if cfg.backend == "vllm":
                factory: Any = VLLMPolicyFactory(trainer.model_path, tuple(trainer.roles), dtype=cfg.dtype)
            else:
                factory = HFPolicyFactory(
                    trainer.model_path,
                    tuple(trainer.roles),
                    cfg.sharing,
                    cfg.lora_rank,
                    device=trainer.device.type,
                    dtype="float64" if cfg.dtype == "float64" else "float32",
                )
            workers = cfg.rollout_workers
            remote = cfg.ray_address or os.environ.get("RAY_ADDRESS")
            if remote and "Search" in cfg.env_id and "retriever_url" not in cfg.env_kwargs:
                trainer.log(
                    "warning: rollout workers on a Ray cluster build their own retriever on every node; "
                    "serve one (`srpo serve-retriever`) and pass --env-kwarg retriever_url=http://HOST:PORT"
                )
            self.pool = RolloutWorkerPool(
                factory,
                workers,
                ray_address=cfg.ray_address,
                torch_threads=max(1, (os.cpu_count() or 1) // workers),
                num_gpus=1 if (on_gpu or cfg.backend == "vllm") else 0,
            )
            return self.pool.collector(train_env, sampling), self.pool.collector(eval_env, sampling)
        policies = trainer.policies
        if cfg.backend == "vllm":
            from agents.vllm import VLLMPolicy

            if cfg.sharing != "shared":
                raise ValueError(
                    "backend=vllm supports sharing=shared (merge LoRA adapters for per-role engines)"
                )
            engine = VLLMPolicy(
                trainer.model_path, dtype=cfg.dtype, seed=cfg.seed, gpu_memory_utilization=0.3
            )
            policies = self.rollout_policies = PolicyMap.shared(engine, trainer.roles)
        return RolloutCollector(train_env, policies, sampling), RolloutCollector(eval_env, policies, sampling)

    # ------------------------------------------------------------------ rollouts
    def collect(self, collector: Any, tasks: Sequence[int], group_size: int, seed: int) -> RolloutBatch:
        """The iteration's rollout batch, identical on every rank."""
        self.sync_weights()
        if self.cfg.rollout_workers > 0:
            batch = collector.collect(tasks, group_size, seed=seed) if self.dist.is_main else None
            return broadcast_object(batch, self.dist)
        if not self.dist.enabled:
            return collector.collect(tasks, group_size, seed=seed)
        from agents.ray_rollout import merge_batches, split_tasks

        chunks = split_tasks(tasks, self.dist.world_size)
        mine = chunks[self.dist.rank] if self.dist.rank < len(chunks) else []
        local = collector.collect(mine, group_size, seed=seed) if mine else None
        return merge_batches([b for b in all_gather_objects(local, self.dist) if b is not None])

    def sync_weights(self) -> None:
        """Push the learner's weights to the rollout engine when its version moved (no-op in-process)."""
        trainer = self.trainer
        versions = [int(p.policy_version) for p in trainer.policies.policies]
        if self._synced == versions or (self.pool is None and self.rollout_policies is None):
            self._synced = versions
            return
        if self.pool is not None:
            from agents.ray_rollout import model_states

            self.pool.load_weights(model_states(trainer.policies), versions)
        if self.rollout_policies is not None:
            (model,) = {id(p.model): p.model for p in trainer.policies.policies}.values()
            for engine in self.rollout_policies.policies:
                engine.load_weights(model.state_dict(), policy_version=versions[0])
        self._synced = versions

    # ------------------------------------------------------------------ off-policy corrections
    def tis_level(self, event_loss: bool) -> str | None:
        mode = self.cfg.tis
        if mode == "off" or (mode == "auto" and self.cfg.backend == "hf"):
            return None
        if mode == "auto":
            return "event" if event_loss else "sequence"
        return mode

    def prepare(
        self, batch: RolloutBatch, event_loss: bool
    ) -> tuple[RolloutBatch, torch.Tensor | None, dict]:
        """Refuse stale events; with another rollout engine, recompute ``pi_old`` and the TIS weights.

        Returns ``(batch, row_weights or None, stats)``; ``row_weights`` is ``[R]`` in row order.
        """
        trainer, cfg = self.trainer, self.cfg
        rows, refused = refuse_stale_events(
            batch.rows, lambda r: int(trainer.policies[r.role].policy_version), cfg.max_policy_lag
        )
        stats: dict[str, Any] = {"rollout/refused_events": float(refused)}
        if refused:
            batch = replace(batch, rows=rows)
        if cfg.backend == "hf" or not rows:
            return batch, None, stats
        # pi_old: the learner's log-probs of the rollout tokens under the weights that generated them
        recomputed: list[list[float]] = [[] for _ in rows]
        by_policy: dict[int, tuple[Any, list[int]]] = {}
        for i, r in enumerate(rows):
            pol = trainer.policies[r.role]
            by_policy.setdefault(id(pol), (pol, []))[1].append(i)
        for pol, idx in by_policy.values():
            lps = pol.compute_logprobs(
                [rows[i].prompt_ids for i in idx], [rows[i].response_ids for i in idx], cfg.temperature
            )
            for i, lp in zip(idx, lps, strict=True):
                recomputed[i] = lp
        width = max(len(r.response_ids) for r in rows)
        train = torch.zeros(len(rows), width, dtype=torch.float64)
        rollout = torch.zeros_like(train)
        mask = torch.zeros_like(train)
        for i, r in enumerate(rows):
            n = len(r.response_ids)
            train[i, :n] = torch.tensor(recomputed[i], dtype=torch.float64)
            rollout[i, :n] = torch.tensor(r.behaviour_logprobs, dtype=torch.float64)
            mask[i, :n] = torch.tensor(r.response_mask, dtype=torch.float64)
        stats.update(mismatch_metrics(train, rollout, mask))
        new_rows = [
            replace(
                r,
                behaviour_logprobs=[float(x) for x in lp],
                meta={**r.meta, "rollout_logprobs": r.behaviour_logprobs},
            )
            for r, lp in zip(rows, recomputed, strict=True)
        ]
        batch = replace(batch, rows=new_rows)
        level = self.tis_level(event_loss)
        if level is None:
            return batch, None, stats
        ids: dict[str, int] = {}
        event_index = torch.tensor([ids.setdefault(r.event_id, len(ids)) for r in rows], dtype=torch.long)
        weights = tis_row_weights(train, rollout, mask, level=level, cap=cfg.tis_cap, event_index=event_index)
        stats["rollout/tis_weight_mean"] = float(weights.mean())
        stats["rollout/tis_capped_frac"] = float((weights >= cfg.tis_cap).double().mean())
        return batch, weights, stats

    # ------------------------------------------------------------------ data parallelism
    def shard(self, mb: MiniBatch) -> MiniBatch:
        """This rank's event-atomic share of ``mb`` (``mb`` itself on one process)."""
        if not self.dist.enabled:
            return mb
        return shard_minibatch(mb, self.dist.rank, self.dist.world_size)

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the shards' gradients over the ranks (every rank then holds the whole minibatch's)."""
        all_reduce_gradients(params, self.dist)

    def close(self) -> None:
        """Stop the Ray workers (the process group stays: the launcher owns the processes)."""
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
