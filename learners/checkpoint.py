"""Training checkpoints that load no code, detect corruption and survive a kill at any moment.

A checkpoint is a directory ``RUN/checkpoint/`` with three files:

* ``tensors.safetensors`` — every tensor of the state (model weights, optimizer moments, the torch RNG
  state as a uint8 tensor), read with :mod:`safetensors`, which parses a JSON header and raw bytes and
  never unpickles anything;
* ``state.json`` — everything else (iteration, config, optimizer/scheduler hyper-parameters, python and
  numpy RNG states) as JSON; the nested structure is kept exactly (tuples, int-keyed dicts, non-finite
  floats and numpy arrays get small tagged objects, tensors a ``{"$tensor": key}`` reference), so a
  state dict saved and loaded compares equal and a resumed run is bit-identical;
* ``manifest.json`` — format, iteration and the sha256 of the two files above, written last. On load
  every hash is checked first: a flipped byte is a one-line :class:`CheckpointError` naming the file,
  never a silent resume with different weights.

Why not ``torch.save``: loading a pickle runs whatever the file says (``--resume`` once executed a
crafted ``checkpoint.pt``). A ``checkpoint.pt`` in a run directory is never opened here.

Publishing is atomic: the files are written and fsynced in ``RUN/.checkpoint.tmp-*``, the previous
checkpoint is renamed to ``checkpoint.prev``, the new directory renamed to ``checkpoint`` and only then
is ``checkpoint.prev`` removed. A kill at any point leaves either a complete ``checkpoint`` or a complete
``checkpoint.prev`` (which :func:`find_checkpoint` falls back to), plus at worst a temp directory that
is ignored and removed by the next save. A run killed during its *first* write has no checkpoint, and
:func:`require_checkpoint` says so instead of silently starting over.

Distributed training (``torchrun`` / ``accelerate launch``): the files always hold the **full,
unsharded** state, so a checkpoint written by an N-rank run loads in an M-rank run (save 2-rank,
resume 1-rank). The contract for callers:

* **save** — every rank calls :func:`save_checkpoint` with the full state (under DDP each rank's
  ``module.state_dict()`` and ``optimizer.state_dict()`` already are; under FSDP2 gather them first with
  ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` / ``get_optimizer_state_dict`` and
  ``StateDictOptions(full_state_dict=True, cpu_offload=True)``, which is itself collective; sharded
  ``DTensor`` values are refused). Only rank 0 writes; when a process group is initialised every rank
  then waits at a barrier, so no rank runs ahead of a checkpoint that is not yet published. Pass the
  unwrapped module's state dict (``ddp.module.state_dict()``), so the keys carry no ``module.`` prefix.
* **load** — every rank calls :func:`load_checkpoint` and gets the full state on CPU (the run
  directory must be on a filesystem every rank sees, as on one node), then loads it into its replica;
  ``Optimizer.load_state_dict`` moves tensors to the parameters' device.

The run's metrics file beside the checkpoint is :mod:`learners.metrics_log`; what a loaded state must
hold before a resume touches anything (finite, sane, consistent) is :mod:`learners.state_check`.
:func:`remove_checkpoints` is collective under torch.distributed (rank 0 deletes, then a barrier), so
every rank must call it.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from learners.distributed import group_barrier, group_rank
from srpo_common import atomic_write_json, atomic_write_text, sha256_file
from srpo_common.jsonsafe import loads_bounded

FORMAT = "srpo-checkpoint/1"
CHECKPOINT_DIR = "checkpoint"
PREVIOUS_DIR = "checkpoint.prev"
TMP_PREFIX = ".checkpoint.tmp-"
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
MANIFEST_FILE = "manifest.json"
#: The pickle file earlier versions wrote; never loaded (unpickling runs code), only named in errors.
LEGACY_PICKLE = "checkpoint.pt"
#: Bounds checked before parsing: the manifest is a few hundred bytes, safetensors headers list one
#: entry per tensor, and the state nests about 10 levels (optimizer -> state -> param -> $tensor).
MAX_MANIFEST_BYTES = 1 << 16
MAX_SAFETENSORS_HEADER_BYTES = 100 << 20
MAX_STATE_DEPTH = 64

class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message is one line naming the file."""


