"""Where a training run's numbers go: one :class:`Tracker` interface, one class per backend, by name.

``srpo train --logger console,jsonl,tensorboard,wandb,mlflow`` (``TrainConfig.logger``) opens one
backend per name behind a :class:`MultiTracker`, the way verl's ``Tracking`` takes a list of loggers.
The trainer calls three methods and never branches on a backend:

* ``log_hparams(config)`` once per run, with the resolved ``TrainConfig`` in its sections
  (:func:`learners.config.flat_to_sections`) flattened to dotted keys (:func:`flatten_config`:
  ``update.lr``, ``run.env_kwargs.difficulty``: the paths ``--set`` and experiment files name);
* ``log(metrics, step)`` once per ``metrics.jsonl`` row, ``step`` = the iteration;
* ``close()`` when :meth:`learners.trainer.Trainer.train` ends, however it ends (a backend that knows
  run states marks the run failed when an exception is propagating).

``metrics.jsonl`` (:class:`JsonlTracker`) is always written, named or not: a resume cuts it back to its
checkpoint, ``bench compare`` reads its curves from it and it is the run's own record; the other names
add backends. Metric keys keep their namespaces (``actor/clip_frac``); a nested dict value (e.g.
``rollout/k_hist``) becomes one scalar per entry (``rollout/k_hist/3``) and values that are not numbers
are left to ``metrics.jsonl``.

Nothing leaves the machine unless the user asks for it:

* ``wandb`` runs in W&B's **offline** mode (files under ``OUT/wandb``, ``wandb sync`` uploads them
  later) unless ``WANDB_MODE`` is set (``WANDB_MODE=online``); offline, W&B's error reporting is off
  too (``WANDB_ERROR_REPORTING=false`` unless set). ``WANDB_PROJECT`` (default ``srpo``),
  ``WANDB_ENTITY`` and ``WANDB_DIR`` are W&B's own variables and are honoured;
* ``mlflow`` writes to a SQLite store in the run directory (``sqlite:///OUT/mlflow.db``, read with
  ``mlflow ui --backend-store-uri sqlite:///OUT/mlflow.db`` or :class:`mlflow.tracking.MlflowClient`)
  unless ``MLFLOW_TRACKING_URI`` is set; ``MLFLOW_EXPERIMENT_NAME`` (default ``srpo``) names the
  experiment; MLflow's usage telemetry is off (``MLFLOW_DISABLE_TELEMETRY=true`` unless set). SQLite,
  not a ``file:`` store: MLflow 3 refuses its filesystem store (in maintenance
  mode) unless ``MLFLOW_ALLOW_FILE_STORE=true``; a user who wants one sets both variables.

A resumed run (``--resume``) continues the same W&B run id and MLflow run (their ids are kept in
``OUT/trackers.json``) and does not log its hyperparameters again. MLflow's metric history is append
only: iterations a killed run logged after its last checkpoint appear twice there (``metrics.jsonl``
is cut back; W&B drops a step it has already seen in the same run).

MLflow allows only ``[A-Za-z0-9_-. /:]`` in metric and parameter names and no path segment that
normalises away; :func:`mlflow_key` maps any other name deterministically (see there). New backends
register with :func:`register_tracker`.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import numbers
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from learners import metrics_log
from srpo_common import plugins
from srpo_common.io import atomic_write_text

#: Where a run's backends keep the ids a resume reattaches to.
STATE_FILE = "trackers.json"


@runtime_checkable
class Tracker(Protocol):
    """One destination of a run's hyperparameters and per-iteration metrics."""

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        """Record the run's flattened config (called once, before the first :meth:`log`)."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record one iteration's metrics (the ``metrics.jsonl`` row; ``step`` is its iteration)."""

    def close(self) -> None:
        """Flush and release; called exactly once."""


@dataclass
class RunInfo:
    """What a backend knows of the run it tracks."""

    out_dir: Path
    """the run directory (``TrainConfig.out_dir``)"""
    name: str
    """the run's display name (the run directory's name)"""
    resume: bool = False
    """the trainer continues from a checkpoint: reattach to the run in ``state`` when there is one"""
    echo: Callable[[str], None] = print
    """where ``console`` writes"""
    state: dict[str, Any] = field(default_factory=dict)
    """``OUT/trackers.json`` as the previous attempt left it (per backend name)"""


