"""Any verifiers environment as an srpo env: ``Verifiers-v0``.

``make("Verifiers-v0", taskset="<verifiers taskset id>")`` plays a verifiers (Prime Intellect,
``verifiers.v1``, 0.4) environment, single- or multi-turn, single- or multi-agent, as a PettingZoo
``ParallelEnv`` whose every model call is one srpo decision event. verifiers runs unchanged: its env's
``run()`` drives the episode, its harness program (the tool-less ``null`` chat loop in the local
``subprocess`` runtime unless a seat pins its own) makes the model calls, its task's rubric scores the
traces. Only the model is srpo's: each call arrives at an OpenAI-compatible endpoint this env serves,
becomes the observation of the calling seat's agent, and the agent's action is the reply.

* **Agents**: the verifiers env's seats (``agent`` for a plain taskset; ``solver``/``judge``... for a
  multi-agent env) that do not pin a model of their own. A seat that pins one (a judge on another
  endpoint) plays inside verifiers and is no srpo agent.
* **Spaces**: text (:class:`~srpo_envs.spaces.TextSpaces`).
* **Events**: one per model call, K = 1. verifiers plays one agent at a time by default
  (``max_concurrent_agents``), so events come in a reproducible order; a multi-turn env gives one event
  per turn, each observation the whole conversation so far.
* **Observation**: the call's messages as text: the system prompt, then each message as
  ``User:``/``Assistant:``/``Tool:`` lines, the last being the turn to answer (a single user message
  unlabelled). When every task has the same system prompt it is the seats' role prompt instead
  (:attr:`VerifiersEnv.role_prompts`): srpo's policies send it as the system message, as verifiers'
  harness does, and the observation leaves it out.
* **Reward**: when the verifiers episode ends, the mean of its traces' rewards (each trace's rubric
  reward, ``Trace.reward``), the same for every agent; ``correct`` is that reward reaching
  ``solved_at``. An episode verifiers marks failed (a harness or rubric error) ends with reward 0 and its
  error in the outcome (``vf_errors``).
* **Tasks**: the first ``num_tasks`` tasks of the taskset (``split="train"`` too), or with
  ``split="test"`` the ``num_tasks`` after them, held out from training (verifiers tasksets have no
  splits of their own); ``reset(seed, options={"task_index": i})`` plays task i, else a seeded draw.

verifiers is an optional dependency with requirements of its own (``openai>=2.54``, ``mcp==2.0.0``)
that collide with the ``search`` extra, so ``bash install.sh`` puts it in its own venv,
``.venvs/verifiers``, which sees the project's packages::

    .venvs/verifiers/bin/srpo train --env Verifiers-v0 --env-kwarg taskset=vf-arith ...

Elsewhere ``make("Verifiers-v0")`` stops with one line saying so. docs/verifiers.md has both doors.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import json
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from srpo_envs.base import EventParallelEnv, Parsed, Transition
from srpo_envs.env_server import serve_in_thread

#: The model name a seat's calls carry (``srpo-seat:<env>:<seat>``): how the endpoint knows who is asked.
SEAT_MODEL_PREFIX = "srpo-seat:"
_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}


def import_verifiers() -> Any:
    """``verifiers.v1``, or one line saying where it is installed."""
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError as exc:
        raise ImportError(
            "Verifiers-v0 needs the verifiers package (0.4), which bash install.sh puts in its own venv: "
            "run srpo as .venvs/verifiers/bin/srpo"
        ) from exc


def render_messages(messages: list[dict[str, Any]]) -> str:
    """A chat request's messages as one observation text: the system prompt first, then the conversation
    with ``User:``/``Assistant:`` labels; a single user message stays unlabelled (a single-turn prompt reads
    as the prompt itself)."""
    turns = [m for m in messages if m.get("role") not in ("system", "developer")]
    label = len(turns) > 1 or (turns and turns[0].get("role") != "user")
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text = str(content or "")
        role = message.get("role", "user")
        if role in ("system", "developer"):
            parts.append(text)
        elif label:
            parts.append(f"{_LABELS.get(role, role.capitalize())}: {text}")
        else:
            parts.append(text)
    return "\n\n".join(parts)


@dataclass
class _Call:
    """A model call waiting for its agent's reply."""

    agent: str
    messages: list[dict[str, Any]]
    loop: asyncio.AbstractEventLoop
    reply: asyncio.Future = field(repr=False)


