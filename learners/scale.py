"""Scale-out wiring of the trainer: data-parallel ranks, Ray rollout workers, a vLLM rollout engine.

:class:`learners.trainer.Trainer` stays one loop; what changes when it runs on several processes or
generates elsewhere is gathered here, behind a few calls the loop makes:

* :meth:`ScaleOut.collect` — where rollouts happen. One process: the trainer's own collector. Ray
  workers (``rollout_workers > 0``): a :class:`agents.ray_rollout.RayRolloutCollector` on rank 0,
  whose batch every other rank receives. Several ranks without Ray: each rank collects a contiguous
  share of the tasks and the shares are gathered in rank order. Either way every rank ends with the
  same rollout batch, so advantages and group statistics are computed over the whole batch.
* :meth:`ScaleOut.prepare` — rows older than the learner's weights are refused (whole events: in this
  synchronous loop every row comes from the current weights, so a stale row means a worker missed a
  weight push); with the vLLM backend, or bf16 autocast, the learner recomputes the rollout tokens'
  log-probs (``pi_old``, the PPO ratio's denominator) with its own training forward (same autocast,
  so the first ratio of an update is 1), logs the mismatch (``rollout/logprob_abs_diff``,
  ``rollout/kl``) and returns truncated importance weights ``[R, T]`` at the loss's ratio level by
  default (token for GRPO/PPO, sequence for GSPO, event for SRPO) — per row or per event weights
  repeated on the rows' tokens — which reach every loss as ``LossConfig.token_weights``.
* :meth:`ScaleOut.shard` / :meth:`ScaleOut.reduce_gradients` — this rank's event-atomic share of a
  minibatch and the gradient all-reduce after its backward passes (:mod:`learners.distributed`).
  With ``dp_engine="fsdp2"`` the models are sharded instead (:meth:`ScaleOut.shard_models`), the
  reduction happens inside backward and :meth:`ScaleOut.forward_plan` keeps the ranks' forward calls in
  lockstep; rollouts then run on an unsharded copy of the policies, refreshed by ``sync_weights``.
* :meth:`ScaleOut.sync_weights` — after every update the new weights go to the Ray workers (one
  ``ray.put``) or into the vLLM engine, with the learner's policy version.
* The vLLM engine (``backend="vllm"``, no Ray workers): one per process; under a multi-process launch
  every rank builds its own in vLLM's ``external_launcher`` mode (it joins the launcher's process group)
  and generates its share of the tasks. ``vllm_gpu_memory_utilization`` is its share of the GPU; with
  ``vllm_sleep`` it sleeps (level 1) after each collection and the next push wakes it, where vLLM has
  sleep mode (not its CPU build). ``pi_old`` is recomputed by each rank for its own share of the rows
  (:meth:`ScaleOut.old_logprobs`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from agents.engines import ENGINES, engine_factory, engine_gpus, local_engine
from agents.policy import PolicyMap, SamplingParams
from agents.ray_rollout import (
    RolloutWorkerPool,
    distinct_models,
    load_model_states,
    merge_batches,
    model_states,
    split_tasks,
)
from agents.rollout import RolloutBatch, RolloutCollector
from agents.vllm import PER_ROLE_REFUSAL, sync_rollout_engine, vllm_lora_policy_map
from learners.batching import MiniBatch, shard_minibatch
from learners.distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_gradients,
    all_reduce_max,
    broadcast_object,
    clip_grad_norm,
    fsdp2_shard,
    full_model_state,
    full_optimizer_state,
    init_distributed,
    load_full_model_state,
    load_full_optimizer_state,
)
from learners.offpolicy import mismatch_metrics, refuse_stale_events, tis_weights_and_stats
from learners.served import ServedAdapters, check_logprobs, request_sampling, served_rollout_policies
from learners.staleness import admit_rows, decoupled_correction

__all__ = ["BACKENDS", "TIS_MODES", "ScaleHost", "ScaleOut"]

BACKENDS = ENGINES  # the generation engines (agents.engines chooses them for eval and training alike)
#: ``auto``: only when rollouts come from another engine (vLLM), at the level of the loss's own ratio
#: (:attr:`learners.losses.PolicyLoss.ratio_level`: token for GRPO/PPO as verl's default, sequence for
#: GSPO, event for SRPO); ``off``: never; ``token`` / ``sequence`` / ``event``: that level.
TIS_MODES = ("auto", "off", "token", "sequence", "sequence-mean", "event")


def _master_dtype(dtype: str) -> str:
    """The dtype an HF copy of the learner's policies holds: its master weights' (float64 for exact
    tests, else float32: a bfloat16 run trains float32 masters under autocast)."""
    return "float64" if dtype == "float64" else "float32"


def token_shares(sizes: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``range(len(sizes))`` with about equal summed
    ``sizes`` (some empty when there are fewer items than parts)."""
    total = sum(sizes)
    cuts, acc, k = [0], 0, 1
    for i, size in enumerate(sizes):
        acc += size
        while k < parts and acc * parts >= total * k:
            cuts.append(i + 1)
            k += 1
    cuts += [len(sizes)] * (parts + 1 - len(cuts))
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class ScaleHost(Protocol):
    """What :class:`ScaleOut` needs from the learner it serves (:class:`learners.trainer.Trainer`
    satisfies it; tests pass small stand-ins). Read when used, not at construction: the learner builds
    its policies and picks its rank's device after its ``ScaleOut`` exists (the layout decides both)."""

    cfg: Any
    """the run's ``TrainConfig``: :meth:`ScaleOut.configure` keeps its sections, not the config"""
    device: torch.device
    """this rank's device"""
    model_path: str
    """the local directory of the policy's weights (what rollout engines load)"""
    roles: list[str]
    """the env's roles (one policy view each)"""
    policies: PolicyMap
    """the trained policies (their weights and versions are pushed to the rollout engine)"""

    def log(self, message: str) -> None: ...

    def distinct_models(self) -> list[Any]:
        """One policy per distinct trained model (LoRA views of one base count once)."""
        ...

    def old_logprobs(self, rows: list[Any]) -> list[list[float]]:
        """``pi_old`` of ``rows`` by the learner's training forward, in batch order."""
        ...