# ---------------------------------------------------------------------------------------------- helpers
def flatten_config(config: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """``{"env_kwargs": {"difficulty": [2, 3]}}`` -> ``{"env_kwargs.difficulty": [2, 3]}``.

    Dotted, because that is how a config path is written on the command line (``--set a.b=v``); an
    empty mapping stays one entry (``{}``) so every field of the config appears."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, sep, name + sep))
        else:
            out[name] = value
    return out


def scalar_metrics(metrics: Mapping[str, Any], skip: Iterable[str] = ("iteration",)) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` row, nested mappings flattened with ``/`` (namespaced keys).

    ``None`` (how ``metrics.jsonl`` writes a non-finite float), strings and lists are left out; bools
    become 0/1. ``iteration`` is the step, not a metric."""
    skipped = set(skip)
    out: dict[str, float] = {}
    for key, value in flatten_config(metrics, sep="/").items():
        if key in skipped or isinstance(value, str) or not isinstance(value, numbers.Real):
            continue
        out[key] = float(value)
    return out


_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
_MLFLOW_MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH


def mlflow_key(name: str) -> str:
    """``name`` as a valid MLflow metric/parameter key; names that are valid already are unchanged.

    The mapping, deterministic and the same on every OS: each character outside
    ``A-Z a-z 0-9 _ - . / space`` becomes ``_`` (MLflow also allows ``:`` except on Windows; it is
    mapped so a run logs the same keys everywhere), each empty, ``.`` or ``..`` ``/``-segment becomes
    ``_`` (MLflow rejects names that ``posixpath.normpath`` changes), and a key longer than MLflow's
    250 characters keeps its first 241 and ends in ``-`` plus 8 hex digits of the original's sha256.
    Two names that map to one key are an error (:class:`MlflowTracker` checks)."""
    key = _MLFLOW_BAD_CHARS.sub("_", str(name))
    key = "/".join(part if part not in ("", ".", "..") else "_" for part in key.split("/"))
    if len(key) > _MLFLOW_MAX_KEY:
        key = key[: _MLFLOW_MAX_KEY - 9] + "-" + hashlib.sha256(str(name).encode()).hexdigest()[:8]
    return key


def _is_main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


# --------------------------------------------------------------------------------------------- backends
class JsonlTracker:
    """``OUT/metrics.jsonl``: one JSON row per iteration (:func:`learners.metrics_log.append_metrics`)."""

    def __init__(self, run: RunInfo) -> None:
        self.path = Path(run.out_dir) / "metrics.jsonl"

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        """Nothing: the config is saved with every checkpoint (``config`` in its state)."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        row = {"iteration": step, **{k: v for k, v in metrics.items() if k != "iteration"}}
        metrics_log.append_metrics(self.path, row)

    def close(self) -> None:
        """Nothing to flush: every row is fsynced as it is written."""


class ConsoleTracker:
    """One line per iteration on the trainer's log: ``[it 3] actor/loss=-0.0181 reward_mean=0.5 ...``."""

    def __init__(self, run: RunInfo) -> None:
        self.echo = run.echo

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        """Nothing: ``srpo train`` already echoes its options, and 70 lines would bury the curve."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = scalar_metrics(metrics)
        self.echo(f"[it {step}] " + " ".join(f"{k}={v:.4g}" for k, v in values.items()))

    def close(self) -> None:
        """Nothing to release."""


class TensorBoardTracker:
    """``OUT/tb``: one scalar per metric (``torch.utils.tensorboard``); hyperparameters in the HParams tab."""

    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        logdir = Path(run.out_dir) / "tb"
        # a resume appends a new event file to the same directory: the first attempt's hparams stand
        self._attached = run.resume and logdir.is_dir() and any(logdir.glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(str(logdir))

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        if self._attached:
            return
        from torch.utils.tensorboard.summary import hparams

        values = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in config.items()}
        for summary in hparams(values, metric_dict={}):
            self.writer.file_writer.add_summary(summary)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in scalar_metrics(metrics).items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Weights & Biases, **offline** unless ``WANDB_MODE`` says otherwise (see the module docstring)."""

    def __init__(self, run: RunInfo) -> None:
        try:
            import wandb
        except ImportError:  # pragma: no cover - the tracking extra is part of `all`
            raise ImportError("--logger wandb needs wandb: pip install 'srpo[tracking]'") from None
        previous = run.state.get("wandb") if run.resume else None
        self._attached = bool(previous)
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        if self.mode in ("offline", "dryrun", "disabled"):  # W&B's own crash telemetry goes online too
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "srpo",
            name=run.name,
            id=previous["id"] if previous else None,
            resume="allow" if previous else None,
            mode=self.mode,  # type: ignore[arg-type]
            dir=None if os.environ.get("WANDB_DIR") else str(Path(run.out_dir).resolve()),
            settings=wandb.Settings(quiet=True),
        )
        self.state = {"id": self.run.id, "mode": self.mode}

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        if not self._attached:
            self.run.config.update(dict(config))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(scalar_metrics(metrics), step=step)

    def close(self) -> None:
        self.run.finish(exit_code=1 if sys.exc_info()[0] is not None else 0)