def _sse(model: str, text: str) -> Iterator[str]:
    """A reply as OpenAI's server-sent chunks (verifiers' chat harness streams)."""
    head = {"id": "chatcmpl-srpo", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    for choice in (
        {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None},
        {"index": 0, "delta": {}, "finish_reason": "stop"},
    ):
        yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
    yield "data: [DONE]\n\n"


class _Hub:
    """The one event loop and the one endpoint every ``VerifiersEnv`` of a process shares.

    verifiers keeps asyncio state (locks, pools) at module level, which must never be used from two event
    loops: envs with a loop each hang once their episodes overlap. So every env's episodes run in this
    loop, and its model calls arrive at this endpoint, routed by the model name ``srpo-seat:<env>:<seat>``.
    """

    _lock = threading.Lock()
    _instance: _Hub | None = None

    def __init__(self) -> None:
        self.envs: weakref.WeakValueDictionary[str, VerifiersEnv] = weakref.WeakValueDictionary()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="srpo-verifiers", daemon=True).start()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> Any:
            body = await request.json()
            uid, _, seat = str(body.get("model", "")).removeprefix(SEAT_MODEL_PREFIX).partition(":")
            env = self.envs.get(uid)
            if env is None:
                raise HTTPException(404, f"no live env for model {body.get('model')!r}")
            text = await env._ask(seat, list(body.get("messages") or []))
            if body.get("stream"):
                return StreamingResponse(_sse(body["model"], text), media_type="text/event-stream")
            return {
                "id": "chatcmpl-srpo", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            }

        self.server = serve_in_thread(app)
        atexit.register(self.shutdown)

    def shutdown(self) -> None:
        """Close every live env (their serving resources end cleanly), then stop the endpoint."""
        for env in list(self.envs.values()):
            with contextlib.suppress(Exception):
                env.close()
        self.server.stop()

    @classmethod
    def get(cls) -> _Hub:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance


