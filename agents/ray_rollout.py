"""Rollout collection in N Ray actors: the same rows as :class:`agents.rollout.RolloutCollector`, spread out.

Why Ray: rollouts of multi-agent teams are embarrassingly parallel across tasks, and users outgrow one
process at once (several GPUs, several nodes). Ray gives actors (long-lived processes that keep their
envs, retriever connections and a policy copy or a vLLM engine), an object store for broadcasting
weights once per update, and the same code on a laptop (a local Ray started on demand) and on a
cluster (``--ray-address`` / ``RAY_ADDRESS``).

Determinism. Every request's sampling seed is derived by the collector from (collection seed, episode,
step, agent), and episode ids from (seed, task, sample), so *which* process collects a task does not
change its episode. :meth:`RayRolloutCollector.collect` splits the task indices into contiguous
chunks, one per worker, and concatenates the workers' rows, episodes and events in chunk order: the
result is the row list a single in-process collector returns for the same call (tested with 1 and 2
workers, and against the in-process collector).

Weights. :meth:`RolloutWorkerPool.load_weights` puts the learner's state dicts into the object store
once (``ray.put``) and every actor loads them from there; it also sets each policy's
``policy_version``, so rows carry the version of the weights that produced them. A policy with its
own ``load_weights`` (e.g. :class:`agents.vllm.VLLMPolicy`) is updated through it; an HF policy by
``model.load_state_dict``.

Runs that survive. A worker that dies (a crash, an OOM kill, a lost node) or hangs must cost one
share of one collection, not the run. Actors are created with ``max_restarts`` (Ray brings a dead
actor's process back), and every remote call is waited for with a timeout (``call_timeout_s``; a hung
worker is killed and restarted). A worker whose call failed is brought back (Ray's restart, or a fresh
actor once its restarts are spent), given what a new process lacks — the collectors' env factories and
the latest weights with their policy versions, re-sent from the object store — and its share is
collected again there. Since a task's episodes depend only on the collection seed (see Determinism),
the re-run share holds the rows the lost worker would have returned (tested by SIGKILLing a worker
mid-collect). ``RolloutWorkerPool.recoveries`` counts the workers brought back.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.policy import PolicyMap, SamplingParams
from agents.prompts import RolePrompts
from agents.rollout import RolloutBatch, RolloutCollector, merge_batches
from srpo_common.signals import preserve_fatal_signal_handlers

__all__ = [
    "HFPolicyFactory",
    "LostWorkerState",
    "RayRolloutCollector",
    "RemotePolicy",
    "VLLMPolicyFactory",
    "RolloutWorkerPool",
    "distinct_models",
    "ensure_ray",
    "shutdown_ray",
    "model_states",
    "split_tasks",
]

INSTALL_HINT = (
    "Ray rollout workers need ray: pip install ray (a dependency of srpo; reinstall with install.sh)"
)


def _require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a core dependency
        raise ImportError(INSTALL_HINT) from exc
    return ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> Any:
    """Connect to Ray once per process and return the ``ray`` module.

    ``address`` (or the ``RAY_ADDRESS`` environment variable) joins an existing cluster; with neither a
    local Ray starts on demand with ``num_cpus`` CPUs (default: all of this machine's) and no dashboard.
    An already initialised Ray (e.g. a test's) is reused as is.
    """
    ray = _require_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    # ray.init replaces the fatal-signal handlers an in-process JVM (BM25 search) depends on.
    with preserve_fatal_signal_handlers():
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, log_to_driver=True)
    return ray


def shutdown_ray() -> None:
    """``ray.shutdown()`` that leaves the process's fatal-signal handlers as they were."""
    ray = _require_ray()
    with preserve_fatal_signal_handlers():
        ray.shutdown()


def split_tasks(task_indices: Sequence[int], n: int) -> list[list[int]]:
    """Contiguous, order-preserving chunks of ``task_indices`` for ``n`` workers (sizes differ by <= 1).

    Empty chunks are left out, so fewer chunks than workers come back when there are fewer tasks.
    """
    if n < 1:
        raise ValueError(f"need at least one worker, got {n}")
    tasks = list(task_indices)
    base, extra = divmod(len(tasks), n)
    chunks, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        if size:
            chunks.append(tasks[start : start + size])
        start += size
    return chunks


def distinct_models(policies: PolicyMap) -> list[Any]:
    """One policy per distinct model object, in a fixed order (LoRA views of one base count once).

    The learner and every worker build their policy maps the same way, so position ``i`` names the
    same model on both sides; weights travel as ``model<i>`` state dicts.
    """
    seen: dict[int, Any] = {}
    for pol in policies.policies:
        seen.setdefault(id(getattr(pol, "model", pol)), pol)
    return list(seen.values())


def model_states(policies: PolicyMap, dtype: Any = None) -> dict[str, dict[str, Any]]:
    """``model<i> -> state_dict`` (detached CPU tensors) of every distinct model of ``policies``.

    ``dtype``: the workers' engine dtype (a ``torch.dtype``), floating tensors cast to it on the way:
    a bf16 vLLM engine stores bf16 anyway, so shipping the learner's float32 master weights through the
    object store would move twice the bytes (12 GB instead of 6 for a 3B model) for nothing."""

    def cast(t: Any) -> Any:
        t = t.detach()
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype=dtype)  # on its device first: half the bytes cross to the host
        return t.to("cpu")

    return {
        f"model{i}": {k: cast(v) for k, v in pol.model.state_dict().items()}
        for i, pol in enumerate(distinct_models(policies))
    }


def load_model_states(
    policies: PolicyMap, states: Mapping[str, Mapping[str, Any]], versions: Sequence[int] | None = None
) -> None:
    """Load :func:`model_states` output into ``policies`` and set their ``policy_version`` s."""
    models = distinct_models(policies)
    if len(models) != len(states):
        raise ValueError(f"got weights for {len(states)} model(s), the policies have {len(models)}")
    for pol, tensors in zip(models, states.values(), strict=True):
        if callable(getattr(pol, "load_weights", None)):
            pol.load_weights(dict(tensors))
        else:
            pol.model.load_state_dict(dict(tensors))
    if versions is not None:
        pols = policies.policies
        if len(pols) != len(versions):
            raise ValueError(f"got {len(versions)} policy versions for {len(pols)} policies")
        for pol, version in zip(pols, versions, strict=True):
            pol.policy_version = int(version)


@dataclass(frozen=True)
class HFPolicyFactory:
    """Builds the role -> policy map of a training run (picklable, so Ray actors build their own copy).

    ``sharing``: ``shared`` (one model), ``per-role`` (a model per role) or ``lora`` (one base with a
    LoRA adapter per role). Learner and workers build their maps with the same factory, so the
    distinct models line up (:func:`distinct_models`).
    """

    model: str
    roles: tuple[str, ...]
    sharing: str = "shared"
    lora_rank: int = 8
    device: str | None = None
    dtype: str | None = None

    def __call__(self) -> PolicyMap:
        # transformers and peft (~1.5 s): only a worker that builds a model loads them, not every importer
        from agents.hf import HFPolicy
        from agents.lora import default_lora_config, lora_policy_map

        def make() -> HFPolicy:
            return HFPolicy(self.model, device=self.device, dtype=self.dtype)

        if self.sharing == "shared":
            return PolicyMap.shared(make(), self.roles)
        if self.sharing == "per-role":
            return PolicyMap.per_role({role: make() for role in self.roles})
        if self.sharing == "lora":
            return lora_policy_map(make(), self.roles, lora_config=default_lora_config(r=self.lora_rank))
        raise ValueError(f"unknown sharing {self.sharing!r}")


class RemotePolicy:
    """Stands for a policy that lives in the rollout workers (the driver holds no copy of the model).

    It carries what callers read from a policy without generating (``policy_version``, a model name
    and ``eval_cache_key`` for cache identities); ``generate`` is an error, since generation goes
    through a :class:`RayRolloutCollector`.
    """

    def __init__(self, model: str, policy_version: int = 0, eval_cache_key: str | None = None) -> None:
        self.model_name = model
        self.policy_version = policy_version
        self.eval_cache_key = eval_cache_key

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        raise RuntimeError("RemotePolicy generates in Ray workers: use RolloutWorkerPool.collector(...)")


@dataclass(frozen=True)
class VLLMPolicyFactory:
    """Builds a shared :class:`agents.vllm.VLLMPolicy` inside a worker (one engine per actor)."""

    model: str
    roles: tuple[str, ...] = ()
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.5

    def __call__(self) -> PolicyMap:
        from agents.vllm import VLLMPolicy

        return PolicyMap.shared(
            VLLMPolicy(self.model, dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization),
            self.roles,
        )


class LostWorkerState(RuntimeError):
    """A worker was asked to collect for an env it does not hold: its process was restarted (by Ray,
    after a crash) since the env was registered, so the pool must re-send its state."""


class _RolloutWorker:
    """One Ray actor: a policy map built by ``policy_factory`` and one collector per registered env."""

    def __init__(self, policy_factory: Callable[[], PolicyMap], torch_threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, torch_threads))
        self.policies = policy_factory()
        self.collectors: dict[str, RolloutCollector] = {}

    def add_env(
        self,
        key: str,
        env_fn: Callable[[], Any],
        sampling: SamplingParams | Mapping[str, SamplingParams] | None,
        prompts: RolePrompts | None,
    ) -> None:
        self.collectors[key] = RolloutCollector(env_fn, self.policies, sampling, prompts)

    def collect(self, key: str, task_indices: list[int], group_size: int, seed: int) -> RolloutBatch:
        if key not in self.collectors:
            raise LostWorkerState(f"rollout worker (pid {os.getpid()}) holds no collector {key!r}")
        return self.collectors[key].collect(task_indices, group_size, seed)

    def pid(self) -> int:
        """This actor's process id (it changes when Ray restarts the actor)."""
        return os.getpid()

    def load_weights(self, states: dict[str, dict[str, Any]], versions: list[int] | None) -> None:
        load_model_states(self.policies, states, versions)

    def versions(self) -> list[int]:
        return [int(p.policy_version) for p in self.policies.policies]

    def close_env(self, key: str) -> None:
        collector = self.collectors.pop(key, None)
        closed: set[int] = set()  # search envs of one process share a retriever: close it once
        for env in getattr(collector, "_envs", []):
            retriever = getattr(env, "retriever", None)
            if retriever is not None and id(retriever) in closed:
                continue
            closed.add(id(retriever))
            close = getattr(env, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:  # best effort: the results are already with the driver
                    print(f"rollout worker: closing an env failed: {exc}")


class RolloutWorkerPool:
    """N Ray actors, each holding its own copy of the policies (built in the actor by ``policy_factory``).

    Args:
        policy_factory: builds the role -> policy map inside each actor (a picklable callable; it runs
            on the worker's machine, so model paths must exist there).
        num_workers: number of actors.
        ray_address: join this cluster (else ``RAY_ADDRESS``, else a local Ray).
        torch_threads: ``torch.set_num_threads`` in each actor (set it to the CPUs each one gets).
        num_cpus / num_gpus: Ray resources reserved per actor (a vLLM or CUDA policy needs a GPU).
        start_timeout_s: how long to wait for the actors to be placed and to build their policies (also
            for a restarted or replacement actor).
        call_timeout_s: how long one remote call (a share of a collection, a weight load) may take
            before its worker counts as hung and is restarted.
        max_restarts: Ray restarts of each actor after its process dies (then a fresh actor replaces it).
        max_recoveries: workers brought back within one call before the pool gives up (an error).
    """

    def __init__(
        self,
        policy_factory: Callable[[], PolicyMap],
        num_workers: int,
        *,
        ray_address: str | None = None,
        torch_threads: int = 1,
        num_cpus: float = 1,
        num_gpus: float = 0,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 3600.0,
        max_restarts: int = 3,
        max_recoveries: int = 3,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if min(start_timeout_s, call_timeout_s) <= 0 or min(max_restarts, max_recoveries) < 0:
            raise ValueError("timeouts must be > 0 and max_restarts, max_recoveries >= 0")
        ray = ensure_ray(ray_address, num_cpus=max(1, int(num_workers * num_cpus)))
        self._ray = ray
        self._factory, self._torch_threads = policy_factory, torch_threads
        self._num_cpus, self._num_gpus = num_cpus, num_gpus
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        self.max_recoveries = max_recoveries
        # max_task_retries=0: a call lost with its process is not replayed by Ray on a fresh process that
        # lacks the envs and weights; the pool restores those first (:meth:`_recover`)
        self._actor_cls = ray.remote(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts, max_task_retries=0
        )(_RolloutWorker)
        self.workers = [self._new_actor() for _ in range(num_workers)]
        self._keys = itertools.count()
        #: what a restarted worker must be given again: the collectors' envs and the latest weights
        self._envs: dict[str, tuple[Callable[[], Any], Any, Any]] = {}
        self._weights: tuple[Any, list[int] | None] | None = None
        #: workers brought back (restarted or replaced) since the pool started
        self.recoveries = 0
        # fail here (not at the first collect) when a worker cannot build its policies, and do not wait
        # forever when the cluster lacks the resources to place the actors
        try:
            ray.get([w.versions.remote() for w in self.workers], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise RuntimeError(
                f"{num_workers} rollout worker(s) did not start within {start_timeout_s:.0f} s: the Ray "
                f"cluster needs {num_cpus} CPU(s) and {num_gpus} GPU(s) free per worker "
                f"(available: {ray.available_resources()})"
            ) from None

    def _new_actor(self) -> Any:
        return self._actor_cls.remote(self._factory, self._torch_threads)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def collector(
        self,
        env_fn: Callable[[], Any],
        sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
        prompts: RolePrompts | None = None,
    ) -> RayRolloutCollector:
        """A collector for one env factory on this pool's workers (several may share a pool)."""
        return RayRolloutCollector(self, env_fn, sampling, prompts)

    # ------------------------------------------------------------------ calls that survive a lost worker
    def _failures(self) -> tuple[type[BaseException], ...]:
        exc = self._ray.exceptions
        return (exc.RayActorError, exc.GetTimeoutError, exc.RayTaskError)

    def run(self, calls: Sequence[tuple[int, Callable[[Any], Any]]]) -> list[Any]:
        """``call(worker)`` on the given workers (``(index, call)`` pairs, each returning an object
        ref), waited for with ``call_timeout_s``; the results in order.

        A call whose worker died, hung or lost its state (restarted by Ray) is re-run after
        :meth:`_recover` brought that worker back with its envs and the latest weights; at most
        ``max_recoveries`` recoveries per :meth:`run`, then a RuntimeError that says what failed.
        """
        ray = self._ray
        pending = {n: (i, call) for n, (i, call) in enumerate(calls)}
        results: dict[int, Any] = {}
        recovered = 0
        while pending:
            refs = {n: call(self.workers[i]) for n, (i, call) in pending.items()}
            deadline = time.monotonic() + self.call_timeout_s
            failed: dict[int, BaseException] = {}
            for n, ref in refs.items():
                try:
                    results[n] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                except self._failures() as exc:
                    if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(
                        exc.as_instanceof_cause(), LostWorkerState
                    ):
                        raise  # the call itself failed (a bug, bad input): re-running cannot help
                    failed[n] = exc
            pending = {n: pending[n] for n in failed}
            for i in sorted({pending[n][0] for n in failed}):
                recovered += 1
                if recovered > self.max_recoveries:
                    reasons = "; ".join(
                        f"{type(e).__name__}: {str(e).splitlines()[0]}" for e in failed.values()
                    )
                    raise RuntimeError(
                        f"rollout workers failed {recovered} times in one call (max_recoveries="
                        f"{self.max_recoveries}); last: {reasons}"
                    )
                hung = any(
                    isinstance(failed[n], ray.exceptions.GetTimeoutError)
                    for n in failed
                    if pending[n][0] == i
                )
                self._recover(i, hung)
        return [results[n] for n in range(len(calls))]

    def _recover(self, i: int, hung: bool = False) -> None:
        """Bring worker ``i`` back and re-send its state: a hung one is killed first (Ray restarts it);
        one that does not come back within ``start_timeout_s`` (restarts spent) is replaced by a fresh
        actor. Then every registered env and the latest weights (with their versions) are loaded."""
        ray = self._ray
        w = self.workers[i]
        if hung:
            ray.kill(w, no_restart=False)
        try:
            ray.get(w.pid.remote(), timeout=self.start_timeout_s)
        except self._failures():
            ray.kill(w, no_restart=True)
            w = self.workers[i] = self._new_actor()
            ray.get(w.pid.remote(), timeout=self.start_timeout_s)
        refs = [w.add_env.remote(key, *spec) for key, spec in self._envs.items()]
        if self._weights is not None:
            refs.append(w.load_weights.remote(*self._weights))
        ray.get(refs, timeout=self.call_timeout_s)
        self.recoveries += 1

    def register_env(
        self,
        key: str,
        env_fn: Callable[[], Any],
        sampling: SamplingParams | Mapping[str, SamplingParams] | None,
        prompts: RolePrompts | None,
    ) -> None:
        """Build a collector for ``env_fn`` under ``key`` on every worker (and on any later replacement)."""
        self._envs[key] = (env_fn, sampling, prompts)
        self.run(
            [(i, lambda w: w.add_env.remote(key, env_fn, sampling, prompts)) for i in range(self.num_workers)]
        )

    def load_weights(self, states: Mapping[str, Mapping[str, Any]], versions: Sequence[int] | None) -> None:
        """Broadcast new weights: one ``ray.put``, every actor loads from the object store (the ref is
        kept, so a worker restarted later gets the same weights again)."""
        ref = self._ray.put(dict(states))
        self._weights = (ref, None if versions is None else [int(v) for v in versions])
        weights = self._weights
        self.run([(i, lambda w: w.load_weights.remote(*weights)) for i in range(self.num_workers)])

    def versions(self) -> list[list[int]]:
        """Every worker's policy versions (for checks and tests)."""
        return self.run([(i, lambda w: w.versions.remote()) for i in range(self.num_workers)])

    def pids(self) -> list[int]:
        """Every worker's process id (for tests and operators: which process to look at)."""
        return self.run([(i, lambda w: w.pid.remote()) for i in range(self.num_workers)])

    def shutdown(self) -> None:
        """Stop the actors (the Ray runtime itself stays up for other users in this process)."""
        for w in self.workers:
            self._ray.kill(w, no_restart=True)
        self.workers = []
        self._weights = None


class RayRolloutCollector:
    """Drop-in for :class:`~agents.rollout.RolloutCollector` whose ``collect`` runs on a worker pool.

    Build it with :meth:`RolloutWorkerPool.collector`. ``collect`` returns exactly what an in-process
    collector returns for the same arguments (see the module docstring), also when a worker is lost
    mid-collect (its share is collected again on the recovered worker).
    """

    def __init__(
        self,
        pool: RolloutWorkerPool,
        env_fn: Callable[[], Any],
        sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
        prompts: RolePrompts | None = None,
    ) -> None:
        self.pool = pool
        self.key = f"env{next(pool._keys)}"
        pool.register_env(self.key, env_fn, sampling, prompts)

    def collect(self, task_indices: Sequence[int], group_size: int = 1, seed: int = 0) -> RolloutBatch:
        """Roll out ``group_size`` episodes of each task, spread over the workers; merged in task order."""
        if group_size < 1 or not task_indices:
            raise ValueError("need at least one task and group_size >= 1")
        key = self.key
        chunks = split_tasks(task_indices, self.pool.num_workers)
        calls = [
            (i, lambda w, chunk=chunk: w.collect.remote(key, chunk, group_size, seed))
            for i, chunk in enumerate(chunks)
        ]
        return merge_batches(self.pool.run(calls))

    def close(self) -> None:
        """Close this collector's envs on every worker."""
        self.pool._envs.pop(self.key, None)
        key = self.key
        self.pool.run([(i, lambda w: w.close_env.remote(key)) for i in range(self.pool.num_workers)])