class MlflowTracker:
    """MLflow through :class:`mlflow.tracking.MlflowClient` (no global active run, so runs in one process
    do not share state); a SQLite store in the run directory unless ``MLFLOW_TRACKING_URI`` is set."""

    def __init__(self, run: RunInfo) -> None:
        # MLflow 3 sends usage telemetry to its vendor (a DNS lookup and HTTPS posts, seen with strace);
        # off unless the user set MLFLOW_DISABLE_TELEMETRY / DO_NOT_TRACK. Before the import: the
        # client reads it when it starts.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError:  # pragma: no cover - the tracking extra is part of `all`
            raise ImportError("--logger mlflow needs mlflow: pip install 'srpo[tracking]'") from None
        out = Path(run.out_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        env_uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = env_uri or f"sqlite:///{out / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "srpo"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            # our own store keeps artifacts beside it (the default would be ./mlruns of the cwd)
            where = None if env_uri else (out / "mlartifacts").as_uri()
            try:
                experiment_id = self.client.create_experiment(name, artifact_location=where)
            except MlflowException:  # another process of a comparison created it first
                experiment_id = self.client.get_experiment_by_name(name).experiment_id  # type: ignore[union-attr]
        previous = run.state.get("mlflow") if run.resume else None
        self._attached = bool(previous) and previous.get("tracking_uri") == self.tracking_uri  # type: ignore[union-attr]
        if self._attached:
            self.run_id = str(previous["run_id"])  # type: ignore[index]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
        self.state = {"run_id": self.run_id, "tracking_uri": self.tracking_uri}
        self._keys: dict[str, str] = {}

    def _key(self, name: str) -> str:
        key = mlflow_key(name)
        if self._keys.setdefault(key, name) != name:
            raise ValueError(f"metric names {self._keys[key]!r} and {name!r} both map to MLflow key {key!r}")
        return key

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        if self._attached:
            return
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        params = [Param(self._key(k), str(v)) for k, v in config.items()]
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH])

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        now = int(time.time() * 1000)
        rows = [Metric(self._key(k), v, now, step) for k, v in scalar_metrics(metrics).items()]
        for i in range(0, len(rows), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=rows[i : i + MAX_METRICS_PER_BATCH])

    def close(self) -> None:
        failed = sys.exc_info()[0] is not None
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


#: name -> backend class (anything called with a :class:`RunInfo` that returns a :class:`Tracker`).
TRACKERS: dict[str, Callable[[RunInfo], Tracker]] = {
    "console": ConsoleTracker,
    "jsonl": JsonlTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}
plugins.watch("tracker", TRACKERS)  # type: ignore[arg-type]  # a plugin may add, not replace
#: The backend every run has (resume, ``bench compare`` and the leaderboards read ``metrics.jsonl``).
ALWAYS = "jsonl"


def register_tracker(name: str, factory: Callable[[RunInfo], Tracker]) -> None:
    """Make ``--logger NAME`` open ``factory(run_info)``."""
    if not name or "," in name or name != name.strip():
        raise ValueError(f"tracker name must be non-empty, without commas or surrounding spaces: {name!r}")
    TRACKERS[name] = factory