class VerifiersEnv(EventParallelEnv):
    """A verifiers environment, its model calls as srpo events (module docstring)."""

    #: ``concurrent_envs``: a batch of these envs is reset and stepped on 4 threads (agents.rollout), since
    #: each call mostly waits for verifiers' harness process.
    metadata = {**EventParallelEnv.metadata, "name": "verifiers", "concurrent_envs": 4}

    def __init__(
        self,
        taskset: str = "srpo-verifiers",
        env_id: str = "",
        taskset_args: dict[str, Any] | None = None,
        env_args: dict[str, Any] | None = None,
        num_tasks: int = 64,
        split: str | None = None,
        solved_at: float = 1.0,
        call_timeout_s: float = 300.0,
        max_steps: int = 64,
        **kwargs: Any,
    ) -> None:
        vf = import_verifiers()
        from verifiers.v1.configs.agent import agent_config_fields
        from verifiers.v1.harnesses.null import NullHarnessConfig
        from verifiers.v1.runtimes import PrimeConfig, SubprocessConfig

        self._uid = uuid.uuid4().hex  # this env's calls carry it in their model name

        config = vf.resolve_env_config(
            {**(env_args or {}), "id": env_id, "taskset": {**(taskset_args or {}), "id": taskset}}
        )
        seats: dict[str, Any] = {}
        for name, spec in agent_config_fields(config).items():
            if spec.model is not None:
                continue  # a seat with a model of its own plays inside verifiers
            update: dict[str, Any] = {"model": f"{SEAT_MODEL_PREFIX}{self._uid}:{name}"}
            if spec.harness is None:
                update["harness"] = NullHarnessConfig(id="null")
            if isinstance(spec.runtime, PrimeConfig) and "runtime" not in spec.model_fields_set:
                update["runtime"] = SubprocessConfig()
            seats[name] = spec.model_copy(update=update)
        if not seats:
            raise ValueError(f"verifiers env {env_id or taskset!r} has no seat without a model of its own to play")
        self._vf = vf
        self._vf_env = vf.load_environment(config.model_copy(update=seats))
        if split not in (None, "train", "test"):
            raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
        view = self._vf_env.taskset.skip(int(num_tasks)) if split == "test" else self._vf_env.taskset
        self.tasks = list(view.take(int(num_tasks)))
        if not self.tasks:
            raise ValueError(f"verifiers taskset {taskset!r} yielded no task for split {split!r}")
        prompts = {t.data.system_prompt for t in self.tasks}
        #: The seats' system prompt when every task has the same one (agents.prompts uses it as the role's
        #: system prompt, and observations leave it out); otherwise it stays in each observation.
        self.role_prompts: dict[str, str] = (
            dict.fromkeys(seats, prompts.pop()) if len(prompts) == 1 and None not in prompts else {}
        )
        self.solved_at = float(solved_at)
        self.call_timeout_s = float(call_timeout_s)
        super().__init__(list(seats), max_steps=max_steps, **kwargs)
        self._cv = threading.Condition()
        self._calls: list[_Call] = []
        self._episode: Any = None  # concurrent.futures.Future of the verifiers Episode
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_serving: asyncio.Event | None = None
        self._ctx: Any = None
        self._turns: list[str] = []
        self.task: Any = None

    # ------------------------------------------------------------------ the verifiers side
    def _start(self) -> None:
        """This env's serving resources, in the shared loop, once per env."""
        if self._loop is not None:
            return
        hub = _Hub.get()
        hub.envs[self._uid] = self
        ready = threading.Event()

        async def hold() -> None:
            self._stop_serving = asyncio.Event()
            async with self._vf_env.serving():
                ready.set()
                await self._stop_serving.wait()

        self._serving = asyncio.run_coroutine_threadsafe(hold(), hub.loop)
        if not ready.wait(60) or self._serving.done():
            self._serving.result(timeout=0)  # its exception, if it failed
            raise RuntimeError("the verifiers env did not start serving within 60 s")
        self._loop = hub.loop
        self._ctx = self._vf.ModelContext(
            model="srpo", client=self._vf.EvalClientConfig(base_url=f"{hub.server.url}/v1", api_key_var="SRPO_NONE")
        )

    async def _ask(self, seat: str, messages: list[dict[str, Any]]) -> str:
        """A model call of ``seat`` (in the endpoint's loop): queued as the next event, answered by step()."""
        loop = asyncio.get_running_loop()
        call = _Call(seat, messages, loop, loop.create_future())
        with self._cv:
            self._calls.append(call)
            self._cv.notify_all()
        return await call.reply

    def _cancel_episode(self) -> None:
        """Stop an unfinished episode; its waiting calls get an empty reply."""
        if self._episode is not None and not self._episode.done():
            self._episode.cancel()
        with self._cv:
            calls, self._calls = self._calls, []
        for call in calls:
            call.loop.call_soon_threadsafe(lambda f=call.reply: f.done() or f.set_result(""))

    def _wait(self) -> None:
        """Until the next model call is waiting or the episode is over (a stuck one is cancelled)."""
        episode = self._episode
        with self._cv:
            arrived = self._cv.wait_for(lambda: bool(self._calls) or episode.done(), timeout=self.call_timeout_s)
        if not arrived:
            self._cancel_episode()

    def _notify(self, _: Any) -> None:
        with self._cv:
            self._cv.notify_all()

    # ------------------------------------------------------------------ EventParallelEnv hooks
    def _reset_episode(self, options: dict[str, Any]) -> None:
        self._start()
        self._cancel_episode()
        task = self._pick_task(self.tasks, options)
        self.task = task
        self.task_id = str(task.data.id or task.data.name or task.data.idx)
        self._turns = []
        assert self._loop is not None
        self._episode = asyncio.run_coroutine_threadsafe(self._vf_env.run_episode(task, self._ctx), self._loop)
        self._episode.add_done_callback(self._notify)
        self._wait()
        if not self._calls:
            raise RuntimeError(f"verifiers task {self.task_id} ended before any model call: {self._errors() or 'no error'}")

    def _active(self) -> tuple[str, ...]:
        return (self._calls[0].agent,) if self._calls else ()

    def _event_type(self) -> str:
        return "call"

    def _observe(self, agent: str) -> str:
        messages = self._calls[0].messages
        if messages and messages[0].get("role") == "system" and messages[0].get("content") == self.role_prompts.get(agent):
            messages = messages[1:]  # the role's system prompt, which the policy sends itself
        return render_messages(messages)

    def _parse(self, agent: str, text: str) -> Parsed:
        return Parsed(True, text)  # any text is an answer: the rubric judges it

    def _transition(self, outputs: dict[str, str], parsed: dict[str, Parsed]) -> Transition:
        with self._cv:
            call = self._calls.pop(0)
        text = outputs[call.agent]
        self._turns.append(f"{call.agent}: {text}")
        call.loop.call_soon_threadsafe(lambda: call.reply.done() or call.reply.set_result(text))
        self._wait()
        return Transition(done=not self._calls, info={"turn": len(self._turns)})

    def _shared_state(self) -> dict[str, Any]:
        pending = self._calls[0].messages if self._calls else []
        return {"task": self.task_id, "turns": list(self._turns), "messages": pending}

    def _episode_result(self) -> Any:
        if self._episode is None or not self._episode.done() or self._episode.cancelled():
            return None
        return self._episode.result()

    def _errors(self) -> list[str]:
        episode = self._episode_result()
        if episode is None:
            return ["the episode did not finish: a model call waited past call_timeout_s"]
        errors = [f"{e.type}: {e.message}" for e in episode.errors]
        return errors + [f"{t.agent.name}: {e.type}: {e.message}" for t in episode.traces for e in t.errors]

    def _outcome(self) -> tuple[float, dict[str, Any]]:
        episode = self._episode_result()
        errors = self._errors()
        if episode is None or not episode.ok or not episode.traces:
            return 0.0, {"correct": False, "vf_errors": errors or ["the episode failed"]}
        reward = sum(t.reward for t in episode.traces) / len(episode.traces)
        scores = {name: r.score for t in episode.traces for name, r in t.rewards.items() if r is not None}
        return reward, {"correct": reward >= self.solved_at, "vf_rewards": scores, "traces": len(episode.traces)}

    def state_text(self) -> str:
        return "\n".join([f"task {self.task_id}", *self._turns])

    def close(self) -> None:
        self._cancel_episode()
        if self._loop is not None:
            if self._stop_serving is not None:
                self._loop.call_soon_threadsafe(self._stop_serving.set)
            with contextlib.suppress(Exception):
                self._serving.result(timeout=30)
            self._loop = None
            _Hub.get().envs.pop(self._uid, None)
