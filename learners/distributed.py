"""Data-parallel learner support: process group from the launcher's environment, gradient all-reduce.

``srpo train`` runs unchanged under ``torchrun --nproc_per_node N`` or ``accelerate launch``: both set
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, and
:func:`init_distributed` joins the process group from them (``gloo`` on CPU, ``nccl`` on CUDA, where
each rank takes ``cuda:LOCAL_RANK``). Without them it returns a single-process context and nothing
else changes.

How a data-parallel update works (see :meth:`learners.trainer.Trainer`): every rank holds the same
rollout batch and computes the same advantages (group statistics over the *whole* batch), takes its
event-atomic shard of each minibatch (:func:`learners.batching.shard_minibatch`), runs forward and
backward on it with the loss normalised by the *global* count (events for SRPO, tokens or rows for
the token/sequence means), and then the gradients are summed across ranks
(:func:`all_reduce_gradients`). The summed gradient is the single-process gradient of the whole
minibatch, so clipping and the optimizer step give the same parameters on every rank and the same
parameters as one process (tested with 2 gloo processes in float64).

Why an explicit all-reduce rather than a ``DistributedDataParallel`` wrapper: one optimizer step here
runs a variable number of forward passes per model (length-bucketed chunks, token-budget
micro-batches, one model per role or one LoRA adapter per role, any of which may be absent from a
rank's shard). DDP's reducer expects every rank to run the same forwards of the same wrapped module
between two syncs (or ``no_sync`` bookkeeping plus ``find_unused_parameters``), and a rank without an
event of one role would hang it. The collective DDP issues is the same: one flat all-reduce of every
trainable gradient, in a fixed parameter order, after the last backward.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistContext",
    "all_gather_objects",
    "all_reduce_gradients",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "init_distributed",
    "launched_distributed",
]


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: ``rank`` of ``world_size`` (1 when not launched distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes metrics, checkpoints and exports; the others only compute."""
        return self.rank == 0


def launched_distributed() -> bool:
    """True when a launcher (torchrun, accelerate launch) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_distributed(device: torch.device | str = "cpu") -> DistContext:
    """Join the launcher's process group (``env://``) or return the single-process context.

    ``device``: the trainer's device; ``cuda`` picks ``nccl`` (and this rank's ``LOCAL_RANK`` GPU is
    the caller's to select), anything else ``gloo``. An already initialised group is reused.
    """
    if dist.is_available() and dist.is_initialized():
        return DistContext(
            dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), dist.get_backend()
        )
    if not launched_distributed():
        return DistContext()
    if not dist.is_available():  # pragma: no cover - every torch wheel we support has it
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set: launch with "
            "`torchrun --nproc_per_node N` or `accelerate launch`"
        )
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), backend)


def all_reduce_gradients(params: Sequence[torch.nn.Parameter], ctx: DistContext) -> None:
    """Sum every parameter's gradient over the ranks, in place (a missing gradient counts as zero).

    One flat buffer per dtype, one collective each (what DDP's bucketed reducer does after backward).
    A rank whose shard never touched a parameter still contributes zeros, so every rank ends with the
    same gradients.
    """
    if not ctx.enabled:
        return
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def all_reduce_sum(value: float, ctx: DistContext) -> float:
    """Sum a number over the ranks (float64 on CPU; identity on one process)."""
    if not ctx.enabled:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    if ctx.backend == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def broadcast_object(obj: Any, ctx: DistContext, src: int = 0) -> Any:
    """Rank ``src``'s object on every rank (pickled between our own processes; identity on one)."""
    if not ctx.enabled:
        return obj
    box = [obj if ctx.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's object, in rank order (``[obj]`` on one process)."""
    if not ctx.enabled:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op on one process)."""
    if ctx.enabled:
        dist.barrier()