def parse_loggers(spec: str | Iterable[str]) -> tuple[str, ...]:
    """``"console, wandb"`` or ``["console", "wandb"]`` -> ``("console", "wandb")``, checked and deduplicated.

    An unknown name is a :class:`ValueError` that suggests the nearest known one."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in names:
        if not isinstance(raw, str):
            raise ValueError(f"logger names are strings, got {raw!r}")
        name = raw.strip()
        if not name:
            continue
        if name not in TRACKERS:
            near = difflib.get_close_matches(name, list(TRACKERS), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown logger {name!r}{hint} (known: {', '.join(TRACKERS)})")
        if name not in out:
            out.append(name)
    return tuple(out)


class MultiTracker:
    """Fans each call out to its trackers, in order; :meth:`close` closes every one even if one fails."""

    def __init__(self, trackers: Mapping[str, Tracker]) -> None:
        self.trackers = dict(trackers)
        self._closed = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.trackers)

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        for tracker in self.trackers.values():
            tracker.log_hparams(config)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for tracker in self.trackers.values():
            tracker.log(metrics, step)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for tracker in self.trackers.values():
            try:
                tracker.close()
            except Exception as exc:  # the others still close; the first error is raised after
                errors.append(exc)
        if errors:
            raise errors[0]


class TrackerError(ValueError):
    """A tracker cannot start from the state it finds (a junk store, a missing key): one line naming the
    tracker and the fix, before any run is opened (exit 2 at the ``srpo`` boundary)."""


_SQLITE_MAGIC = b"SQLite format 3\x00"


def preflight(names: Iterable[str], out_dir: str | os.PathLike[str]) -> None:
    """Check what each named tracker will need, cheaply and before any of them starts, so that broken
    tracker state is one line within seconds instead of a backend's retries, its banner or its files left
    outside ``out_dir``: the run directory is writable; MLflow's store in it (``OUT/mlflow.db``) is a
    SQLite file when it exists; W&B online has an API key."""
    out = Path(out_dir)
    names = set(names)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot create the run directory ({exc.strerror})", str(out)) from None
    try:  # a real write (os.access says yes to root on a read-only mount)
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(exc.errno or errno.EACCES, f"the run directory is not writable ({exc.strerror})", str(out)) from None
    if "mlflow" in names and not os.environ.get("MLFLOW_TRACKING_URI"):
        db = out / "mlflow.db"
        if db.is_dir():
            raise TrackerError(
                f"mlflow: {db} is a directory, not MLflow's SQLite store: move it away, or set MLFLOW_TRACKING_URI"
            )
        if db.is_file() and db.stat().st_size:
            with db.open("rb") as fh:
                head = fh.read(len(_SQLITE_MAGIC))
            if head != _SQLITE_MAGIC:
                raise TrackerError(
                    f"mlflow: {db} is not a SQLite database (junk or another file): move it away to start a new "
                    "store, or set MLFLOW_TRACKING_URI"
                )
    if "wandb" in names:
        mode = os.environ.get("WANDB_MODE") or "offline"
        if mode in ("online", "run") and not _wandb_key():
            raise TrackerError(
                "wandb: WANDB_MODE=online needs an API key: run `wandb login` or set WANDB_API_KEY (or unset "
                "WANDB_MODE: runs are then offline in OUT/wandb, `wandb sync` uploads them later)"
            )


def _wandb_key() -> bool:
    """Whether W&B will find an API key: ``WANDB_API_KEY``, or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def open_trackers(
    names: str | Iterable[str],
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    echo: Callable[[str], None] | None = None,
    main: bool | None = None,
) -> MultiTracker:
    """Open ``jsonl`` and the named backends for the run in ``out_dir``.

    ``resume``: the run continues from a checkpoint (W&B and MLflow reattach to the runs recorded in
    ``OUT/trackers.json``; no backend logs the hyperparameters again). ``main``: this process reports
    (default: torch.distributed rank 0); other ranks get ``jsonl`` only, which writes nothing off rank 0."""
    out = Path(out_dir)
    chosen = parse_loggers(names)
    if main is None:
        main = _is_main_rank()
    if not main:
        chosen = ()
    state_path = out / STATE_FILE
    state: dict[str, Any] = {}
    if resume and state_path.is_file():
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # unreadable: start new runs rather than fail the resume
            state = {}
        # hand-edited or foreign: keep only {backend: {key: str}} entries (anything else starts a new run)
        if not isinstance(state, dict):
            state = {}
        state = {
            k: v
            for k, v in state.items()
            if isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
        }
    if main:
        preflight(chosen, out)
    run = RunInfo(out_dir=out, name=out.resolve().name, resume=resume, echo=echo or print, state=state)
    trackers: dict[str, Tracker] = {ALWAYS: TRACKERS[ALWAYS](run)}
    try:
        for name in chosen:
            if name != ALWAYS:
                try:
                    trackers[name] = TRACKERS[name](run)
                except (ImportError, OSError, TrackerError):
                    raise
                except Exception as exc:  # the backend's own error: named, on one line
                    text = " ".join(str(exc).split())[:300]
                    raise TrackerError(f"{name}: could not start ({type(exc).__name__}: {text})") from exc
    except BaseException:
        MultiTracker(trackers).close()
        raise
    ids = {name: t.state for name, t in trackers.items() if isinstance(getattr(t, "state", None), dict)}
    if ids:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(state_path, json.dumps(ids, indent=2, sort_keys=True) + "\n")
    elif not resume and main and state_path.exists():  # a fresh run must not reattach to these later
        state_path.unlink()
    return MultiTracker(trackers)