class CheckpointConfigError(CheckpointError, ValueError):
    """The checkpoint was written by a run with different options (resuming it would not be exact)."""


# ---------------------------------------------------------------------------------------------- encoding
def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "placements") and hasattr(t, "full_tensor")


class _Encoder:
    """Splits a nested state into JSON and a flat ``{key: tensor}`` dict for safetensors."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._by_view: dict[tuple[Any, ...], str] = {}
        self._storages: set[tuple[Any, int]] = set()

    def _add_tensor(self, t: torch.Tensor, path: str) -> str:
        if _is_dtensor(t):
            raise TypeError(
                f"{path}: a sharded DTensor cannot be checkpointed; gather the full state first "
                "(torch.distributed.checkpoint.state_dict with full_state_dict=True)"
            )
        t = t.detach()
        view = _storage_key(t)
        if view in self._by_view:  # the same tensor twice (tied weights): store once, reference twice
            return self._by_view[view]
        t = t.to("cpu")
        ptr = t.untyped_storage().data_ptr()
        if not t.is_contiguous() or (ptr != 0 and (t.device, ptr) in self._storages):
            t = t.contiguous().clone()  # safetensors refuses two tensors that share memory
        self._storages.add((t.device, t.untyped_storage().data_ptr()))
        key, n = path or "tensor", 1
        while key in self.tensors:
            key, n = f"{path}#{n}", n + 1
        self.tensors[key] = t
        self._by_view[view] = key
        return key

    def encode(self, obj: Any, path: str = "") -> Any:
        if obj is None or isinstance(obj, bool | int | str):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"$float": repr(obj)}
        if isinstance(obj, torch.Tensor):
            return {"$tensor": self._add_tensor(obj, path)}
        if isinstance(obj, np.ndarray):
            return {"$ndarray": {"dtype": obj.dtype.str, "shape": list(obj.shape), "data": obj.ravel().tolist()}}
        if isinstance(obj, np.generic):
            return self.encode(obj.item(), path)
        if isinstance(obj, tuple):
            return {"$tuple": [self.encode(v, f"{path}/{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, f"{path}/{i}") for i, v in enumerate(obj)]
        if isinstance(obj, Mapping):
            if all(isinstance(k, str) and not k.startswith("$") for k in obj):
                return {k: self.encode(v, f"{path}/{k}" if path else k) for k, v in obj.items()}
            return {
                "$items": [
                    [self.encode(k, path), self.encode(v, f"{path}/{k}" if path else str(k))]
                    for k, v in obj.items()
                ]
            }
        raise TypeError(f"{path or 'state'}: cannot checkpoint a {type(obj).__name__} (no pickle fallback)")


def encode_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``state`` into a JSON-able structure and the tensors it references by key."""
    enc = _Encoder()
    return enc.encode(state), enc.tensors


