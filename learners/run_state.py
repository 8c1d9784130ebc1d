"""A run's state on disk: its metrics file, its checkpoint (weights, optimizers, scheduler, RNG states,
iteration) and its export.

:class:`RunState` holds references to what the trainer trains (the process layout that gathers full
weights, the policies, the optimizers, the critic) and the run directory, never the config: the
trainer hands it the config's plain values to store (``config``) and checks a checkpoint's config
against its own before :meth:`RunState.restore`. File formats, atomic publishing, hashing and the
distributed contract live in :mod:`learners.checkpoint`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from agents.policy import PolicyMap
from learners import checkpoint as ckpt
from learners import metrics_log, state_check
from learners.tracking import STATE_FILE as TRACKER_STATE_FILE
from learners.tracking import MultiTracker

__all__ = ["FullStates", "RunState"]


class FullStates(Protocol):
    """Full (gathered) weights and optimizer states (:class:`learners.scale.ScaleOut`; collective under FSDP2)."""

    def model_states(self) -> dict[str, dict[str, torch.Tensor]]: ...

    def load_model_states(self, states: dict[str, dict[str, torch.Tensor]]) -> None: ...

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None: ...

    def full_policies(self) -> list[Any]: ...


class RunState:
    """The run directory ``out`` of a trainer: metrics rows, checkpoints and the final export."""

    def __init__(
        self,
        out: str | os.PathLike[str],
        states: FullStates,
        policies: PolicyMap,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        critic: torch.nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
        log: Callable[[str], None] = lambda s: None,
    ) -> None:
        self.out = Path(out)
        self.states, self.policies = states, policies
        self.optimizer, self.scheduler = optimizer, scheduler
        self.critic, self.critic_optimizer = critic, critic_optimizer
        self.log = log
        #: the run's --logger backends while training (None: rows go to metrics.jsonl alone)
        self.tracker: MultiTracker | None = None

    # ------------------------------------------------------------------ metrics
    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def read_metrics(self) -> list[dict[str, Any]]:
        return metrics_log.read_metrics(self.metrics_path)

    def start_metrics(self, iteration: int) -> list[dict[str, Any]]:
        """Metrics history at the start of training at ``iteration``: empty for a fresh run, else cut to it.

        A fresh run (iteration 0) deletes a stale ``metrics.jsonl`` instead of appending to it, so an
        iteration is never logged twice; a resumed run keeps only rows its checkpoint covers.
        """
        if iteration == 0:
            stale = metrics_log.reset_metrics(self.metrics_path)
            if stale:
                self.log(f"fresh start: removed {stale} stale rows of {self.metrics_path}")
            return []
        return metrics_log.trim_metrics(self.metrics_path, iteration)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """One row to metrics.jsonl and the other --logger backends (outside training: metrics.jsonl)."""
        if self.tracker is None:
            metrics_log.append_metrics(self.metrics_path, record)
        else:
            self.tracker.log(record, step=int(record["iteration"]))

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_path(self) -> Path:
        """The run's checkpoint directory (see :mod:`learners.checkpoint` for its files)."""
        return self.out / ckpt.CHECKPOINT_DIR

    def state(self, iteration: int, config: Mapping[str, Any]) -> dict[str, Any]:
        """Everything needed to continue bit-identically: full weights, optimizer, scheduler, RNGs;
        ``config``: the flat config values the checkpoint records (checked when it is resumed)."""
        return {
            "iteration": iteration,
            "config": dict(config),
            "models": self.states.model_states(),  # full tensors (gathered under FSDP2: collective)
            "policy_versions": [p.policy_version for p in self.policies.policies],
            "optimizer": self.states.optimizer_state(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": self.critic_optimizer.state_dict()
            if self.critic_optimizer is not None
            else None,
            "rng": ckpt.capture_rng_state(),
        }

    def save(self, state: dict[str, Any]) -> Path | None:
        """Publish ``state`` (:meth:`state`) atomically (rank 0 writes under torch.distributed); weights
        that are not finite are never written (:class:`~learners.state_check.NonFiniteError`)."""
        for name, tensors in state["models"].items():
            if state_check.nonfinite_tensors(tensors):
                raise state_check.NonFiniteError(
                    f"{name} has non-finite weights; not checkpointed (the last checkpoint is kept)"
                )
        return ckpt.save_checkpoint(self.out, state)

    def restore(self, state: Mapping[str, Any]) -> int:
        """Load a validated checkpoint ``state`` (its config already checked) into the trainer's objects;
        drops metrics rows logged after it and returns its iteration."""
        self.states.load_model_states(state["models"])  # full weights; each FSDP2 rank keeps its shard
        for pol, version in zip(self.policies.policies, state["policy_versions"], strict=True):
            pol.policy_version = version
        self.states.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])  # type: ignore[union-attr]
        ckpt.restore_rng_state(state["rng"])
        iteration = int(state["iteration"])
        metrics_log.trim_metrics(self.metrics_path, iteration)
        return iteration

    def clear(self) -> None:
        """A fresh start in this directory: remove a previous checkpoint and metrics file, so neither is
        resumed nor appended to later (a kept checkpoint of other settings must never be resumed), and the
        trackers' run ids (``trackers.json``): a run continued from another one's weights opens its
        trackers as a resume, and must not reattach to the W&B / MLflow run of what trained here before."""
        if ckpt.remove_checkpoints(self.out):
            self.log(f"fresh start: removed the previous checkpoint in {self.out}")
        if self.metrics_path.exists():
            self.metrics_path.unlink()
        (self.out / TRACKER_STATE_FILE).unlink(missing_ok=True)

    def adopt_metrics(self, run_dir: str | os.PathLike[str], iteration: int) -> None:
        """Start this run's curve with ``run_dir``'s rows up to ``iteration`` (a continued run's history)."""
        source = Path(run_dir) / "metrics.jsonl"
        self.out.mkdir(parents=True, exist_ok=True)
        metrics_log.reset_metrics(self.metrics_path)
        if source.is_file():
            shutil.copyfile(source, self.metrics_path)
            metrics_log.trim_metrics(self.metrics_path, iteration)

    # ------------------------------------------------------------------ export
    def export(self, out: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` of the trained policy (one folder per distinct model)."""
        out = Path(out)
        models = self.states.full_policies()  # FSDP2: unsharded copies on rank 0 (collective), else ours
        for i, pol in enumerate(models):
            if state_check.nonfinite_tensors(pol.model.state_dict()):
                raise state_check.NonFiniteError(f"model{i} has non-finite weights; not exported to {out}")
        for i, pol in enumerate(models):
            target = out if len(models) == 1 else out / f"model{i}"
            pol.model.save_pretrained(target)
            pol.tokenizer.save_pretrained(target)
        return out