class ScaleOut:
    """The learner's process layout and rollout engine (see the module docstring).

    ``host``: the learner, through the narrow :class:`ScaleHost` interface (this module never imports
    :mod:`learners.trainer`; an import-linter contract in pyproject.toml keeps it so)."""

    def __init__(self, host: ScaleHost) -> None:
        self.host = host
        self.configure(host.cfg)
        self.dist: DistContext = init_distributed(host.device, timeout_s=self.scale_cfg.dist_timeout)
        self.pool: Any = None
        self.rollout_policies: PolicyMap | None = None
        self._synced: list[int] | None = None
        #: FSDP2 sharding is on (``dp_engine=fsdp2`` under a multi-process launch; one process has
        #: nothing to shard with and runs the plain path, which computes the same update)
        self.fsdp = self.scale_cfg.dp_engine == "fsdp2" and self.dist.enabled
        #: FSDP2 with in-process rollouts: an unsharded copy of the policies that generates (a sharded
        #: model's forward is a collective, so ranks could not generate different tasks with it)
        self.rollout_copy: PolicyMap | None = None
        #: backend=vllm in this process: the engine (its views are ``rollout_policies``), put to sleep after
        #: each collection where vLLM supports it (``vllm_sleep``) and woken by its next use
        self.engine: Any = None
        #: backend=openai: the served log-probs probe ran (:meth:`probe_served`, once, before training)
        self._probed = False
        #: max_staleness >= 1 with Ray rollout workers: the generator thread pushes each batch's weights
        #: itself (push_weights) and holds this lock over push + collect; evaluation holds it too
        self.generation_lock = threading.RLock()
        self.pinned_weights = False

    def configure(self, cfg: Any) -> None:
        """Take the config sections this layout reads (again after :meth:`learners.trainer.Trainer.reconfigure`):
        ``[engine]`` (which engine, how it is reached), ``[scale]`` (Ray workers, ranks, timeouts), ``[policy]``
        (sharing, LoRA rank, dtype), ``[run]`` (env, seed, out_dir), ``[update]`` (TIS, staleness correction)
        and ``[rollout]`` (max_staleness); nothing else of the config is kept."""
        self.engine_cfg, self.scale_cfg, self.policy_cfg = cfg.engine, cfg.scale, cfg.policy
        self.run_cfg, self.update_cfg, self.rollout_cfg = cfg.run, cfg.update, cfg.rollout

    # ------------------------------------------------------------------ device
    def rank_device(self, device: torch.device) -> torch.device:
        """Under a multi-GPU launch every rank takes its ``LOCAL_RANK`` GPU (``cuda`` without index); one
        process takes the current GPU. Always with an index: ``torch.cuda.set_device`` refuses a bare
        ``cuda`` in some torch releases (2.11 raised "Expected a torch.device with a specified index")."""
        if device.type == "cuda" and device.index is None:
            index = self.dist.local_rank if self.dist.enabled else torch.cuda.current_device()
            device = torch.device("cuda", index)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    # ------------------------------------------------------------------ collectors
    def collectors(
        self, train_env: Callable[[], Any], eval_env: Callable[[], Any], sampling: SamplingParams
    ) -> tuple[Any, Any]:
        """The train and eval collectors of this rank (Ray on rank 0, vLLM, or the learner's model)."""
        host = self.host
        if self.scale_cfg.rollout_workers > 0:
            if not self.dist.is_main:
                return None, None  # rank 0 collects and broadcasts

            on_gpu = host.device.type == "cuda"
            # vLLM workers take the run's dtype; HF workers hold float32 masters (float64 for exact tests)
            factory = engine_factory(
                self.engine_cfg.backend,
                host.model_path,
                host.roles,
                sharing=self.policy_cfg.sharing,
                lora_rank=self.policy_cfg.lora_rank,
                device=host.device.type,
                dtype=self.policy_cfg.dtype if self.engine_cfg.backend == "vllm" else _master_dtype(self.policy_cfg.dtype),
            )
            workers = self.scale_cfg.rollout_workers
            remote = self.scale_cfg.ray_address or os.environ.get("RAY_ADDRESS")
            if remote and "Search" in self.run_cfg.env_id and "retriever_url" not in self.run_cfg.env_kwargs:
                host.log(
                    "warning: rollout workers on a Ray cluster build their own retriever on every node; "
                    "serve one (`srpo serve-retriever`) and pass --env-kwarg retriever_url=http://HOST:PORT"
                )
            self.pool = RolloutWorkerPool(
                factory,
                workers,
                ray_address=self.scale_cfg.ray_address,
                torch_threads=max(1, (os.cpu_count() or 1) // workers),
                num_gpus=engine_gpus(self.engine_cfg.backend, on_gpu),
                call_timeout_s=self.scale_cfg.rollout_timeout,
            )
            return self.pool.collector(train_env, sampling), self.pool.collector(eval_env, sampling)
        policies = host.policies
        if self.fsdp and self.engine_cfg.backend == "hf":
            policies = self.rollout_copy = self._policy_factory()()
        if self.engine_cfg.backend == "vllm":
            if self.policy_cfg.sharing == "per-role":
                raise ValueError(PER_ROLE_REFUSAL)
            lora = self.policy_cfg.sharing == "lora"  # one engine, a LoRA adapter per role (agents.vllm)
            kwargs: dict[str, Any] = {}
            if lora:
                kwargs.update(lora_rank=self.policy_cfg.lora_rank, max_loras=len(host.roles))
            if self.dist.enabled:
                # one engine per rank that joins the launcher's process group (vLLM's external_launcher,
                # as verl and TRL colocate): vLLM's default executor would build a world of one inside an
                # initialised group of world_size ranks and fail; building the engines is collective
                kwargs["distributed_executor_backend"] = "external_launcher"
            engine = self.engine = local_engine(
                "vllm",
                host.model_path,
                dtype=self.policy_cfg.dtype,
                seed=self.run_cfg.seed,
                gpu_memory_utilization=self.engine_cfg.vllm_gpu_memory_utilization,
                sleep_mode=self.engine_cfg.vllm_sleep,
                enforce_eager=self.engine_cfg.vllm_enforce_eager,
                **kwargs,
            )
            if self.engine_cfg.vllm_sleep and not engine.sleep_mode:
                host.log("vLLM: no sleep mode in this build (CPU): the engine stays awake in updates")
            policies = self.rollout_policies = (
                vllm_lora_policy_map(engine, host.roles)
                if lora
                else PolicyMap.shared(engine, host.roles)
            )
        if self.engine_cfg.backend == "openai":  # a vLLM server: a LoRA adapter per role, pushed over HTTP

            self.served = ServedAdapters(os.path.join(self.run_cfg.out_dir, "served-adapters"))
            policies = self.rollout_policies = served_rollout_policies(
                str(self.engine_cfg.base_url),
                host.roles,
                max_concurrency=self.engine_cfg.served_concurrency,
                timeout=self.engine_cfg.served_timeout,
                extra_body=self.engine_cfg.served_sampling,
            )
        return RolloutCollector(train_env, policies, sampling), RolloutCollector(eval_env, policies, sampling)

    # ------------------------------------------------------------------ rollouts
    def collect(self, collector: Any, tasks: Sequence[int], group_size: int, seed: int) -> RolloutBatch:
        """The iteration's rollout batch, identical on every rank; then the vLLM engine sleeps (where
        vLLM supports it) so that the update has its memory, until the next push wakes it."""
        if tasks:
            self.probe_once(collector, tasks[0], seed)
        batch = self._collect(collector, tasks, group_size, seed)
        if self.engine is not None:
            self.engine.sleep(level=1)  # no-op without sleep mode
        return batch

    def _collect(self, collector: Any, tasks: Sequence[int], group_size: int, seed: int) -> RolloutBatch:
        if not self.pinned_weights:  # asynchronous: the generator pushed the batch's own weights
            self.sync_weights()
        if self.scale_cfg.rollout_workers > 0:
            batch = collector.collect(tasks, group_size, seed=seed) if self.dist.is_main else None
            return broadcast_object(batch, self.dist)
        if not self.dist.enabled:
            return collector.collect(tasks, group_size, seed=seed)

        chunks = split_tasks(tasks, self.dist.world_size)
        mine = chunks[self.dist.rank] if self.dist.rank < len(chunks) else []
        local = collector.collect(mine, group_size, seed=seed) if mine else None
        return merge_batches([b for b in all_gather_objects(local, self.dist) if b is not None])

    def probe_once(self, collector: Any, task: int, seed: int) -> None:
        """backend=openai: :meth:`probe_served` before the run's first rollouts (no-op otherwise or after)."""
        if self.engine_cfg.backend == "openai" and not self._probed:
            self.probe_served(collector, task, seed)

    def probe_served(self, collector: Any, task: int, seed: int) -> dict[str, float]:
        """backend=openai, before the first update: one episode of ``task`` through the server, its
        behaviour log-probs against the learner's recompute (:func:`learners.served.check_logprobs`);
        raises :class:`learners.served.LogprobMismatchError` with the numbers beyond the tolerance. The
        learner's recompute is of its current weights, so an asynchronous run probes in the learner's
        thread before its generator starts (the generator serves older versions)."""

        self._probed = True
        rows = self._collect(collector, [task], 1, seed).rows
        for r in rows:
            if r.meta.get("evaluation_only"):
                raise ValueError(f"these rollouts are evaluation-only and cannot train: {r.meta['evaluation_only']}")
        out = check_logprobs(
            [r.behaviour_logprobs for r in rows],
            self.old_logprobs(rows),
            [r.response_mask for r in rows],
            self.engine_cfg.logprob_tolerance,
            when="before training (probe: one episode)",
            sent=request_sampling(self.engine_cfg.served_sampling),
        )
        self.host.log(
            f"served log-probs probe: mean |server - learner| {out['mean_abs']:.2e} per token (max "
            f"{out['max_abs']:.2e}) over {int(out['tokens'])} tokens of {int(out['rows'])} rows, within "
            f"--logprob-tolerance {self.engine_cfg.logprob_tolerance:g}"
        )
        return out

    def push_weights(self, states: dict[str, dict[str, torch.Tensor]], versions: list[int]) -> None:
        """Serve ``states`` (an older snapshot of the learner's weights, with its policy versions) from the
        rollout engine, unless it holds those versions already (the asynchronous generator's push): Ray
        rollout workers load them (a worker restarted later gets the same weights again); a served model
        (``backend=openai``) gets each role's adapter of that version."""
        if self._synced == list(versions):
            return
        if self.pool is not None:
            self.pool.load_weights({m: {k: v.to("cpu") for k, v in sd.items()} for m, sd in states.items()}, versions)
        elif self.engine_cfg.backend == "openai" and self.rollout_policies is not None:
            self.served.sync(self.rollout_policies, self.host.policies, snapshot=(versions, states))
        else:
            raise ValueError("push_weights needs Ray rollout workers (rollout_workers > 0) or a served model")
        self._synced = list(versions)

    def sync_weights(self) -> None:
        """Push the learner's weights to the rollout engine when its version moved (no-op in-process)."""
        host = self.host
        versions = [int(p.policy_version) for p in host.policies.policies]
        if self.fsdp:  # gathering is collective: every rank, also one without a rollout engine
            if self._synced != versions:
                self._sync_full_weights(versions)
            return
        if self._synced == versions or (self.pool is None and self.rollout_policies is None):
            self._synced = versions
            return
        if self.pool is not None:
            # vLLM workers of a bf16 run hold bf16 weights: ship them as such (half the bytes)
            engine_dtype = torch.bfloat16 if self.engine_cfg.backend == "vllm" and self.policy_cfg.dtype == "bfloat16" else None
            self.pool.load_weights(model_states(host.policies, dtype=engine_dtype), versions)
        if self.rollout_policies is not None and self.engine_cfg.backend == "openai":
            self.served.sync(self.rollout_policies, host.policies, force=self._synced is None)
        elif self.rollout_policies is not None:
            # shared: the full weights; sharing=lora: each role's adapter whose version moved (all of
            # them at the first sync: the engine starts from the checkpoint on disk)
            sync_rollout_engine(self.rollout_policies, host.policies, force=self._synced is None)
        self._synced = versions

    # ------------------------------------------------------------------ off-policy corrections
    def tis_level(self, ratio_level: str) -> str | None:
        """The TIS level of this run: None (off, or ``auto`` with HF rollouts), else ``tis`` or, for
        ``auto``, the loss's ``ratio_level``."""
        mode = self.update_cfg.tis
        if mode == "off" or (mode == "auto" and self.engine_cfg.backend == "hf"):
            return None
        return ratio_level if mode == "auto" else mode

    def recomputes_pi_old(self) -> bool:
        """Whether :meth:`prepare` replaces the rows' behaviour log-probs with the learner's recompute:
        with another rollout engine (vLLM), and under bf16 autocast, where the rollout's float32
        log-probs are not those of the training forward (the first ratio would not be 1)."""
        return self.engine_cfg.backend != "hf" or self.policy_cfg.dtype == "bfloat16"

    def prepare(
        self,
        batch: RolloutBatch,
        ratio_level: str = "token",
        norm: str = "sum",
        pi_old: Callable[[list[Any]], list[list[float]]] | None = None,
    ) -> tuple[RolloutBatch, torch.Tensor | None, dict]:
        """Refuse stale events; recompute ``pi_old`` (:meth:`recomputes_pi_old`) and the TIS weights.

        ``ratio_level``: the loss's (``--tis auto`` uses it); ``norm``: the ``c(K)`` of the event-level
        weight (SRPO's set normalisation, :func:`learners.offpolicy.tis_row_weights`). ``pi_old``: how
        to recompute the rows' log-probs (the trainer's, in its training composition; collective under
        torch.distributed); by default :meth:`old_logprobs` in batch order.

        Returns ``(batch, weights or None, stats)``; ``weights`` is ``[R, T]`` in row order (``T`` the
        batch's longest response, 0 on padding and env text): per token, or a row's / event's weight
        repeated on its tokens, for ``LossConfig.token_weights``. Stats (:func:`tis_stats`):
        ``rollout/tis_weight_mean``, ``rollout/tis_capped_frac`` and ``rollout/tis_ess`` (over loss
        tokens at token level, over rows otherwise).
        """
        host = self.host
        for r in batch.rows:  # e.g. a server that returned text without token ids (agents.openai_policy)
            if r.meta.get("evaluation_only"):
                raise ValueError(
                    f"these rollouts are evaluation-only and cannot train: {r.meta['evaluation_only']}"
                )
        version = lambda r: int(host.policies[r.role].policy_version)  # noqa: E731
        stats: dict[str, Any]
        if self.rollout_cfg.max_staleness == 0:  # synchronous: every row comes from the current weights
            rows, refused = refuse_stale_events(batch.rows, version, max_lag=0)
            stats = {"rollout/refused_events": float(refused)}
        else:  # asynchronous: admission control (learners.staleness), rows up to N versions behind
            admission = admit_rows(batch.rows, version, self.rollout_cfg.max_staleness)
            rows, refused = admission.rows, admission.events_dropped
            stats = {"rollout/refused_events": float(refused), **admission.stats()}
        if batch.rows and not rows:  # nothing left to train on: the engine did not generate with the weights sent
            lags = sorted({version(r) - int(r.policy_version) for r in batch.rows})
            raise RuntimeError(
                f"every event of this batch was refused: its rows are {lags} policy versions behind the learner "
                f"(at most {self.rollout_cfg.max_staleness} allowed, --max-staleness), so the rollout engine did "
                "not generate with the weights it was sent (a restarted Ray worker or a server that lost its "
                "adapters); nothing was trained on them"
            )
        if refused:
            batch = replace(batch, rows=rows)
        # the decoupled objective: pi_prox (the weights before this update) recomputed, weights pi_prox / mu
        decoupled = self.rollout_cfg.max_staleness > 0 and self.update_cfg.staleness_correction == "decoupled"
        if not (self.recomputes_pi_old() or decoupled) or not rows:
            return batch, None, stats
        # pi_old: the learner's log-probs of the rollout tokens under the weights that generated them,
        # from the training forward itself (autocast, temperature, chunking)
        recomputed = (pi_old or self.old_logprobs)(rows)
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
        # the probe's gate, every iteration (a server restarted with other settings), on the rows the current
        # weights generated: the recompute is of those weights, so an older version's rows (asynchronous
        # runs) differ by the update itself, which the decoupled objective weighs and rollout/mismatch_kl shows
        gated = [i for i, r in enumerate(rows) if int(r.policy_version) == version(r)]
        if self.engine_cfg.backend == "openai" and gated:
            check_logprobs(
                [rows[i].behaviour_logprobs for i in gated],
                [recomputed[i] for i in gated],
                [rows[i].response_mask for i in gated],
                self.engine_cfg.logprob_tolerance,
                when="in this iteration's rollouts",
                sent=request_sampling(self.engine_cfg.served_sampling),
            )
        new_rows = [
            replace(
                r,
                behaviour_logprobs=[float(x) for x in lp],
                meta={**r.meta, "rollout_logprobs": r.behaviour_logprobs},
            )
            for r, lp in zip(rows, recomputed, strict=True)
        ]
        batch = replace(batch, rows=new_rows)
        level = self.tis_level(ratio_level)
        if decoupled:  # --tis auto with hf rollouts: the loss's own level (tis off is refused by the config)
            level = level or ratio_level
        if level is None:
            return batch, None, stats
        ids: dict[str, int] = {}
        event_index = torch.tensor([ids.setdefault(r.event_id, len(ids)) for r in rows], dtype=torch.long)
        if decoupled:  # each row against its own behaviour version; SRPO's event weight on its c(K) scale
            weights, decoupled_stats = decoupled_correction(
                train, rollout, mask, level=level, cap=self.update_cfg.tis_cap, event_index=event_index, norm=norm
            )
            stats.update(decoupled_stats)
            return batch, weights, stats
        weights, tis = tis_weights_and_stats(
            train, rollout, mask, level=level, cap=self.update_cfg.tis_cap, event_index=event_index, norm=norm
        )
        stats.update(tis)
        return batch, weights, stats

    def old_logprobs(self, rows: Sequence[Any]) -> list[list[float]]:
        """``pi_old`` of every row (the trainer's ``old_logprobs``), each rank scoring only its own share.

        Every rank holds the whole batch; rather than each recomputing all of it, rank ``r`` scores the
        ``r``-th of ``world_size`` contiguous shares of about equal token counts and the shares are
        gathered in rank order, so every rank ends with every row's log-probs (the TIS weights and the
        normalisers span the whole batch). Under FSDP2 every forward is a collective that all ranks must
        call alike, so there each rank scores the whole batch as on one process.
        """
        rows = list(rows)
        if not self.dist.enabled or self.fsdp or not rows:
            return self.host.old_logprobs(rows)
        a, b = token_shares([len(r.prompt_ids) + len(r.response_ids) for r in rows], self.dist.world_size)[
            self.dist.rank
        ]
        mine = self.host.old_logprobs(rows[a:b]) if b > a else []
        return [lp for share in all_gather_objects(mine, self.dist) for lp in share]

    # ------------------------------------------------------------------ data parallelism
    def shard(self, mb: MiniBatch) -> MiniBatch:
        """This rank's event-atomic share of ``mb`` (``mb`` itself on one process)."""
        if not self.dist.enabled:
            return mb
        return shard_minibatch(mb, self.dist.rank, self.dist.world_size)

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the shards' gradients over the ranks (every rank then holds the whole minibatch's).

        Under FSDP2 backward already reduce-scattered them (summing), so there is nothing left to do.
        """
        if not self.fsdp:
            all_reduce_gradients(params, self.dist)

    def clip_gradients(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        """Clip to ``max_norm``; the norm before clipping (over all shards under FSDP2)."""
        if self.fsdp:
            return clip_grad_norm(params, max_norm)
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    # ------------------------------------------------------------------ FSDP2
    def shard_models(self) -> None:
        """``fully_shard`` every distinct policy model (FSDP2 only; before the optimizer is built)."""
        if self.fsdp:
            for pol in self.host.distinct_models():
                fsdp2_shard(pol.model)

    def agree_count(self, n: int) -> int:
        """The largest ``n`` over the ranks under FSDP2 (the number of micro-batches every rank runs)."""
        return all_reduce_max([n], self.dist)[0] if self.fsdp else n

    def forward_plan(self, chunks: Sequence[tuple[Any, list[int]]]) -> list[tuple[Any, list[int] | None]]:
        """The forward calls of one micro-batch, in lockstep with the other ranks under FSDP2.

        ``chunks``: ``(policy, row indices)`` per forward this rank needs. Without FSDP2 they are
        returned as they are. With it every forward of a sharded model all-gathers its layers and
        every backward reduce-scatters their gradients, so all ranks must call each model the same
        number of times in the same order, whatever their shards hold. The design: one all-reduce
        (max) of the per-model chunk counts, then for every distinct model in a fixed order this
        rank's chunks followed by ``(policy, None)`` entries up to the agreed count. The caller runs a
        ``None`` entry as a forward on a one-token input and adds ``0 * logits.sum()`` to its loss: it
        issues the same collectives and contributes exactly zero gradient, so the summed gradient stays
        the single-process gradient of the whole minibatch. A rank with fewer micro-batches runs whole
        dummy micro-batches (``forward_plan([])``, see :meth:`agree_count`).
        """
        if not self.fsdp:
            return list(chunks)
        models = self.host.distinct_models()
        slot = {id(pol.model): i for i, pol in enumerate(models)}
        mine: list[list[tuple[Any, list[int] | None]]] = [[] for _ in models]
        for pol, idx in chunks:
            mine[slot[id(pol.model)]].append((pol, idx))
        agreed = all_reduce_max([len(m) for m in mine], self.dist)
        plan: list[tuple[Any, list[int] | None]] = []
        for pol, own, n in zip(models, mine, agreed, strict=True):
            plan.extend(own)
            plan.extend((pol, None) for _ in range(n - len(own)))
        return plan

    def dummy_inputs(self) -> dict[str, torch.Tensor]:
        """A one-token input for a lockstep forward (see :meth:`forward_plan`)."""
        device = self.host.device
        return {
            "input_ids": torch.zeros(1, 1, dtype=torch.long, device=device),
            "attention_mask": torch.ones(1, 1, dtype=torch.long, device=device),
        }

    def model_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Full weights of every distinct model (``model<i>``); collective under FSDP2."""
        return {f"model{i}": full_model_state(p.model) for i, p in enumerate(self.host.distinct_models())}

    def load_model_states(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        """Load full weights (a checkpoint's, any world size) into the learner's models."""
        for tensors, pol in zip(states.values(), self.host.distinct_models(), strict=True):
            load_full_model_state(pol.model, dict(tensors))

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's full state in the single-process layout; collective under FSDP2."""
        return full_optimizer_state(optimizer) if self.fsdp else optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        load_full_optimizer_state(optimizer, state)

    def full_policies(self) -> list[Any]:
        """One policy per distinct model with full, current weights (for ``save_pretrained``).

        Without FSDP2 the learner's own. With it (collective: every rank calls) the unsharded rollout
        copy after a sync, or, when rollouts run elsewhere, a copy built on rank 0 for the occasion;
        other ranks get ``[]``.
        """
        if not self.fsdp:
            return self.host.distinct_models()

        self.sync_weights()
        if self.rollout_copy is not None:
            return distinct_models(self.rollout_copy) if self.dist.is_main else []
        states = self.model_states()
        if not self.dist.is_main:
            return []
        copy = self._policy_factory()()
        load_model_states(copy, states)
        return distinct_models(copy)

    def policy_copy(self) -> PolicyMap:
        """A fresh, unsharded copy of the learner's policies (same sharing, device and dtype; the
        checkpoint's weights, not the learner's: load them), e.g. the asynchronous generator's."""
        return self._policy_factory()()

    def _policy_factory(self) -> Any:
        host = self.host
        return engine_factory(
            "hf",
            host.model_path,
            host.roles,
            sharing=self.policy_cfg.sharing,
            lora_rank=self.policy_cfg.lora_rank,
            device=str(host.device),
            dtype=_master_dtype(self.policy_cfg.dtype),
        )

    def _sync_full_weights(self, versions: list[int]) -> None:
        """FSDP2: gather the full weights (every rank) and load them into this rank's rollout engines."""

        states = self.model_states()
        if self.rollout_copy is not None:
            load_model_states(self.rollout_copy, states, versions)
        if self.pool is not None:
            cpu = {m: {k: v.to("cpu") for k, v in sd.items()} for m, sd in states.items()}
            self.pool.load_weights(cpu, versions)
        if self.rollout_policies is not None:  # vLLM, sharing=shared (LoRA is refused under FSDP2)
            for engine in {id(e): e for e in self.rollout_policies.policies}.values():
                engine.load_weights(states["model0"], policy_version=versions[0])
        self._synced = versions

    def close(self) -> None:
        """Stop the Ray workers (the process group stays: the launcher owns the processes)."""
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