def decode_state(obj: Any, tensors: Mapping[str, torch.Tensor], where: str = STATE_FILE) -> Any:
    """Inverse of :func:`encode_state`; a reference to a missing tensor is a :class:`CheckpointError`."""
    if isinstance(obj, list):
        return [decode_state(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        tag, val = next(iter(obj.items()))
        if tag == "$tensor":
            if val not in tensors:
                raise CheckpointError(f"{where} references tensor {val!r} missing from {TENSORS_FILE}")
            return tensors[val]
        if tag == "$tuple":
            if not isinstance(val, list):
                raise CheckpointError(f"{where}: malformed $tuple (not a list)")
            return tuple(decode_state(v, tensors, where) for v in val)
        if tag == "$items":
            if not isinstance(val, list) or not all(isinstance(kv, list) and len(kv) == 2 for kv in val):
                raise CheckpointError(f"{where}: malformed $items (not a list of [key, value] pairs)")
            items = [(decode_state(k, tensors, where), decode_state(v, tensors, where)) for k, v in val]
            if not all(isinstance(k, int | float | str | bool | tuple) or k is None for k, _ in items):
                raise CheckpointError(f"{where}: malformed $items (a key is not a scalar)")
            return dict(items)
        if tag == "$float":
            if val not in _NONFINITE_REPRS:
                raise CheckpointError(f"{where}: malformed $float {str(val)[:40]!r}")
            return float(val)
        if tag == "$ndarray":
            return _decode_ndarray(val, where)
    return {k: decode_state(v, tensors, where) for k, v in obj.items()}


#: What ``repr`` gives for the floats JSON cannot hold (all the encoder writes as ``$float``).
_NONFINITE_REPRS = ("nan", "inf", "-inf")
#: numpy arrays in a state are small (the numpy RNG's 624 words); no array needs more elements.
MAX_NDARRAY_ELEMENTS = 1 << 16


def _decode_ndarray(val: Any, where: str) -> np.ndarray:
    """A ``$ndarray`` back to numpy: numeric dtypes only (never ``object``), shape matching the data."""
    if not isinstance(val, dict) or set(val) != {"dtype", "shape", "data"}:
        raise CheckpointError(f"{where}: malformed $ndarray (needs dtype, shape and data)")
    data, shape = val["data"], val["shape"]
    try:
        dtype = np.dtype(val["dtype"])
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: $ndarray has an unknown dtype {str(val['dtype'])[:40]!r}") from None
    if dtype.kind not in "biuf":
        raise CheckpointError(f"{where}: $ndarray dtype {dtype} is not numeric (object arrays are refused)")
    if not isinstance(data, list) or len(data) > MAX_NDARRAY_ELEMENTS:
        raise CheckpointError(f"{where}: $ndarray data must be a list of <= {MAX_NDARRAY_ELEMENTS} values")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise CheckpointError(f"{where}: $ndarray shape must be a list of non-negative integers")
    if math.prod(shape) != len(data):
        raise CheckpointError(f"{where}: $ndarray shape {shape} does not hold its {len(data)} values")
    if not all(isinstance(x, int | float) for x in data):
        raise CheckpointError(f"{where}: $ndarray data must be numbers")
    try:
        return np.asarray(data, dtype=dtype).reshape(shape)
    except (OverflowError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: $ndarray does not fit its dtype ({exc})") from None


# ---------------------------------------------------------------------------------------------- RNG
def capture_rng_state() -> dict[str, Any]:
    """torch (CPU and, when initialised, every CUDA device), python and numpy global RNG states."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the global RNGs from :func:`capture_rng_state` output (CUDA: as many devices as both have)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    if state.get("cuda") and torch.cuda.is_available():
        n = min(len(state["cuda"]), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(list(state["cuda"])[:n])


# ---------------------------------------------------------------------------------------------- save
def _fsync_path(path: Path) -> None:
    """fsync a file or directory (directories: so a rename inside it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(run_dir: str | os.PathLike[str]) -> None:
    """Remove temp directories left by a save that was killed (they are never loaded)."""
    for tmp in Path(run_dir).glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _write(run: Path, state: Mapping[str, Any]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(run)
    encoded, tensors = encode_state(dict(state))
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=run))
    try:
        save_file(tensors, str(tmp / TENSORS_FILE), metadata={"format": FORMAT})
        _fsync_path(tmp / TENSORS_FILE)
        # insertion order kept (no sort_keys): model order and state-dict order round-trip as saved
        atomic_write_text(tmp / STATE_FILE, json.dumps(encoded, allow_nan=False, ensure_ascii=False) + "\n")
        names = (TENSORS_FILE, STATE_FILE)
        manifest = {
            "format": FORMAT,
            "iteration": state.get("iteration"),
            "files": {name: sha256_file(tmp / name) for name in names},
            # checked with a stat before anything is hashed: a swapped-in huge (or sparse) file is
            # refused at once instead of after hashing all of it
            "sizes": {name: (tmp / name).stat().st_size for name in names},
        }
        atomic_write_json(tmp / MANIFEST_FILE, manifest)  # last: its presence marks a complete write
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        _fsync_path(tmp)
        final, prev = run / CHECKPOINT_DIR, run / PREVIOUS_DIR
        if final.exists():
            if prev.exists():
                shutil.rmtree(prev)
            os.replace(final, prev)
        os.replace(tmp, final)
        _fsync_path(run)
        shutil.rmtree(prev, ignore_errors=True)
        _fsync_path(run)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def save_checkpoint(
    run_dir: str | os.PathLike[str], state: Mapping[str, Any], *, rank: int | None = None
) -> Path | None:
    """Publish ``state`` (full, unsharded) as ``run_dir/checkpoint``; returns its path on the writer.

    ``rank`` defaults to the torch.distributed rank (0 without a process group); only rank 0 writes
    and the others return ``None``. Under an initialised process group every rank must call this
    (it ends with a barrier). ``state`` may nest dicts, lists, tuples, tensors, numpy arrays and JSON
    scalars; anything else is a ``TypeError`` (nothing is pickled). ``state["iteration"]``, when
    present, is recorded in the manifest (see :func:`checkpoint_iteration`).
    """
    rank = group_rank() if rank is None else rank
    path = _write(Path(run_dir), state) if rank == 0 else None
    group_barrier()
    return path


# ---------------------------------------------------------------------------------------------- load
def find_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest published checkpoint directory of a run (``checkpoint``, else ``checkpoint.prev``).

    ``checkpoint.prev`` exists alone only when a save was killed between its two renames; it is the
    last complete checkpoint then. Temp directories and a legacy ``checkpoint.pt`` are never returned.
    """
    run = Path(run_dir)
    for name in (CHECKPOINT_DIR, PREVIOUS_DIR):
        if (run / name).is_dir():
            return run / name
    return None


def no_checkpoint_message(run_dir: str | os.PathLike[str]) -> str:
    """Why ``run_dir`` has nothing to resume from, in one line."""
    run = Path(run_dir)
    msg = f"--resume: no checkpoint to resume from in {run} (no {run / CHECKPOINT_DIR}/)"
    if any(run.glob(f"{TMP_PREFIX}*")):
        msg += "; only an incomplete write was found (the run was killed during its first checkpoint)"
    if (run / LEGACY_PICKLE).exists():
        msg += f"; {run / LEGACY_PICKLE} is an old pickle checkpoint and is never loaded (unpickling runs code)"
    return msg + "; run without --resume to start from scratch"


def require_checkpoint(run_dir: str | os.PathLike[str]) -> Path:
    """:func:`find_checkpoint`, or a :class:`CheckpointError` saying why there is nothing to resume."""
    found = find_checkpoint(run_dir)
    if found is None:
        raise CheckpointError(no_checkpoint_message(run_dir))
    return found


def _read_manifest(ckpt: Path) -> dict[str, Any]:
    path = ckpt / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {path} is missing")
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise CheckpointError(f"checkpoint manifest {path} is larger than {MAX_MANIFEST_BYTES} bytes")
        manifest = loads_bounded(path.read_bytes(), 8, f"checkpoint manifest {path}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint manifest {path} is corrupt ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint manifest {path} is corrupt or not format {FORMAT!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != {TENSORS_FILE, STATE_FILE}:
        raise CheckpointError(f"checkpoint manifest {path} must list exactly {TENSORS_FILE} and {STATE_FILE}")
    return manifest


def _safetensors_size(path: Path) -> int | None:
    """The size a safetensors file must have according to its own header (8-byte length, JSON
    header, then exactly the data its offsets cover), or ``None`` when the header is unreadable."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                return None
            n = int.from_bytes(head, "little")
            if n > MAX_SAFETENSORS_HEADER_BYTES:
                return None
            header = loads_bounded(fh.read(n), 4, "safetensors header")
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + n + max((int(e) for e in ends), default=0)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def _check_sizes(ckpt: Path, manifest: Mapping[str, Any]) -> None:
    """Sizes before hashes: each file's size must be the manifest's (checkpoints written before the
    manifest recorded sizes: the tensors file must be the size its own safetensors header declares)."""
    sizes = manifest.get("sizes")
    for name in manifest["files"]:
        path = ckpt / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        actual = path.stat().st_size
        if isinstance(sizes, Mapping):
            want = sizes.get(name)
            if isinstance(want, bool) or not isinstance(want, int) or want != actual:
                raise CheckpointError(
                    f"checkpoint file {path} is {actual} bytes, the manifest says {want!r}; refusing to "
                    "resume from it (not hashed)"
                )
        elif name == TENSORS_FILE:
            declared = _safetensors_size(path)
            if declared != actual:
                raise CheckpointError(
                    f"checkpoint file {path} is {actual} bytes, its safetensors header describes "
                    f"{declared if declared is not None else 'no valid layout'}; refusing to resume from it"
                )


def verify_checkpoint(ckpt_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a checkpoint against its manifest: sizes first (a stat each), then sha256."""
    ckpt = Path(ckpt_dir)
    manifest = _read_manifest(ckpt)
    _check_sizes(ckpt, manifest)
    for name, expected in manifest["files"].items():
        path = ckpt / name
        actual = sha256_file(path)
        if actual != expected:
            raise CheckpointError(
                f"checkpoint file {path} is corrupt: sha256 {actual[:16]}… does not match the manifest's "
                f"{str(expected)[:16]}…; refusing to resume from it"
            )
    return manifest


def checkpoint_iteration(run_dir: str | os.PathLike[str]) -> int | None:
    """Iteration of a run's newest checkpoint from its manifest alone (cheap; no hashing), or ``None``."""
    ckpt = find_checkpoint(run_dir)
    if ckpt is None:
        return None
    try:
        it = json.loads((ckpt / MANIFEST_FILE).read_text(encoding="utf-8")).get("iteration")
    except (OSError, ValueError):
        return None
    return it if isinstance(it, int) else None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The full state saved by :func:`save_checkpoint`, tensors on CPU, after checking every sha256.

    ``path`` is a checkpoint directory or a run directory (its newest checkpoint is used). Every rank
    of a distributed run may call this; it reads files only and never unpickles.
    """
    path = Path(path)
    ckpt = path if (path / MANIFEST_FILE).exists() else require_checkpoint(path)
    verify_checkpoint(ckpt)
    try:
        encoded = loads_bounded(
            (ckpt / STATE_FILE).read_bytes(), MAX_STATE_DEPTH, f"checkpoint file {ckpt / STATE_FILE}"
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {ckpt / STATE_FILE} is corrupt ({exc})") from None
    try:
        tensors = load_file(str(ckpt / TENSORS_FILE), device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError for malformed headers
        raise CheckpointError(f"checkpoint file {ckpt / TENSORS_FILE} is unreadable ({exc})") from None
    state = decode_state(encoded, tensors, where=str(ckpt / STATE_FILE))
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint file {ckpt / STATE_FILE} does not hold a state dict")
    return state


def remove_checkpoints(run_dir: str | os.PathLike[str]) -> bool:
    """Delete a run's checkpoint directories (a fresh start must not leave one a later --resume finds).

    Collective under torch.distributed (rank 0 deletes, then a barrier; other ranks return False).
    """
    run = Path(run_dir)
    found = False
    if group_rank() == 0:
        for name in (CHECKPOINT_DIR, PREVIOUS_DIR):
            if (run / name).is_dir():
                shutil.rmtree(run / name)
                found = True
        remove_stale_temps(run)
    group_barrier()
    return found
