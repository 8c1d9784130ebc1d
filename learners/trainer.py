"""The rollout -> update loop: one update path for every algorithm, looked up by name.

Per iteration:

1. sample ``tasks_per_iter`` training tasks and roll out ``group_size`` episodes of each
   (:class:`agents.rollout.RolloutCollector`; one batched generate per round); with ``filter_groups``
   (DAPO's dynamic sampling, :mod:`learners.dynamic_sampling`) groups whose rewards are all equal are
   dropped and further tasks rolled out until ``tasks_per_iter`` groups with a signal remain;
2. build the batch's events once (:func:`learners.batching.build_event_table`: row -> event,
   event -> comparable group / episode, row -> role, the per-event reward terms) and compute one
   advantage per row with the estimator the algorithm names (:data:`learners.advantages.ADV_ESTIMATORS`;
   an algorithm with a critic first gets the critic's per-event values);
3. ``epochs`` passes over event-atomic minibatches (:mod:`learners.batching`), each collated once;
   every minibatch is split into event-atomic micro-batches bounded by ``max_tokens_per_microbatch``,
   each forwarded (per distinct model: shared, per-role or LoRA-per-role), scored by the policy loss
   the algorithm names (:data:`learners.losses.POLICY_LOSSES`) with the *whole minibatch's*
   normaliser, plus optional k3 KL to a frozen reference and an entropy bonus, and back-propagated;
   then one gradient clip and one optimizer step per minibatch (so the gradient equals one big batch's
   while peak memory follows the micro-batch);
4. diagnostics to ``metrics.jsonl`` (and each ``--logger`` backend, :mod:`learners.tracking`), held-out evaluation every ``eval_every``
   iterations, and a checkpoint (weights, optimizer, scheduler, RNG states, iteration) that
   ``resume`` continues from bit-identically on CPU.

Where the parts live (each built here with its own sections of the config, :mod:`learners.config`):
the rollouts of step 1 in :mod:`learners.rollout_phase`, steps 2-3 in :mod:`learners.update` (the
public step is :meth:`Trainer.update`), the forwards and ``pi_old`` in :mod:`learners.forward`, the
metrics file, checkpoints and export of step 4 in :mod:`learners.run_state`, and the process layout
and rollout engine in :mod:`learners.scale` (which sees the trainer only through
:class:`learners.scale.ScaleHost`). This module keeps the config, the wiring and the loop.

The algorithms (:data:`learners.algorithms.ALGORITHMS`: srpo, grpo, dr-grpo, gspo, dr-mas, at-grpo,
rloo, mappo) differ only in the estimator / loss / defaults they name; the loop never branches on
the name. Everything random is seeded from ``(seed, iteration)``, so a resumed run replays exactly
what the uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import srpo_envs
from agents.hf import HFPolicy, enable_gradient_checkpointing
from agents.lora import default_lora_config, lora_policy_map
from agents.model_source import resolve_model
from agents.policy import PolicyMap, SamplingParams
from agents.ray_rollout import distinct_models, load_model_states
from agents.rollout import RolloutBatch, RolloutCollector
from learners import checkpoint as ckpt
from learners import config as config_sections
from learners import guard, state_check
from learners.algorithms import ALGORITHMS, Algorithm, get_algorithm  # noqa: F401 (re-exported)
from learners.async_rollout import RolloutPipeline
from learners.config import (  # noqa: F401 (re-exported: the config's old home)
    DTYPES,
    EXTENDABLE_FIELDS,
    INF_OK_FIELDS,
    LAYOUT_FIELDS,
    SHARING,
    SRPO_NORMS,
    TrainConfig,
)
from learners.critic import ValueCritic
from learners.diagnostics import GradingMonitor
from learners.distributed import broadcast_object
from learners.forward import PolicyForward, generation_autocast
from learners.memory_plan import PlanOptions, check_memory, load_model_shape, plan_memory
from learners.rollout_phase import RolloutPhase
from learners.run_state import RunState
from learners.scale import ScaleOut
from learners.tracking import flatten_config, open_trackers
from learners.update import PolicyUpdate
from srpo_common.interrupt import set_resume_point
from srpo_common.io import atomic_write_json


def with_reward(
    factory: Callable[[], Any], reward: Callable[[dict[str, Any], Any], float]
) -> Callable[[], Any]:
    """The env factory ``factory`` whose envs score episodes with ``reward`` (``reward_fn`` of the
    unwrapped env; a wrapper's own attributes are left alone)."""

    def make() -> Any:
        built = factory()
        built.unwrapped.reward_fn = reward
        return built

    return make


def run_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """What a finished run did to held-out accuracy: first and last evaluation, and a verdict (``better``,
    ``same``, ``worse``, or ``unevaluated`` without two evaluations), written to ``OUT/summary.json`` and
    said in the run's last line: a run that made its model worse says so even when it exits 0."""
    evals = [(int(h["iteration"]), float(h["eval_accuracy"])) for h in history if h.get("eval_accuracy") is not None]
    out: dict[str, Any] = {"iterations": int(history[-1]["iteration"]) if history else 0, "evaluations": len(evals)}
    if len(evals) < 2:
        return {**out, "verdict": "unevaluated", "line": "held-out accuracy: not evaluated at the start and the end"}
    (i0, a0), (i1, a1) = evals[0], evals[-1]
    verdict = "better" if a1 > a0 else "worse" if a1 < a0 else "same"
    line = f"held-out accuracy: {a0:.3f} (iteration {i0}) -> {a1:.3f} (iteration {i1})"
    if verdict == "worse":
        line += f": WORSE than the start by {100 * (a0 - a1):.1f} pt (the trained model in final/ is the worse one)"
    return {
        **out, "start_iteration": i0, "start_accuracy": a0, "final_iteration": i1, "final_accuracy": a1,
        "delta": a1 - a0, "verdict": verdict, "line": line,
    }  # fmt: skip


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available else ``cpu``; ``cuda[:i]`` must be available."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available (use --device cpu or auto)")
    return dev


