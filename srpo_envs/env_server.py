"""``srpo serve-env``: any registered env over HTTP, one env instance per session (FastAPI).

Other trainers and agent frameworks speak HTTP, not Python objects. Meta/Hugging Face OpenEnv serves
one single-agent environment per server as ``reset`` / ``step`` / ``state`` returning an observation, a
reward and ``done``; this server keeps those names and shapes and carries what a multi-agent event env
adds: a dict of per-agent actions in, per-agent observations, rewards and infos out, and the next
event's **active set** (the agents whose outputs the next step consumes). Wire format::

    POST   /sessions                    {"env_id", "env_kwargs"}      -> {"session_id", "env_id", "possible_agents",
                                                                         "max_obs_chars", "max_action_chars", ...}
    POST   /sessions/{id}/reset         {"seed", "options"}           -> StepResult (reward/done null/false)
    POST   /sessions/{id}/step          {"action": {"actions": {agent: text}}}
                                                                      -> StepResult
    GET    /sessions/{id}/state                                       -> {"episode_id", "step_count", "agents",
                                                                         "active_agents", "state_text", "outcome"}
    DELETE /sessions/{id}
    GET    /health, GET /envs

    StepResult = {"observation": {"observations": {agent: text}, "infos": {agent: {...}},
                                  "active_agents": [...], "agents": [...]},
                  "reward": team reward of the step (the mean over agents; null after reset),
                  "rewards": {agent: r}, "terminations": {...}, "truncations": {...},
                  "done": every agent is finished}

**OpenEnv's wire protocol** (openenv-core 0.3.0's ``EnvClient`` / ``GenericEnvClient``, tested with that
client in ``tests/srpo_envs/test_openenv.py``) is served beside the session API, one env per WebSocket as in OpenEnv::

    WS     /ws      client -> {"type": "reset", "data": {"seed", "episode_id", "options", "env_id", "env_kwargs"}}
                              {"type": "step",  "data": OpenEnvAction}
                              {"type": "state"}           {"type": "close"}
                    server -> {"type": "observation", "data": {"observation", "reward", "done"}}
                              {"type": "state", "data": OpenEnvState}
                              {"type": "error", "data": {"message", "code"}}   (the client raises it)
    POST   /reset   {"seed", "episode_id", "options", "env_id", "env_kwargs"}  -> {"observation", "reward", "done"}
    POST   /step    {"action": OpenEnvAction, + /reset's fields}                -> {"observation", "reward", "done"}
    GET    /state, GET /schema ({"action", "observation", "state"} JSON schemas), GET /metadata

The multi-agent mapping, since OpenEnv's payloads are single-agent (one action, one scalar reward):

* action ``{"actions": {agent: text}, "metadata": {}}``: every agent of the active set acts in one step;
* observation ``{"observations": {agent: text}, "infos": {agent: {...}}, "active_agents": [...] (whose
  texts the next step consumes), "agents": [...] (still live), "rewards": {agent: r} (per agent; empty
  after a reset), "terminations", "truncations"}``; the top-level ``reward`` is the team reward of the
  step (the mean over agents, as in the session API; ``null`` after a reset) and ``done`` is true once
  every agent is finished;
* state ``{"episode_id", "step_count", "env_id", "possible_agents", "agents", "active_agents",
  "state_text", "outcome"}`` (OpenEnv's ``State`` fields first).

Which env: a reset's ``env_id`` / ``env_kwargs`` (``client.reset(env_id=..., env_kwargs=...)``; a reset
naming another env or other kwargs rebuilds the socket's env, one naming neither keeps it), else the
server's default
(``srpo serve-env --openenv-env ID``, or the only ``--env`` served). Unknown reset fields are an error,
not silently dropped. A WebSocket's env is a session of the same store (it counts against
``max_sessions`` from its first reset and expires after ``idle_timeout_s`` idle); the HTTP ``/reset``
``/step`` ``/state`` are stateless as in OpenEnv: each builds a fresh env and closes it, so ``/step``
resets it first (the request's ``seed``...; our envs refuse a step before a reset) and answers the
first event of that episode. Multi-step episodes over OpenEnv use ``/ws``.

Isolation and limits: every session owns its env object (nothing is shared between sessions; an env
is built by the registry from its id and the session's kwargs) and a lock, so concurrent requests of
one session run one at a time while different sessions run in parallel (env calls go to a thread
pool). At most ``max_sessions`` live at once (another create is 503 with ``Retry-After``); a session
idle for ``idle_timeout_s`` is closed and its id answers 404 afterwards. A bad request is a 4xx whose
``detail`` is the reason: unknown env id or bad kwargs 400, unknown/expired session 404, a bad action
dict (agents that are not live, missing actions of the active set, stepping a finished episode) 400
with the env's own message, malformed JSON 422. JSON only: nothing a client sends is unpickled or run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from srpo_envs.openenv_server import (  # noqa: F401 (re-exported: the adapter's names from their old home)
    WS_MAX_MESSAGE_CHARS,
    OpenEnvAction,
    OpenEnvObservation,
    OpenEnvState,
    add_openenv_routes,
)
from srpo_envs.registry import make, registry
from srpo_envs.sessions import (  # noqa: F401 (re-exported)
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_SESSIONS,
    Session,
    SessionStore,
    close_env,
    jsonable,
)


class CreateRequest(BaseModel):
    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class ResetRequest(BaseModel):
    seed: int | None = None
    options: dict[str, Any] | None = None


class StepAction(BaseModel):
    actions: dict[str, Any]


class StepRequest(BaseModel):
    action: StepAction


def _observation(env: Any, obs: dict[str, Any], infos: dict[str, Any]) -> dict[str, Any]:
    return {
        "observations": jsonable(obs),
        "infos": jsonable(infos),
        "active_agents": list(getattr(env, "active_agents", env.agents)),
        "agents": list(env.agents),
    }


def create_app(
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    env_ids: list[str] | None = None,
    sweep_s: float | None = None,
    openenv_env_id: str | None = None,
    openenv_env_kwargs: dict[str, Any] | None = None,
) -> FastAPI:
    """The env server app. ``env_ids``: the ids clients may create (default: every registered one).

    ``openenv_env_id`` / ``openenv_env_kwargs``: the env an OpenEnv client gets when its reset names
    none (default: the only served id, if one is served).
    """
    allowed = sorted(env_ids) if env_ids is not None else None
    if allowed is not None:
        unknown = [e for e in allowed if e not in registry]
        if unknown:
            raise ValueError(f"unknown env ids {unknown}; registered: {sorted(registry)}")
    store = SessionStore(max_sessions, idle_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def sweep() -> None:  # expiry also runs on every request; this closes envs of a quiet server
            while True:
                await asyncio.sleep(sweep_s or max(0.05, min(idle_timeout_s / 2, 30.0)))
                store.expire()

        task = asyncio.create_task(sweep())
        try:
            yield
        finally:
            task.cancel()
            for s in list(store.sessions.values()):
                store.remove(s.id)
                close_env(s.env)

    app = FastAPI(title="srpo env server", lifespan=lifespan)
    app.state.sessions = store
    served = allowed if allowed is not None else sorted(registry)
    if openenv_env_id is None and len(served) == 1:
        openenv_env_id = served[0]
    if openenv_env_id is not None and openenv_env_id not in served:
        raise ValueError(f"openenv_env_id {openenv_env_id!r} is not served; this server serves {served}")
    add_openenv_routes(app, store, served, openenv_env_id, dict(openenv_env_kwargs or {}))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        store.expire()
        return {
            "status": "healthy",  # OpenEnv's HealthStatus value
            "sessions": len(store.sessions),
            "max_sessions": store.max_sessions,
            "expired": store.expired,
        }

    @app.get("/envs")
    async def envs() -> dict[str, Any]:
        ids = allowed if allowed is not None else sorted(registry)
        return {"envs": {i: registry[i].description for i in ids}}

    @app.post("/sessions")
    async def create(req: CreateRequest) -> dict[str, Any]:
        if req.env_id not in registry or (allowed is not None and req.env_id not in allowed):
            served = allowed if allowed is not None else sorted(registry)
            raise HTTPException(400, f"unknown env id {req.env_id!r}; this server serves {served}")
        try:
            env = await run_in_threadpool(make, req.env_id, **req.env_kwargs)
        except (TypeError, ValueError, KeyError) as exc:
            raise HTTPException(400, f"cannot build {req.env_id} with {req.env_kwargs}: {exc}") from None
        session = store.add(req.env_id, env)
        return {
            "session_id": session.id,
            "env_id": req.env_id,
            "possible_agents": list(env.possible_agents),
            "max_obs_chars": int(getattr(env, "max_obs_chars", 65536)),
            "max_action_chars": int(getattr(env, "max_action_chars", 8192)),
            "metadata": jsonable(getattr(env, "metadata", {})),
            "roles": {a: env.role_of(a) for a in env.possible_agents} if hasattr(env, "role_of") else {},
        }

    @app.post("/sessions/{sid}/reset")
    async def reset(sid: str, req: ResetRequest) -> dict[str, Any]:
        session = store.get(sid)
        async with session.lock:
            try:
                obs, infos = await run_in_threadpool(session.env.reset, seed=req.seed, options=req.options)
            except (TypeError, ValueError, KeyError) as exc:
                raise HTTPException(400, f"reset failed: {exc}") from None
            session.step_count = 0
            session.last_used = time.monotonic()
            return {
                "observation": _observation(session.env, obs, infos),
                "reward": None,
                "done": False,
            }

    @app.post("/sessions/{sid}/step")
    async def step(sid: str, req: StepRequest) -> dict[str, Any]:
        session = store.get(sid)
        async with session.lock:
            env = session.env
            try:
                obs, rewards, terms, truncs, infos = await run_in_threadpool(env.step, req.action.actions)
            except (TypeError, ValueError, KeyError) as exc:
                raise HTTPException(400, f"bad action: {exc}") from None
            session.step_count += 1
            session.last_used = time.monotonic()
            team = sum(rewards.values()) / len(rewards) if rewards else 0.0
            return {
                "observation": _observation(env, obs, infos),
                "reward": jsonable(float(team)),
                "rewards": jsonable(rewards),
                "terminations": jsonable(terms),
                "truncations": jsonable(truncs),
                "done": not env.agents,
            }

    @app.get("/sessions/{sid}/state")
    async def state(sid: str) -> dict[str, Any]:
        session = store.get(sid)
        async with session.lock:
            env = session.env
            text = await run_in_threadpool(env.state)
            return {
                "session_id": sid,
                "env_id": session.env_id,
                "episode_id": getattr(env, "episode_id", None),
                "step_count": session.step_count,
                "agents": list(env.agents),
                "active_agents": list(getattr(env, "active_agents", env.agents)),
                "state_text": jsonable(text),
                "outcome": jsonable(getattr(env, "outcome", {})),
            }

    @app.delete("/sessions/{sid}")
    async def close(sid: str) -> dict[str, Any]:
        session = store.remove(sid)
        if session is None:
            raise HTTPException(404, f"no session {sid!r}")
        await run_in_threadpool(close_env, session.env)
        return {"closed": sid}

    return app


@dataclass
class BackgroundServer:
    """A uvicorn server on a daemon thread (tests, notebooks); ``url`` is its base URL."""

    server: Any
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """Start ``app`` under uvicorn on a background thread; port 0 picks a free port."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="srpo-env-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the env server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return BackgroundServer(server, thread, f"http://{host}:{bound}")


def serve(
    host: str = "127.0.0.1",
    port: int = 8100,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    env_ids: list[str] | None = None,
    log_level: str = "info",
    openenv_env_id: str | None = None,
) -> None:
    """Serve in the foreground until interrupted (what ``srpo serve-env`` runs)."""
    import uvicorn

    app = create_app(
        max_sessions=max_sessions, idle_timeout_s=idle_timeout_s, env_ids=env_ids, openenv_env_id=openenv_env_id
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)


__all__ = [
    "BackgroundServer",
    "OpenEnvAction",
    "OpenEnvObservation",
    "OpenEnvState",
    "create_app",
    "jsonable",
    "serve",
    "serve_in_thread",
]
