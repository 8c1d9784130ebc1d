"""The rollout -> update loop for SRPO, GRPO and MAPPO (one class; the algorithms differ only in wiring).

Per iteration:

1. sample ``tasks_per_iter`` training tasks and roll out ``group_size`` episodes of each
   (:class:`agents.rollout.RolloutCollector`; one batched generate per round);
2. advantages: SRPO — one group-relative advantage per *event*; GRPO — per output, the team outcome
   normalised per task group and role; MAPPO — GAE over each episode's events with a centralised
   critic reading the shared state;
3. ``epochs`` passes over event-atomic minibatches (:mod:`learners.batching`), each a forward pass of
   the policy (per distinct model: shared, per-role or LoRA-per-role), the pure loss function from
   :mod:`learners.losses`, optional k3 KL to a frozen reference and an entropy bonus, gradient
   clipping and an optimizer step;
4. diagnostics to ``metrics.jsonl`` (and TensorBoard), held-out evaluation every ``eval_every``
   iterations, and a checkpoint (weights, optimizer, scheduler, RNG states, iteration) that
   ``resume`` continues from bit-identically on CPU.

Everything random is seeded from ``(seed, iteration)``, so a resumed run replays exactly what the
uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.hf import HFPolicy, adapter_scope, default_lora_config
from agents.policy import PolicyMap, SamplingParams
from agents.rollout import RolloutBatch, RolloutCollector
from agents.rows import Row
from learners.advantages import event_advantages_from_rows, gae, grpo_output_advantages
from learners.batching import collate, event_minibatches, gather_response_logprobs
from learners.critic import ValueCritic
from learners.losses import (
    entropy_from_logits,
    grpo_loss,
    kl_k3,
    masked_mean,
    ppo_policy_loss,
    srpo_loss,
    value_loss,
)

ALGORITHMS = ("srpo", "grpo", "mappo")
#: SRPO set normalisations, plus ``k1``: every output its own event (a response-level update).
SRPO_NORMS = ("sqrt", "sum", "mean", "k1")
SHARING = ("shared", "per-role", "lora")


@dataclass
class TrainConfig:
    """All knobs of a training run (saved with every checkpoint; hashed into leaderboard records)."""

    algo: str = "srpo"
    model: str = ""
    out_dir: str = "runs/train"
    env_id: str = "ProcArith-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    sharing: str = "shared"
    iterations: int = 30
    tasks_per_iter: int = 8
    group_size: int = 4
    epochs: int = 2
    rows_per_batch: int = 64
    #: rows per forward pass inside a minibatch (length-bucketed; the loss still spans the minibatch)
    forward_rows: int = 64
    lr: float = 3e-4
    warmup: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    norm: str = "sqrt"
    agg: str = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    critic_lr: float = 1e-3
    gamma: float = 1.0
    gae_lambda: float = 0.95
    vf_clip: float = 0.2
    lora_rank: int = 8
    eval_every: int = 10
    eval_problems: int = 64
    eval_k: int = 1
    save_every: int = 5
    seed: int = 0
    tensorboard: bool = False

    def __post_init__(self) -> None:
        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo must be one of {ALGORITHMS}, got {self.algo!r}")
        if self.norm not in SRPO_NORMS:
            raise ValueError(f"norm must be one of {SRPO_NORMS}, got {self.norm!r}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        sizes = (self.iterations, self.tasks_per_iter, self.group_size, self.epochs, self.rows_per_batch)
        if min(*sizes, self.forward_rows) < 1:
            raise ValueError(
                "iterations, tasks_per_iter, group_size, epochs, rows_per_batch and forward_rows must be >= 1"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        return cls(**d)


def _iteration_seed(seed: int, iteration: int, salt: int = 0) -> int:
    return int(np.random.SeedSequence([seed, iteration, salt]).generate_state(1)[0])


class Trainer:
    """Runs :class:`TrainConfig`; see the module docstring for the loop."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] | None = print) -> None:
        import srpo_envs

        self.cfg = cfg
        self.log = log or (lambda s: None)
        self._quiet = log is None
        self.out = Path(cfg.out_dir)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)

        def train_env() -> Any:
            return srpo_envs.make(cfg.env_id, **cfg.env_kwargs)

        def eval_env() -> Any:
            return srpo_envs.make(cfg.env_id, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})

        probe = train_env()
        self.roles = sorted({probe.role_of(a) for a in probe.possible_agents})
        self.n_train_tasks = len(probe.unwrapped.tasks)
        self.n_eval_tasks = len(eval_env().unwrapped.tasks)
        self.policies = self._build_policies()
        sampling = SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens
        )
        self.collector = RolloutCollector(train_env, self.policies, sampling)
        self.eval_collector = RolloutCollector(eval_env, self.policies, sampling)

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
        self.ref_models: dict[int, torch.nn.Module] = {}
        if cfg.kl_coef > 0:
            for pol in self.policies.policies:
                key = id(pol.model)
                if key not in self.ref_models:
                    ref = copy.deepcopy(pol.model).eval()
                    for p in ref.parameters():
                        p.requires_grad_(False)
                    self.ref_models[key] = ref
        self.critic: ValueCritic | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if cfg.algo == "mappo":
            self.critic = ValueCritic.from_pretrained(cfg.model)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr)
        self.iteration = 0
        self._tb: Any = None

    # ------------------------------------------------------------------ policies
    def _build_policies(self) -> PolicyMap:
        cfg = self.cfg
        if not cfg.model:
            raise ValueError("TrainConfig.model must name a model directory or hub id")
        if cfg.sharing == "shared":
            return PolicyMap.shared(HFPolicy(cfg.model), self.roles)
        if cfg.sharing == "per-role":
            return PolicyMap.per_role({role: HFPolicy(cfg.model) for role in self.roles})
        return PolicyMap.lora_per_role(
            HFPolicy(cfg.model), self.roles, lora_config=default_lora_config(r=cfg.lora_rank)
        )

    def _distinct_models(self) -> list[HFPolicy]:
        """One policy per distinct model object (LoRA views of one base count once)."""
        seen: dict[int, HFPolicy] = {}
        for pol in self.policies.policies:
            seen.setdefault(id(pol.model), pol)
        return list(seen.values())

    def _model_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Weights of every distinct model (``model<i>`` in :meth:`_distinct_models` order)."""
        return {
            f"model{i}": {k: v.detach().clone() for k, v in pol.model.state_dict().items()}
            for i, pol in enumerate(self._distinct_models())
        }

    # ------------------------------------------------------------------ advantages
    def _advantages(self, batch: RolloutBatch) -> tuple[dict[str, float], dict[int, float], dict[str, Any]]:
        """Event-level (SRPO) or row-level (GRPO, MAPPO) advantages, plus critic targets for MAPPO."""
        rows = batch.rows
        extra: dict[str, Any] = {}
        if self.cfg.algo == "srpo":
            ids, adv = event_advantages_from_rows(rows)
            return dict(zip(ids, adv.tolist(), strict=True)), {}, extra
        if self.cfg.algo == "grpo":
            adv = grpo_output_advantages(rows)
            return {}, dict(enumerate(adv.tolist())), extra
        # MAPPO: GAE over each episode's events; value targets per event state
        assert self.critic is not None
        first_row: dict[str, Row] = {}
        for r in rows:
            first_row.setdefault(r.event_id, r)
        by_episode: dict[str, list[Row]] = {}
        for r in first_row.values():
            by_episode.setdefault(r.episode_id, []).append(r)
        event_adv: dict[str, float] = {}
        returns: dict[str, float] = {}
        texts = [r.state_text for r in first_row.values()]
        with torch.no_grad():
            values_all = self.critic(texts).double().tolist() if texts else []
        value_of = dict(zip(first_row.keys(), values_all, strict=True))
        for events in by_episode.values():
            events.sort(key=lambda r: r.step)
            outcome = events[-1].outcome_reward
            # event reward: its format penalty at every step, the team outcome at the last one
            rew = [
                (e.reward - e.outcome_reward) + (outcome if i == len(events) - 1 else 0.0)
                for i, e in enumerate(events)
            ]
            vals = [value_of[e.event_id] for e in events] + [0.0]
            adv, ret = gae(
                torch.tensor(rew, dtype=torch.float64),
                torch.tensor(vals, dtype=torch.float64),
                gamma=self.cfg.gamma,
                lam=self.cfg.gae_lambda,
            )
            for e, a, g in zip(events, adv.tolist(), ret.tolist(), strict=True):
                event_adv[e.event_id] = a
                returns[e.event_id] = g
        # Standard PPO advantage whitening, but never blow up noise: below 1e-2 spread, only centre.
        values = np.array(list(event_adv.values()))
        mean, std = (values.mean(), values.std()) if len(values) else (0.0, 1.0)
        scale = std if std > 1e-2 else 1.0
        row_adv = {i: (event_adv[r.event_id] - mean) / scale for i, r in enumerate(rows)}
        extra.update(returns=returns, old_values=value_of)
        return {}, row_adv, extra

    # ------------------------------------------------------------------ update
    def _policy_logprobs(
        self, rows: list[Row], batch_t: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[R, T] log-probs under the current policies, entropy and reference log-probs (if KL)."""
        groups: dict[int, tuple[HFPolicy, list[int]]] = {}
        for i, r in enumerate(rows):
            pol = self.policies[r.role]
            groups.setdefault(id(pol), (pol, []))[1].append(i)
        logprobs = torch.zeros((len(rows), batch_t))
        entropy = torch.zeros((len(rows), batch_t))
        ref = torch.zeros((len(rows), batch_t))
        chunks: list[tuple[HFPolicy, list[int]]] = []
        for pol, idx in groups.values():
            # Length-sorted chunks: proposer prompts are short, aggregator prompts hold every candidate;
            # padding them to one width would multiply the forward cost (and memory) by the ratio.
            idx = sorted(idx, key=lambda i: (len(rows[i].prompt_ids), len(rows[i].response_ids)))
            step = self.cfg.forward_rows
            chunks.extend((pol, idx[j : j + step]) for j in range(0, len(idx), step))
        for pol, idx in chunks:
            sub = collate([rows[i] for i in idx], pol.pad_id)
            t = sub.response_width
            with adapter_scope(pol.model, pol.adapter_name):
                logits = pol.model(**sub.model_inputs(), logits_to_keep=t + 1).logits
            lp = gather_response_logprobs(logits, sub, self.cfg.temperature)
            index = torch.tensor(idx)
            logprobs = logprobs.index_put((index,), torch.nn.functional.pad(lp, (0, batch_t - t)))
            if self.cfg.entropy_coef > 0:
                resp_logits = logits[:, -t - 1 : -1] / max(self.cfg.temperature, 1e-6)
                ent = entropy_from_logits(resp_logits)
                entropy = entropy.index_put((index,), torch.nn.functional.pad(ent, (0, batch_t - t)))
            if self.cfg.kl_coef > 0:
                with torch.no_grad(), adapter_scope(pol.model, pol.adapter_name):
                    ref_logits = self.ref_models[id(pol.model)](
                        **sub.model_inputs(), logits_to_keep=t + 1
                    ).logits
                ref_lp = gather_response_logprobs(ref_logits, sub, self.cfg.temperature)
                ref = ref.index_put((index,), torch.nn.functional.pad(ref_lp, (0, batch_t - t)))
        return logprobs, entropy, ref

    def _update(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        cfg = self.cfg
        rows = batch.rows
        event_adv, row_adv, extra = self._advantages(batch)
        row_pos = {id(r): i for i, r in enumerate(rows)}
        stats: dict[str, list[float]] = {}
        dropped = 0
        for epoch in range(cfg.epochs):
            mbs = event_minibatches(
                rows, rows_per_batch=cfg.rows_per_batch, seed=_iteration_seed(cfg.seed, iteration, 1 + epoch)
            )
            dropped = mbs.dropped_events
            for mb in mbs:
                full = collate(mb.rows, pad_id=0, event_index=mb.event_index)
                lp, ent, ref = self._policy_logprobs(mb.rows, full.response_width)
                mask, old = full.response_mask, full.old_logprobs
                if cfg.algo == "srpo":
                    adv_e = mb.event_values(event_adv)
                    if cfg.norm == "k1":
                        loss, st = srpo_loss(
                            lp,
                            old,
                            mask,
                            torch.arange(len(mb.rows)),
                            adv_e[full.event_index],
                            clip_eps=cfg.clip_eps,
                            norm="sum",
                        )
                    else:
                        loss, st = srpo_loss(
                            lp, old, mask, full.event_index, adv_e, clip_eps=cfg.clip_eps, norm=cfg.norm
                        )
                else:
                    adv_r = torch.tensor([row_adv[row_pos[id(r)]] for r in mb.rows], dtype=lp.dtype)
                    if cfg.algo == "grpo":
                        loss, st = grpo_loss(lp, old, mask, adv_r, clip_eps=cfg.clip_eps, agg=cfg.agg)
                    else:
                        loss, st = ppo_policy_loss(lp, old, mask, adv_r, clip_eps=cfg.clip_eps, agg=cfg.agg)
                if cfg.kl_coef > 0:
                    kl = masked_mean(kl_k3(lp, ref), mask)
                    loss = loss + cfg.kl_coef * kl
                    st["kl_ref"] = float(kl.detach())
                if cfg.entropy_coef > 0:
                    entropy = masked_mean(ent, mask)
                    loss = loss - cfg.entropy_coef * entropy
                    st["entropy"] = float(entropy.detach())
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                st.update(loss=float(loss.detach()), grad_norm=float(grad_norm))
                if cfg.algo == "mappo":
                    st.update(self._critic_step(mb.rows, extra))
                for k, v in st.items():
                    stats.setdefault(k, []).append(float(v))
        for pol in self.policies.policies:
            pol.bump_version()
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        if "max_k" in stats:
            out["max_k"] = float(np.max(stats["max_k"]))
        out["events_dropped"] = float(dropped)
        return out

    def _critic_step(self, rows: list[Row], extra: dict[str, Any]) -> dict[str, float]:
        assert self.critic is not None and self.critic_optimizer is not None
        seen: dict[str, Row] = {}
        for r in rows:
            seen.setdefault(r.event_id, r)
        ids = list(seen)
        values = self.critic([seen[e].state_text for e in ids])
        old = torch.tensor([extra["old_values"][e] for e in ids], dtype=values.dtype)
        ret = torch.tensor([extra["returns"][e] for e in ids], dtype=values.dtype)
        vloss, vstats = value_loss(values, old, ret, clip_eps=self.cfg.vf_clip)
        self.critic_optimizer.zero_grad(set_to_none=True)
        vloss.backward()
        torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.max_grad_norm)
        self.critic_optimizer.step()
        return {"value_loss": float(vloss.detach()), **{f"v_{k}": v for k, v in vstats.items()}}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, n: int | None = None, k: int | None = None, seed: int = 10_007) -> float:
        """Held-out team accuracy: ``n`` eval-split tasks x ``k`` samples, fixed sampling seeds."""
        n = min(n or self.cfg.eval_problems, self.n_eval_tasks)
        batch = self.eval_collector.collect(list(range(n)), group_size=k or self.cfg.eval_k, seed=seed)
        return batch.accuracy

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        history = self._read_metrics()
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
        while self.iteration < cfg.iterations:
            it = self.iteration + 1
            t0 = time.perf_counter()
            rng = np.random.default_rng(_iteration_seed(cfg.seed, it, 0))
            tasks = rng.choice(
                self.n_train_tasks, size=min(cfg.tasks_per_iter, self.n_train_tasks), replace=False
            )
            batch = self.collector.collect(
                sorted(int(t) for t in tasks), cfg.group_size, seed=_iteration_seed(cfg.seed, it, 99)
            )
            t1 = time.perf_counter()
            stats = self._update(batch, it)
            t2 = time.perf_counter()
            rewards = np.array([e.reward for e in batch.episodes])
            record: dict[str, Any] = {
                "iteration": it,
                "train_accuracy": batch.accuracy,
                "reward_mean": float(rewards.mean()),
                "reward_std": float(rewards.std()),
                "mean_response_len": float(np.mean([len(r.response_ids) for r in batch.rows])),
                "team_tokens": int(sum(e.team_tokens for e in batch.episodes)),
                "rows": len(batch.rows),
                "rollout_s": round(t1 - t0, 3),
                "update_s": round(t2 - t1, 3),
                **stats,
            }
            if cfg.eval_every and (it % cfg.eval_every == 0 or it == cfg.iterations):
                record["eval_accuracy"] = self.evaluate()
            self.iteration = it
            self._append_metrics(record)
            history.append(record)
            if cfg.save_every and (it % cfg.save_every == 0 or it == cfg.iterations):
                self.save_checkpoint()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{batch.accuracy:.2f}", loss=f"{stats.get('loss', float('nan')):.3f}")
        if bar is not None:
            bar.close()
        self.export(self.out / "final")
        return history

    # ------------------------------------------------------------------ persistence
    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def _read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        with self.metrics_path.open() as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def _append_metrics(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(clean) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self.cfg.tensorboard:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out / "tb"))
            for k, v in record.items():
                if isinstance(v, int | float) and k != "iteration":
                    self._tb.add_scalar(k, v, record["iteration"])

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save_checkpoint(self) -> Path:
        """Everything needed to continue bit-identically, written atomically."""
        state = {
            "iteration": self.iteration,
            "config": asdict(self.cfg),
            "models": self._model_states(),
            "policy_versions": [p.policy_version for p in self.policies.policies],
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": self.critic_optimizer.state_dict()
            if self.critic_optimizer is not None
            else None,
            "rng": {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            },
        }
        tmp = self.checkpoint_path.with_suffix(".pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)
        return self.checkpoint_path

    def load_checkpoint(self, path: str | os.PathLike[str] | None = None) -> None:
        """Restore a checkpoint and drop metrics logged after it (a killed run may have logged more)."""
        state = torch.load(path or self.checkpoint_path, weights_only=False)
        saved = TrainConfig.from_dict(state["config"])
        if asdict(saved) != asdict(self.cfg):
            diff = {k for k in asdict(saved) if asdict(saved)[k] != asdict(self.cfg)[k]}
            raise ValueError(f"checkpoint was written with a different config (differs in {sorted(diff)})")
        for tensors, pol in zip(state["models"].values(), self._distinct_models(), strict=True):
            pol.model.load_state_dict(tensors)
        for pol, version in zip(self.policies.policies, state["policy_versions"], strict=True):
            pol.policy_version = version
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])  # type: ignore[union-attr]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self.iteration = int(state["iteration"])
        kept = [m for m in self._read_metrics() if m["iteration"] <= self.iteration]
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(m) + "\n" for m in kept))
        os.replace(tmp, self.metrics_path)

    def export(self, out: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` of the trained policy (one folder per distinct model)."""
        out = Path(out)
        models = self._distinct_models()
        for i, pol in enumerate(models):
            target = out if len(models) == 1 else out / f"model{i}"
            pol.model.save_pretrained(target)
            pol.tokenizer.save_pretrained(target)
        return out


def train(
    cfg: TrainConfig, resume: bool = False, log: Callable[[str], None] | None = print
) -> list[dict[str, Any]]:
    """Build a :class:`Trainer`, optionally resume from ``out_dir/checkpoint.pt``, run it."""
    trainer = Trainer(cfg, log=log)
    if resume and trainer.checkpoint_path.exists():
        trainer.load_checkpoint()
        if log:
            log(f"resumed {cfg.algo} from iteration {trainer.iteration}")
    elif not resume and trainer.metrics_path.exists():
        trainer.metrics_path.unlink()
    return trainer.train()