class Trainer:
    """Runs :class:`TrainConfig`; see the module docstring for the loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        log: Callable[[str], None] | None = print,
        start_from: str | os.PathLike[str] | None = None,
        *,
        env: Callable[[], Any] | None = None,
        eval_env: Callable[[], Any] | None = None,
        policies: HFPolicy | PolicyMap | None = None,
        reward: Callable[[dict[str, Any], Any], float] | None = None,
    ) -> None:
        """Build the run of ``cfg``; ``start_from``: a run or checkpoint directory whose checkpoint this
        trainer continues (:meth:`resume_from`), else iteration 0 (see also :meth:`continue_from`).

        ``env`` / ``eval_env``: zero-argument factories of the training and held-out envs (each an
        ``srpo_envs.base.EventParallelEnv``; the held-out one defaults to ``env``), used instead of
        ``srpo_envs.make(cfg.env_id, **cfg.env_kwargs)`` (and its ``eval_env_kwargs``): an env of your own,
        built your way, without registering it. ``cfg.env_id`` then only names the run's env. Ray rollout
        workers receive the factories pickled (cloudpickle), so they must not hold open resources.

        ``policies``: the models to train, built your way: one :class:`agents.hf.HFPolicy` (shared by every
        role) or a :class:`agents.policy.PolicyMap` of them (a policy per role, or LoRA views of one base),
        trained in place instead of loading ``cfg.model`` (which, when set, still names the weights that
        copies of the policy are built from: Ray workers, the asynchronous generator, a critic).

        ``reward``: ``reward(outcome, env) -> float``, the team reward of each training episode instead
        of the env's own (:attr:`srpo_envs.base.EventParallelEnv.reward_fn`); evaluation still counts the
        env's ``correct``."""

        self.cfg = cfg
        self.log = log or (lambda s: None)
        self._quiet = log is None
        self.out = Path(cfg.out_dir)
        self.algorithm: Algorithm = get_algorithm(cfg.algo)
        self.device = resolve_device(cfg.device)
        #: process layout (torchrun / accelerate ranks), Ray workers and the rollout engine
        self.scale = ScaleOut(self)
        self.dist = self.scale.dist
        self.device = self.scale.rank_device(self.device)
        if not self.dist.is_main:  # one rank reports (every rank computes the same numbers)
            self.log, self._quiet = (lambda s: None), True
        #: master-weight dtype: float32 for float32 and bfloat16 (autocast), float64 for exact tests
        self.param_dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)

        def registered_train_env() -> Any:
            return srpo_envs.make(cfg.env_id, **cfg.env_kwargs)

        def registered_eval_env() -> Any:
            return srpo_envs.make(cfg.env_id, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})

        train_env = env or registered_train_env
        eval_env = eval_env or env or registered_eval_env
        if reward is not None:
            train_env = with_reward(train_env, reward)

        probe = train_env()
        self.roles = sorted({probe.role_of(a) for a in probe.possible_agents})
        self.n_train_tasks = len(probe.unwrapped.tasks)
        self.n_eval_tasks = len(eval_env().unwrapped.tasks)
        self.policies = self._build_policies() if policies is None else self._given_policies(policies)
        sampling = SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens
        )
        self.collector, self.eval_collector = self.scale.collectors(train_env, eval_env, sampling)

        self.ref_models: dict[int, torch.nn.Module] = {}  # frozen copies, taken before any sharding
        if cfg.kl_coef > 0:
            for pol in self.policies.policies:
                key = id(pol.model)
                if key not in self.ref_models:
                    ref = copy.deepcopy(pol.model).eval()
                    for p in ref.parameters():
                        p.requires_grad_(False)
                    self.ref_models[key] = ref
        self.scale.shard_models()  # dp_engine=fsdp2: the optimizer below must see the sharded parameters
        params: dict[int, torch.nn.Parameter] = {}
        for pol in self.policies.policies:
            for p in pol.model.parameters():
                if p.requires_grad:
                    params.setdefault(id(p), p)
        self.params = list(params.values())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / cfg.warmup) if cfg.warmup > 0 else 1.0
        )
        self.critic: ValueCritic | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if self.algorithm.critic:
            self.critic = ValueCritic.from_pretrained(
                self.model_path,
                max_tokens=cfg.critic_max_tokens,
                pack_len=cfg.pack_len if cfg.prefix_tree else None,
            )
            self.critic.to(device=self.device, dtype=self.param_dtype)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr)
        self.iteration = 0
        # The rooms, each with its own sections of the config (learners.config), never the whole of it:
        #: the training forwards and pi_old ([policy], [update], the rollouts' temperature)
        self.forward = PolicyForward(
            self.policies, self.scale, self.device, self.param_dtype,
            cfg.policy, cfg.update, cfg.rollout.temperature, ref_models=self.ref_models,
        )  # fmt: skip
        #: the update step ([update], [critic], [guard], the run's seed)
        self.updater = PolicyUpdate(
            self.forward, self.scale, self.policies, self.params, self.optimizer, self.scheduler,
            self.critic, self.critic_optimizer, update=cfg.update, critic_cfg=cfg.critic, guard=cfg.guard,
            seed=cfg.seed, norm_len=cfg.rollout.max_new_tokens, out_dir=str(self.out),
        )  # fmt: skip
        #: an iteration's rollouts incl. dynamic sampling ([rollout], the run's seed)
        self.rollout_phase = RolloutPhase(self.scale, self.collector, self.n_train_tasks, cfg.rollout, cfg.seed)
        #: metrics file, checkpoints and export of out_dir
        self.run_state = RunState(
            self.out, self.scale, self.policies, self.optimizer, self.scheduler,
            self.critic, self.critic_optimizer, log=self.log,
        )  # fmt: skip
        #: max_staleness >= 1: the generator thread while training, and the weight snapshots a resumed
        #: checkpoint carried for the batches that were in flight (learners.async_rollout)
        self._pipeline: RolloutPipeline | None = None
        self._carried_snapshots: dict[int, Any] = {}
        if start_from is not None:
            self.resume_from(start_from)

    def reconfigure(self, **changes: Any) -> None:
        """Change config fields of a built trainer (tests, experiments): the config is re-validated and
        every part gets its new sections. Only fields its parts read after construction take effect
        (batching, loss, forward and TIS settings); the model, sharing and optimizers stay as built."""
        self.cfg = replace(self.cfg, **changes)
        self._hand_out_sections()

    def _hand_out_sections(self) -> None:
        """Give every part its current sections (after :meth:`reconfigure`, or a field assigned on
        ``self.cfg``: its section views are then rebuilt, so a part holding an old one is found by identity)."""
        cfg = self.cfg
        self.scale.configure(cfg)
        self.forward.configure(cfg.policy, cfg.update, cfg.rollout.temperature)
        self.updater.configure(cfg.update, cfg.critic, cfg.guard, cfg.rollout.max_new_tokens)
        self.rollout_phase.rollout = cfg.rollout

    def distinct_models(self) -> list[HFPolicy]:
        """One policy per distinct model object (LoRA views of one base count once), in the order weight
        snapshots and Ray workers name them (``model<i>``: :func:`agents.ray_rollout.distinct_models`)."""

        return distinct_models(self.policies)

    # ------------------------------------------------------------------ policies
    def _build_policies(self) -> PolicyMap:
        cfg = self.cfg
        if not cfg.model:
            raise ValueError("TrainConfig.model must name a model directory or hub id")
        #: the local directory of ``cfg.model`` (a hub id is looked up in the hub cache, downloaded
        #: when online; offline and uncached it is a ModelNotAvailable error that says how to fetch it)
        self.model_path = str(resolve_model(cfg.model))
        if self.device.type == "cuda":
            self._memory_plan()

        def load() -> HFPolicy:
            pol = HFPolicy(self.model_path, device=self.device, dtype=self.param_dtype)
            if cfg.gradient_checkpointing:
                enable_gradient_checkpointing(pol.model)
            return pol

        if cfg.sharing == "shared":
            policies = PolicyMap.shared(load(), self.roles)
        elif cfg.sharing == "per-role":
            policies = PolicyMap.per_role({role: load() for role in self.roles})
        else:
            policies = lora_policy_map(load(), self.roles, lora_config=default_lora_config(r=cfg.lora_rank))
            if cfg.gradient_checkpointing:  # again on the PeftModel: the recompute re-enters each role's adapter
                enable_gradient_checkpointing(policies.policies[0].model)
        for pol in policies.policies:  # rollouts in the training dtype (bf16 autocast on a GPU)
            pol.autocast_dtype = generation_autocast(cfg.dtype, self.device)
        return policies

    def _given_policies(self, given: HFPolicy | PolicyMap) -> PolicyMap:
        """``policies=`` of the constructor as a :class:`PolicyMap` over the env's roles: every role
        covered and every policy trainable (an ``HFPolicy``), else a ``ValueError``/``TypeError`` that says
        which; its model path (for copies) is ``cfg.model`` or the model's own ``name_or_path``."""
        policies = given if isinstance(given, PolicyMap) else PolicyMap.shared(given, self.roles)
        missing = [role for role in self.roles if role not in policies]
        if missing:
            raise ValueError(f"policies= has no policy for the env's roles {missing} (roles: {self.roles})")
        for pol in policies.policies:
            if not isinstance(pol, HFPolicy):
                raise TypeError(
                    f"policies= must hold HFPolicy objects (the trainer updates their weights), got "
                    f"{type(pol).__name__}; a served or scripted policy can play (srpo demo) but not train"
                )
        cfg = self.cfg
        name = cfg.model or getattr(policies.policies[0].model.config, "name_or_path", "")
        self.model_path = str(resolve_model(name)) if name else ""
        copies = {
            "a critic (algo with a value model)": self.algorithm.critic,
            "Ray rollout workers": cfg.rollout_workers > 0,
            "the asynchronous generator (max_staleness >= 1)": cfg.max_staleness >= 1,
            "a vLLM engine": cfg.backend == "vllm",
            "dp_engine=fsdp2": cfg.dp_engine == "fsdp2",
        }
        needs = [what for what, on in copies.items() if on]
        if needs and not self.model_path:
            raise ValueError(
                f"{needs[0]} is built from the model's weights on disk: with policies= whose model has no "
                "name_or_path, set TrainConfig.model to a directory holding the same architecture"
            )
        return policies

    def _memory_plan(self) -> None:
        """GPU runs: the memory plan of this run on this rank's GPU, logged before the model loads; one
        that does not fit is a :class:`learners.memory_plan.MemoryPlanError` (unless not ``memory_check``)
        that lists what would fit, instead of an out-of-memory error minutes in."""

        options = PlanOptions.from_train_config(
            self.cfg, len(self.roles), self.dist.world_size, critic=self.algorithm.critic
        )
        try:
            shape = load_model_shape(self.model_path)
        except ValueError as exc:
            # a config the plan cannot read (not a decoder LM's keys): no plan, no refusal
            self.log(f"memory plan unavailable: {exc}")
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        self.log(check_memory(plan_memory(shape, options, total), refuse=self.cfg.memory_check))

    def _model_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Weights of every distinct model (``model<i>`` in :meth:`distinct_models` order)."""
        return {
            f"model{i}": {k: v.detach().clone() for k, v in pol.model.state_dict().items()}
            for i, pol in enumerate(self.distinct_models())
        }

    # ------------------------------------------------------------------ forwards and the update
    def old_logprobs(self, rows: list[Any]) -> list[list[float]]:
        """``pi_old`` of ``rows`` in batch order by the training forward (:meth:`PolicyForward.old_logprobs`)."""
        return self.forward.old_logprobs(rows)

    def rollout(self, iteration: int | None = None) -> RolloutBatch:
        """One iteration's rollouts, as the training loop collects them: ``tasks_per_iter`` tasks x
        ``group_size`` episodes with the current weights, seeded by ``(seed, iteration)`` (default: the
        next iteration, ``self.iteration + 1``), dynamic sampling applied, events missing a member dropped.
        The batch holds one row per agent output (``batch.rows``) and the episodes' outcomes; pass it to
        :meth:`update`."""
        it = self.iteration + 1 if iteration is None else int(iteration)
        _, batch, _ = self.rollout_phase.run(it)
        return batch

    def update(self, batch: RolloutBatch, iteration: int | None = None) -> dict[str, Any]:
        """Train on ``batch`` as iteration ``iteration`` (default: the next, ``self.iteration + 1``):
        advantages once, then ``epochs`` x minibatches of (micro-batched) loss and one optimizer step each
        (:meth:`learners.update.PolicyUpdate.update`); returns the iteration's ``actor/...``,
        ``critic/...`` and ``rollout/...`` metrics. ``iteration`` seeds the minibatch shuffles (what the
        loop passes: the iteration being trained, from 1); after it the trainer is at ``iteration`` (a
        checkpoint saved then records it)."""
        iteration = self.iteration + 1 if iteration is None else int(iteration)
        if self.updater.section is not self.cfg.update:  # a field was assigned on self.cfg since the parts got theirs
            self._hand_out_sections()
        stats = self.updater.update(batch, iteration)
        self.iteration = iteration
        return stats

    @property
    def nonfinite_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient (whole run)."""
        return self.updater.nonfinite_steps

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, n: int | None = None, k: int | None = None, seed: int = 10_007) -> float:
        """Held-out team accuracy: ``n`` eval-split tasks x ``k`` samples, fixed sampling seeds."""
        with self.scale.generation_lock:  # async + Ray workers: not while the generator holds them
            self.scale.sync_weights()  # every rank: under FSDP2 gathering the weights is collective
            if not self.dist.is_main:  # rank 0 evaluates; every rank returns its number
                return broadcast_object(None, self.dist)
            n = min(n or self.cfg.eval_problems, self.n_eval_tasks)
            batch = self.eval_collector.collect(list(range(n)), group_size=k or self.cfg.eval_k, seed=seed)
            return broadcast_object(batch.accuracy, self.dist)

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        """Run :meth:`_train_loop` with the run's trackers open (closed however the loop ends)."""
        self.run_state.tracker = open_trackers(
            (*self.cfg.logger, *(("tensorboard",) if self.cfg.tensorboard else ())), self.out,
            resume=self.iteration > 0, echo=None if self._quiet else self.log, main=self.dist.is_main,
        )  # fmt: skip
        try:
            # `section.field` keys, the paths `--set` and experiment files use; a resumed run's backends skip it
            self.run_state.tracker.log_hparams(flatten_config(config_sections.flat_to_sections(asdict(self.cfg))))
            return self._train_loop()
        finally:
            self.run_state.tracker.close()
            self.run_state.tracker = None

    def _train_loop(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:  # the resolved config: `srpo train --config OUT/config.toml` reruns this run
            config_sections.write_run_config(cfg, self.out)
        history = self.run_state.start_metrics(self.iteration)
        grading = GradingMonitor()  # grading/... deltas per record (the first includes iteration 0's eval)
        if cfg.eval_every and self.iteration == 0 and not history:
            acc = self.evaluate()
            self._append_metrics({"iteration": 0, "eval_accuracy": acc})
            history.append({"iteration": 0, "eval_accuracy": acc})
            self.log(f"[{cfg.algo}] iteration 0: held-out accuracy {acc:.3f}")
        try:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=cfg.iterations,
                initial=self.iteration,
                desc=f"{cfg.algo} train",
                disable=self._quiet,
            )
        except ImportError:  # pragma: no cover - tqdm is a core dependency
            bar = None
        pipeline = self._pipeline = self._start_pipeline() if cfg.max_staleness else None
        try:
            history = self._iterations(history, grading, bar, pipeline)
        finally:
            if pipeline is not None:
                pipeline.close()
                self._pipeline = None
                self.scale.pinned_weights = False
                torch.set_num_threads(self._learner_threads)
        if bar is not None:
            bar.close()
        if self.dist.is_main or self.scale.fsdp:  # FSDP2: every rank helps gather, rank 0 writes
            self.export(self.out / "final")
        if self.dist.is_main:
            summary = run_summary(history)
            atomic_write_json(self.out / "summary.json", summary)  # `srpo train` prints its line last
        self.scale.close()
        return history

    def _iterations(
        self, history: list[dict[str, Any]], grading: GradingMonitor, bar: Any, pipeline: RolloutPipeline | None
    ) -> list[dict[str, Any]]:
        """The loop's iterations: rollouts (here, or from the generator thread with ``max_staleness``),
        update, metrics, guard, checkpoint."""
        cfg = self.cfg
        while self.iteration < cfg.iterations:
            it = self.iteration + 1
            t0 = time.perf_counter()
            timing: dict[str, Any] = {}
            if pipeline is None:
                generated, batch, filtered = self.rollout_phase.run(it)
                t1 = time.perf_counter()
                rollout_s = t1 - t0
            else:  # generated beside the previous updates: rollout_s is the generator's time on it
                produced = pipeline.take(it)
                generated, batch, filtered = produced.result
                t1 = time.perf_counter()
                rollout_s = produced.gen_s
                timing = {"rollout_wait_s": round(produced.wait_s, 3), "rollout/weights_of": produced.weights_of}
            stats = self.update(batch, it) if batch.rows else {}
            if pipeline is not None:  # the weights the generator's next batches need (it may be waiting)
                pipeline.publish(it, self._snapshot())
            t2 = time.perf_counter()
            # what the policy did: every episode rolled out this iteration, kept for the update or not
            rewards = np.array([e.reward for e in generated.episodes])
            record: dict[str, Any] = {
                "iteration": it,
                "train_accuracy": generated.accuracy,
                "reward_mean": float(rewards.mean()),
                "reward_std": float(rewards.std()),
                "mean_response_len": float(np.mean([len(r.response_ids) for r in generated.rows])),
                "team_tokens": int(sum(e.team_tokens for e in generated.episodes)),
                "rows": len(batch.rows),
                "rollout_s": round(rollout_s, 3),
                "update_s": round(t2 - t1, 3),
                **timing,
                **(filtered.metrics() if filtered is not None else {}),
                **stats,
            }
            if cfg.eval_every and (it % cfg.eval_every == 0 or it == cfg.iterations):
                record["eval_accuracy"] = self.evaluate()
            record.update(grading.delta())
            self.iteration = it
            self._append_metrics(record)
            history.append(record)
            self._check_divergence(record, history)  # before this iteration's weights are saved
            if cfg.save_every and (it % cfg.save_every == 0 or it == cfg.iterations):
                self.save_checkpoint()
            if bar is not None:
                bar.update(1)
                loss = stats.get("actor/loss", float("nan"))
                bar.set_postfix(acc=f"{batch.accuracy:.2f}", loss=f"{loss:.3f}")
        return history

    # ------------------------------------------------------------------ asynchronous rollouts
    def _snapshot(self) -> tuple[list[int], dict[str, dict[str, torch.Tensor]]]:
        """The policies' versions and a clone of the weights now: what the generator loads."""
        return [int(p.policy_version) for p in self.policies.policies], self._model_states()

    def _start_pipeline(self) -> RolloutPipeline:
        """``max_staleness >= 1``: the generator thread (:mod:`learners.async_rollout`) with its own copy of
        the policies and its own rollout phase, started from the current weights and, on resume, from the
        older ones the checkpoint carried. The generator uses one torch thread, the learner the rest."""

        if self.dist.enabled:
            raise ValueError("max_staleness >= 1 runs in one process; under torchrun train with max_staleness 0")
        snapshots = {**self._carried_snapshots, self.iteration: self._snapshot()}
        self._carried_snapshots = {}
        self._learner_threads = torch.get_num_threads()
        if self.scale.pool is not None or self.cfg.backend == "openai":  # each batch's weights pushed there first
            if self.cfg.backend == "openai":  # the probe compares with the learner's current weights: before
                # the generator serves older ones (the task and seed of the synchronous loop's first probe)
                first = self.rollout_phase.first_collect(self.iteration + 1)
                with self.scale.generation_lock:
                    self.scale.probe_once(self.collector, *first)
            return self._engine_pipeline(snapshots)
        copy = self.scale.policy_copy()
        for pol in copy.policies:
            pol.autocast_dtype = generation_autocast(self.cfg.dtype, self.device)
        c = self.collector
        phase = RolloutPhase(
            self.scale, RolloutCollector(c.env_fn, copy, c.sampling, c.prompts), self.n_train_tasks,
            self.cfg.rollout, self.cfg.seed,
        )  # fmt: skip

        def load(done: int, snap: tuple[list[int], dict[str, dict[str, torch.Tensor]]]) -> None:
            load_model_states(copy, snap[1], snap[0])

        torch.set_num_threads(max(1, self._learner_threads - 1))
        return RolloutPipeline(
            phase.run, load, self.cfg.max_staleness, self.iteration + 1, self.cfg.iterations, snapshots, gen_threads=1
        )

    def _engine_pipeline(self, snapshots: dict[int, Any]) -> RolloutPipeline:
        """The generator thread driving the Ray rollout workers or the served model (:meth:`ScaleOut.collect`
        is the seam): it pushes the batch's snapshot to the engine (:meth:`ScaleOut.push_weights`: the
        workers' weights, or each role's adapter of that version on the server) and collects under
        ``scale.generation_lock`` (evaluation, which pushes the learner's current weights, takes it too), so
        every batch is generated with exactly its weights; a Ray worker lost mid-flight is restarted with
        them and its share re-run, as today."""
        held: dict[str, Any] = {}

        def load(done: int, snap: tuple[list[int], dict[str, dict[str, torch.Tensor]]]) -> None:
            held["snap"] = snap

        def generate(it: int) -> Any:
            versions, states = held["snap"]
            with self.scale.generation_lock:
                self.scale.push_weights(states, versions)
                return self.rollout_phase.run(it)

        self.scale.pinned_weights = True
        return RolloutPipeline(
            generate, load, self.cfg.max_staleness, self.iteration + 1, self.cfg.iterations, snapshots, gen_threads=1
        )

    def _async_state(self) -> dict[str, Any]:
        """max_staleness >= 1: the weight snapshots the in-flight batches are generated with, so that a
        resumed run regenerates exactly them (the batches themselves are discarded: learners.async_rollout)."""
        if self._pipeline is None:
            return {}
        snaps = self._pipeline.checkpoint_snapshots(self.iteration)
        return {"async_snapshots": {str(k): {"versions": v, "models": m} for k, (v, m) in snaps.items()}}

    # ------------------------------------------------------------------ run state
    # The metrics file, checkpoints and export live in learners.run_state (formats in learners.checkpoint).
    @property
    def metrics_path(self) -> Path:
        return self.run_state.metrics_path

    def _append_metrics(self, record: dict[str, Any]) -> None:
        """One row to metrics.jsonl and the other --logger backends (outside train(): metrics.jsonl)."""
        self.run_state.append_metrics(record)

    @property
    def checkpoint_path(self) -> Path:
        """The run's checkpoint directory (see :mod:`learners.checkpoint` for its files)."""
        return self.run_state.checkpoint_path

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: full weights, optimizer, scheduler, RNGs."""
        return {**self.run_state.state(self.iteration, asdict(self.cfg)), **self._async_state()}

    def save_checkpoint(self) -> Path | None:
        """Publish :meth:`checkpoint_state` atomically (rank 0 writes under torch.distributed); weights
        that are not finite are never written (:class:`~learners.state_check.NonFiniteError`)."""
        saved = self.run_state.save(self.checkpoint_state())
        if saved is not None:
            set_resume_point(
                f"the last checkpoint is {self.checkpoint_path} (iteration {self.iteration}); rerun the same "
                "command with --resume to continue from it"
            )
        return saved

    def _check_divergence(self, record: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """:mod:`learners.guard` on this iteration's record: a :class:`~learners.guard.DivergenceError`
        (exit 3) before the diverged weights are checkpointed or exported."""
        kept = ckpt.find_checkpoint(self.out)
        guard.check(
            record,
            guard.GuardLimits.from_config(self.cfg),
            start=guard.start_accuracy(history),
            eval_samples=min(self.cfg.eval_problems, self.n_eval_tasks) * self.cfg.eval_k,
            where=f"the last checkpoint ({kept}) is kept" if kept else f"no checkpoint was written in {self.out}",
        )

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None) -> None:
        """Restore a checkpoint (run or checkpoint directory) and drop metrics logged after it.

        Every sha256 is checked before anything is restored, so a corrupt checkpoint raises
        :class:`learners.checkpoint.CheckpointError` and leaves this trainer untouched.
        """
        state = ckpt.load_checkpoint(path or self.out)
        state_check.validate_train_state(state)  # junk values: one CheckpointError, before anything is touched
        try:
            saved = TrainConfig.from_dict(dict(state["config"]))
        except (TypeError, ValueError) as exc:
            where = path or self.out
            raise ckpt.CheckpointError(f"checkpoint in {where} has an invalid config: {exc}") from None
        old, new = (
            {k: v for k, v in asdict(c).items() if k not in LAYOUT_FIELDS + EXTENDABLE_FIELDS}
            for c in (saved, self.cfg)
        )
        if old != new:
            diff = {k for k in old if old[k] != new[k]}
            raise ckpt.CheckpointConfigError(
                f"checkpoint in {path or self.out} was written with a different config (differs in "
                f"{sorted(diff)}); resume with the same options, or train without --resume"
            )
        if self.cfg.iterations < int(state["iteration"]):
            raise ckpt.CheckpointConfigError(
                f"checkpoint in {path or self.out} is at iteration {state['iteration']}, past --iterations "
                f"{self.cfg.iterations}; resume with --iterations >= {state['iteration']}"
            )
        self.iteration = self.run_state.restore(state)  # weights, optimizers, RNGs; metrics cut to it
        self._carried_snapshots = {  # max_staleness >= 1: the in-flight batches' weights
            int(k): ([int(v) for v in snap["versions"]], snap["models"])
            for k, snap in state.get("async_snapshots", {}).items()
        }

    def export(self, out: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` of the trained policy (one folder per distinct model)."""
        return self.run_state.export(out)

    # ------------------------------------------------------------------ where a run starts
    def resume_from(self, path: str | os.PathLike[str] | None = None) -> None:
        """Continue a checkpointed run: :meth:`load_checkpoint` of ``path`` (a run or checkpoint
        directory; by default this run's ``out_dir``); :meth:`train` then goes on from its iteration."""
        self.load_checkpoint(path)

    def start_fresh(self) -> None:
        """A fresh run in ``out_dir``: a previous checkpoint and metrics file there are removed, so neither
        is resumed nor appended to later (what ``srpo train`` without ``--resume`` does)."""
        self.iteration = 0
        self.run_state.clear()

    def continue_from(self, run_dir: str | os.PathLike[str], iteration: int) -> None:
        """Go on from another run's exported weights as if this run had trained its first ``iteration``
        iterations: this trainer was built from them (``cfg.model`` = ``run_dir/final``), its curve starts
        with ``run_dir``'s metrics rows up to ``iteration`` and :meth:`train` trains iterations
        ``iteration + 1 .. cfg.iterations`` (their seeds are those of the uninterrupted run's; the optimizer
        starts afresh: an export holds no optimizer state). ``bench compare --continue-from`` uses it."""
        if not 0 <= int(iteration) <= self.cfg.iterations:
            raise ValueError(f"continue_from: iteration {iteration} outside 0..{self.cfg.iterations} (--iterations)")
        self.start_fresh()
        self.run_state.adopt_metrics(run_dir, int(iteration))
        self.iteration = int(iteration)


def train(
    cfg: TrainConfig, resume: bool = False, log: Callable[[str], None] | None = print
) -> list[dict[str, Any]]:
    """Build a :class:`Trainer` and run it; ``resume`` continues from ``out_dir/checkpoint/``.

    ``resume`` with no checkpoint (none written yet, or the run was killed during its first write) is a
    :class:`learners.checkpoint.CheckpointError`, raised before the model is built, never a silent
    fresh start. Without ``resume`` a stale checkpoint and stale metrics in ``out_dir`` are removed.
    """
    if resume:
        ckpt.require_checkpoint(cfg.out_dir)
    trainer = Trainer(cfg, log=log, start_from=cfg.out_dir if resume else None)
    if resume:
        if log:
            log(f"resumed {cfg.algo} from iteration {trainer.iteration}")
    elif ckpt.remove_checkpoints(cfg.out_dir) and log:
        log(f"fresh start: removed the previous checkpoint in {cfg.out_dir}")
    return trainer.train()
