"""What a training state must hold before it is written or resumed: finite tensors, sane optimizer and
RNG states, consistent iteration counters.

A checkpoint's files are authentic once their hashes match (:mod:`learners.checkpoint`), but a state can
still be junk: NaN weights saved by a diverged run, a learning rate above the configured one, an RNG
state of the wrong shape. :func:`validate_train_state` finds every such value before a resume touches
the trainer (one :class:`~learners.checkpoint.CheckpointError` listing them), and
:func:`nonfinite_tensors` is what the trainer checks before it saves or exports
(:class:`NonFiniteError`, the run's stop with exit 3 at the ``srpo`` boundary).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from learners.checkpoint import CheckpointError


class NonFiniteError(RuntimeError):
    """Training produced non-finite losses/gradients too many steps in a row, or non-finite weights:
    the run stops (one line) and nothing non-finite is checkpointed or exported."""


def nonfinite_tensors(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of floating-point tensors holding a NaN or an infinity (what must never be written)."""
    bad = []
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad.append(name)
    return bad


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _finite_tensor_errors(obj: Any, where: str, out: list[str]) -> None:
    """Every tensor or float inside ``obj`` must be finite (optimizer moments, step counts)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and not bool(torch.isfinite(obj).all()):
            out.append(f"{where} holds non-finite values")
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            out.append(f"{where} is {obj}")
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _finite_tensor_errors(v, f"{where}/{k}", out)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _finite_tensor_errors(v, f"{where}/{i}", out)


def _optimizer_errors(opt: Any, where: str, lr: Any) -> list[str]:
    """An AdamW state dict: groups with sane hyper-parameters (``lr`` at most the configured one, as
    the warm-up only scales it down), finite moments, non-negative second moments and step counts."""
    if not isinstance(opt, Mapping) or not isinstance(opt.get("state"), Mapping):
        return [f"{where} is not an optimizer state (no 'state' mapping)"]
    groups = opt.get("param_groups")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, Mapping) for g in groups):
        return [f"{where}/param_groups must be a non-empty list of groups"]
    errors: list[str] = []
    for i, g in enumerate(groups):
        at = f"{where}/param_groups/{i}"
        for key in ("lr", "eps", "weight_decay", "initial_lr"):
            v = g.get(key)
            if key == "initial_lr" and v is None:
                continue
            if not _is_num(v) or not math.isfinite(v) or v < 0:
                errors.append(f"{at}/{key} must be a finite number >= 0, got {v!r}")
        if _is_num(lr) and math.isfinite(lr):
            for key in ("lr", "initial_lr"):
                v = g.get(key)
                if _is_num(v) and math.isfinite(v) and v > lr * (1 + 1e-6):
                    errors.append(f"{at}/{key} = {v!r} exceeds the configured learning rate {lr!r}")
        betas = g.get("betas")
        pair = isinstance(betas, list | tuple) and len(betas) == 2
        if not (pair and all(_is_num(b) and 0 <= b < 1 for b in betas)):
            errors.append(f"{at}/betas must be two numbers in [0, 1), got {betas!r}")
    for pid, st in opt["state"].items():
        at = f"{where}/state/{pid}"
        if not isinstance(st, Mapping):
            errors.append(f"{at} is not a mapping")
            continue
        _finite_tensor_errors(st, at, errors)
        step = st.get("step")
        step_v = float(step) if isinstance(step, torch.Tensor) and step.numel() == 1 else step
        if step is not None and (not _is_num(step_v) or step_v < 0):
            errors.append(f"{at}/step must be a number >= 0")
        sq = st.get("exp_avg_sq")
        if isinstance(sq, torch.Tensor) and sq.is_floating_point() and bool((sq < 0).any()):
            errors.append(f"{at}/exp_avg_sq has negative entries")
        if len(errors) > 20:
            break
    return errors


def _rng_errors(rng: Any) -> list[str]:
    """Shapes and types of :func:`capture_rng_state` output, checked before any RNG is touched."""
    if not isinstance(rng, Mapping):
        return ["rng is not a mapping"]
    errors = []
    t = rng.get("torch")
    ref = torch.get_rng_state()
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.shape == ref.shape):
        errors.append(f"rng/torch must be a uint8 tensor of shape {tuple(ref.shape)}")
    py = rng.get("python")
    ok_py = (
        isinstance(py, tuple | list)
        and len(py) == 3
        and _is_int(py[0])
        and isinstance(py[1], tuple | list)
        and len(py[1]) == 625
        and all(_is_int(x) and 0 <= x < 2**32 for x in py[1][:624])
        and _is_int(py[1][624])
        and 0 <= py[1][624] <= 624
        and (py[2] is None or (_is_num(py[2]) and math.isfinite(py[2])))
    )
    if not ok_py:
        errors.append("rng/python must be (version, 625 integers, gauss) as random.getstate() returns")
    npy = rng.get("numpy")
    ok_np = (
        isinstance(npy, tuple | list)
        and len(npy) == 5
        and npy[0] == "MT19937"
        and isinstance(npy[1], np.ndarray)
        and npy[1].shape == (624,)
        and npy[1].dtype.kind in "iu"
        and _is_int(npy[2])
        and 0 <= npy[2] <= 624
        and _is_int(npy[3])
        and _is_num(npy[4])
        and math.isfinite(npy[4])
    )
    if not ok_np:
        errors.append("rng/numpy must be ('MT19937', 624 words, pos, has_gauss, gauss) as numpy saves it")
    cuda = rng.get("cuda")
    uint8 = [isinstance(c, torch.Tensor) and c.dtype == torch.uint8 for c in cuda or []]
    if cuda is not None and not (isinstance(cuda, list | tuple) and all(uint8)):
        errors.append("rng/cuda must be a list of uint8 tensors")
    return errors


def validate_train_state(state: Mapping[str, Any]) -> None:
    """Check a trainer checkpoint's state (see ``Trainer.checkpoint_state``) before anything of it is
    used, trimmed or written: types, ranges, finite weights and optimizer values, RNG state shapes.

    The sha256 manifest only proves the files are the ones written *with that manifest*; anyone who
    recomputes it (or a run that diverged before these checks existed) can hand over junk, which used
    to surface as a ValueError/TypeError traceback, or worse after ``metrics.jsonl`` was already cut
    back to a junk iteration. Raises one :class:`CheckpointError` listing the first problems.
    """
    errors: list[str] = []
    config = state.get("config")
    if not isinstance(config, Mapping):
        raise CheckpointError(f"checkpoint state: config must be a mapping, got {type(config).__name__}")
    it, total = state.get("iteration"), config.get("iterations")
    if not _is_int(it) or it < 0 or (_is_int(total) and it > total):
        errors.append(f"iteration must be an integer in [0, iterations={total!r}], got {str(it)[:40]!r}")
    versions = state.get("policy_versions")
    if not isinstance(versions, list) or not all(_is_int(v) and v >= 0 for v in versions):
        errors.append("policy_versions must be a list of non-negative integers")
    models = state.get("models")
    if not isinstance(models, Mapping) or not models:
        errors.append("models must map model names to weights")
    else:
        for name, tensors in models.items():
            if not isinstance(tensors, Mapping) or not all(
                isinstance(t, torch.Tensor) for t in tensors.values()
            ):
                errors.append(f"models/{name} must map parameter names to tensors")
                continue
            bad = nonfinite_tensors(tensors)
            if bad:
                errors.append(f"models/{name} has non-finite weights in {len(bad)} tensors (e.g. {bad[0]})")
    errors += _optimizer_errors(state.get("optimizer"), "optimizer", config.get("lr"))
    if state.get("critic_optimizer") is not None:
        critic_lr = config.get("critic_lr")
        errors += _optimizer_errors(state.get("critic_optimizer"), "critic_optimizer", critic_lr)
    critic = state.get("critic")
    if critic is not None:
        if not isinstance(critic, Mapping):
            errors.append("critic must map parameter names to tensors")
        else:
            _finite_tensor_errors(critic, "critic", errors)
    sched = state.get("scheduler")
    if not isinstance(sched, Mapping) or not _is_int(sched.get("last_epoch")) or sched["last_epoch"] < -1:
        errors.append("scheduler must be a scheduler state with an integer last_epoch >= -1")
    else:
        _finite_tensor_errors({k: v for k, v in sched.items() if k != "lr_lambdas"}, "scheduler", errors)
        lr = config.get("lr")
        for key in ("base_lrs", "_last_lr"):  # the next scheduler step sets lr = base_lr * factor <= base_lr
            values = sched.get(key, [])
            if not isinstance(values, list) or not all(
                _is_num(v) and 0 <= v <= (lr * (1 + 1e-6) if _is_num(lr) else math.inf) for v in values
            ):
                errors.append(f"scheduler/{key} must be learning rates in [0, the configured {lr!r}]")
    errors += _rng_errors(state.get("rng"))
    if state.get("async_snapshots") is not None:  # max_staleness >= 1: the in-flight batches' weights
        errors += _async_snapshot_errors(state["async_snapshots"], it)
    if errors:
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise CheckpointError("checkpoint state is invalid: " + "; ".join(errors[:3]) + more)


def _async_snapshot_errors(snaps: Any, iteration: Any) -> list[str]:
    """``async_snapshots`` (``Trainer.checkpoint_state`` with ``max_staleness >= 1``): ``{"<learner iteration
    before the checkpoint's>": {"versions": [non-negative int], "models": {name: {param: finite tensor}}}}``.
    Checked with the rest, so a junk snapshot is one CheckpointError before the trainer is touched, not a
    traceback after its weights were restored (or in the generator thread, when it loads it)."""
    if not isinstance(snaps, Mapping):
        return ["async_snapshots must map iterations to weight snapshots"]
    errors: list[str] = []
    for key, snap in snaps.items():
        where = f"async_snapshots/{str(key)[:20]}"
        if not (
            isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12
            and (not _is_int(iteration) or int(key) < iteration)
        ):  # fmt: skip
            errors.append(f"{where}: a snapshot is keyed by an iteration before the checkpoint's")
            continue
        if not isinstance(snap, Mapping) or set(snap) != {"versions", "models"}:
            errors.append(f"{where} must hold exactly versions and models")
            continue
        versions, models = snap["versions"], snap["models"]
        if not isinstance(versions, list) or not all(_is_int(v) and v >= 0 for v in versions):
            errors.append(f"{where}/versions must be a list of non-negative integers")
        if not isinstance(models, Mapping) or not models or not all(
            isinstance(t, Mapping) and all(isinstance(x, torch.Tensor) for x in t.values()) for t in models.values()
        ):
            errors.append(f"{where}/models must map model names to parameter tensors")
            continue
        for name, tensors in models.items():
            bad = nonfinite_tensors(tensors)
            if bad:
                errors.append(f"{where}/models/{name} has non-finite weights in {len(bad)} tensors")
    return errors
