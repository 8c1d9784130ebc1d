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

FSDP2 (``dp_engine="fsdp2"``, :func:`fsdp2_shard`): each decoder layer and then the root model go
through :func:`torch.distributed.fsdp.fully_shard`, so parameters, gradients and AdamW moments are
sharded (``DTensor``, ``Shard(0)``) and a layer's full weights exist only while it runs. The gradient
reduction then happens inside backward (reduce-scatter per layer, summing: the divide factor is set to
1 because the loss normalisers are already global), and every forward all-gathers. Those collectives
are why the ranks must run the *same* number of forward/backward calls per model in the same order,
although an event-atomic shard gives ranks different numbers of micro-batches, of length-bucketed
chunks and of roles (:meth:`learners.scale.ScaleOut.forward_plan` pads with zero-weight dummy
forwards, see there). Full weights for rollout, export and checkpoints are gathered with
``torch.distributed.checkpoint.state_dict`` (:func:`full_model_state`), optimizer moments with
``DTensor.full_tensor`` into the same layout a single process writes (:func:`full_optimizer_state`),
so checkpoints load across world sizes and engines.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: How a data-parallel update combines the ranks: ``allreduce`` (replicated weights, one gradient
#: all-reduce after backward) or ``fsdp2`` (parameters, gradients and optimizer state sharded).
DP_ENGINES = ("allreduce", "fsdp2")

__all__ = [
    "DP_ENGINES",
    "DistContext",
    "all_gather_objects",
    "all_reduce_gradients",
    "all_reduce_max",
    "all_reduce_sum",
    "clip_grad_norm",
    "fsdp2_shard",
    "full_model_state",
    "full_optimizer_state",
    "load_full_model_state",
    "load_full_optimizer_state",
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


def init_distributed(device: torch.device | str = "cpu", timeout_s: float | None = None) -> DistContext:
    """Join the launcher's process group (``env://``) or return the single-process context.

    ``device``: the trainer's device; ``cuda`` picks ``nccl`` (and this rank's ``LOCAL_RANK`` GPU is
    the caller's to select), anything else ``gloo``. An already initialised group is reused.
    ``timeout_s``: how long a collective (and the rendezvous) may wait for the other ranks before it
    raises (``init_process_group(timeout=...)``; None: torch's default, 10 min for gloo and NCCL).
    Rank 0 alone collects the rollouts when Ray workers do (the others wait in a broadcast) and
    evaluates alone, so a long rollout or evaluation needs a timeout longer than it; a rank that died
    or hung then fails the others after this time instead of never.
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
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"the process-group timeout must be > 0 seconds, got {timeout_s}")
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    timeout = None if timeout_s is None else timedelta(seconds=float(timeout_s))
    dist.init_process_group(backend=backend, timeout=timeout)
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


def group_rank() -> int:
    """This process's rank in the initialised process group; 0 without one (a single-process run)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def group_barrier() -> None:
    """A barrier across the initialised group when it has several ranks; nothing otherwise (files that
    rank 0 writes are waited for by the others, without needing a :class:`DistContext`)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op on one process)."""
    if ctx.enabled:
        dist.barrier()


def all_reduce_max(values: Sequence[int], ctx: DistContext) -> list[int]:
    """Element-wise maximum of a list of counts over the ranks (the list itself on one process)."""
    if not ctx.enabled:
        return [int(v) for v in values]
    t = torch.tensor([int(v) for v in values], dtype=torch.int64)
    if ctx.backend == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


# ---------------------------------------------------------------------------------------------- FSDP2
def _is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def fsdp2_shard(model: torch.nn.Module) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (in place; the module object stays the same).

    The layers are the modules whose class the model names in ``_no_split_modules`` (transformers'
    list of blocks that must stay whole, what verl's and accelerate's FSDP wrap policies use); the root
    group then holds the rest (embeddings, tied ``lm_head``, final norm). The gradient divide factor is
    set to 1 on every group: FSDP2 averages over ranks by default, but each rank's loss is already
    normalised by the whole minibatch's count, so the reduction must be a sum. Build the optimizer
    *after* this call: it must hold the sharded ``DTensor`` parameters.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if type(model).__module__.startswith("peft"):
        raise ValueError("dp_engine=fsdp2 does not shard LoRA (peft) models; use sharing=shared or per-role")
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"dp_engine=fsdp2: {type(model).__name__} names no decoder-layer class in _no_split_modules, "
            "so there is nothing to shard layer by layer; use dp_engine=allreduce"
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            # a plain SUM collective: for float32/bf16 a custom factor is otherwise a PREMUL_SUM, which
            # gloo (CPU) does not implement
            m.set_force_sum_reduction_for_comms(True)
    return model


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict on every rank; collective under FSDP2.

    A plain module returns its detached ``state_dict()``. A sharded one gathers through
    ``get_model_state_dict(full_state_dict=True)`` without ``cpu_offload`` (which would keep the result
    on rank 0 only: every rank's rollout copy needs it).
    """
    if not any(_is_dtensor(p) for p in model.parameters()):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach() for k, v in state.items()}


def load_full_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict into a plain or FSDP2-sharded model (each rank keeps its shard)."""
    if not any(_is_dtensor(p) for p in model.parameters()):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded state tensor gathered (collective under FSDP2).

    The result has the layout a single process writes (integer parameter ids in ``param_groups``
    order, full ``exp_avg``/``exp_avg_sq``), so a checkpoint written by N FSDP2 ranks resumes on one
    process or under the all-reduce engine, and the other way round. (``get_optimizer_state_dict``
    would key the state by parameter name instead, and take one model, not one per role.)
    """
    state = optimizer.state_dict()
    return {
        **state,
        "state": {
            pid: {k: v.full_tensor() if _is_dtensor(v) else v for k, v in entries.items()}
            for pid, entries in state["state"].items()
        },
    }


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load :func:`full_optimizer_state` output; under FSDP2 each rank keeps the slice of its shard.

    Every rank holds the whole state (it read the checkpoint), so the slices are cut locally
    (``distribute_tensor(..., src_data_rank=None)``: no communication), with the parameter's own mesh
    and placements.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(_is_dtensor(p) for p in params):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.tensor import distribute_tensor

    def shard(value: Any, p: torch.Tensor) -> Any:
        if _is_dtensor(p) and isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim():
            return distribute_tensor(
                value.to(p.to_local().device), p.device_mesh, p.placements, src_data_rank=None
            )
        return value

    entries = state["state"]
    sharded = {pid: {k: shard(v, params[int(pid)]) for k, v in entries[pid].items()} for pid in entries}
    optimizer.load_state_dict({**state, "state": sharded})


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> float:
    """Clip the gradients to a total norm of ``max_norm`` and return the norm before clipping.

    Works for plain and ``DTensor`` (FSDP2) gradients: with sharded gradients ``get_total_norm`` is a
    partial ``DTensor`` whose ``full_tensor()`` is the norm over all shards (one all-reduce), and
    every rank scales its shard by the same coefficient (the recipe torchtitan uses).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads)
    if _is_dtensor(total):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(list(params), max_norm, total)
    return float(total)
