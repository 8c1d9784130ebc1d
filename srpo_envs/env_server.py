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
client in ``tests/test_openenv.py``) is served beside the session API, one env per WebSocket as in OpenEnv::

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
import contextlib
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from srpo_common.jsonsafe import loads_bounded
from srpo_envs.registry import make, registry

DEFAULT_MAX_SESSIONS = 64
#: The longest ``/ws`` text message (characters): an observation request is a few KB; past this the socket
#: closes with 1009 (message too big) before the text is parsed.
WS_MAX_MESSAGE_CHARS = 1 << 20
logger = logging.getLogger("srpo.env_server")
DEFAULT_IDLE_TIMEOUT_S = 600.0


def jsonable(obj: Any) -> Any:
    """A JSON-safe copy: tuples -> lists, non-finite floats -> None, unknown objects -> str.

    The client's :class:`~srpo_envs.remote.RemoteEnv` returns exactly this, so a local trajectory
    compares equal to a remote one after ``jsonable`` (``tests/test_env_server.py``).
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str | int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        return jsonable(item())
    return str(obj)


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


@dataclass
class Session:
    """One client's env: its own object, its own lock, the time it was last used."""

    id: str
    env_id: str
    env: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    step_count: int = 0


def _observation(env: Any, obs: dict[str, Any], infos: dict[str, Any]) -> dict[str, Any]:
    return {
        "observations": jsonable(obs),
        "infos": jsonable(infos),
        "active_agents": list(getattr(env, "active_agents", env.agents)),
        "agents": list(env.agents),
    }


class SessionStore:
    """Live sessions, the cap on their number and idle expiry."""

    def __init__(self, max_sessions: int, idle_timeout_s: float) -> None:
        if max_sessions < 1 or idle_timeout_s <= 0:
            raise ValueError("max_sessions must be >= 1 and idle_timeout_s > 0")
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[str, Session] = {}
        self.expired = 0
        self._lock = threading.Lock()

    def expire(self) -> list[Session]:
        """Remove sessions idle longer than the timeout (a session busy in a step is never idle)."""
        now = time.monotonic()
        with self._lock:
            old = [
                s
                for s in self.sessions.values()
                if now - s.last_used > self.idle_timeout_s and not s.lock.locked()
            ]
            for s in old:
                del self.sessions[s.id]
            self.expired += len(old)
        for s in old:
            _close(s.env)
        return old

    def add(self, env_id: str, env: Any) -> Session:
        self.expire()
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                raise HTTPException(
                    503,
                    f"{len(self.sessions)} sessions are live, the server's limit (--max-sessions); close one "
                    "(DELETE /sessions/{id}) or retry after idle ones expire",
                    headers={"Retry-After": "1"},
                )
            sid = secrets.token_urlsafe(12)
            session = self.sessions[sid] = Session(sid, env_id, env)
        return session

    def get(self, sid: str) -> Session:
        self.expire()
        with self._lock:
            session = self.sessions.get(sid)
        if session is None:
            raise HTTPException(404, f"no session {sid!r} (closed, expired after idling, or never created)")
        session.last_used = time.monotonic()
        return session

    def remove(self, sid: str) -> Session | None:
        with self._lock:
            return self.sessions.pop(sid, None)


def _close(env: Any) -> None:
    # closing a dead session must not fail the request that expired it
    with contextlib.suppress(Exception):
        env.close()


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
                _close(s.env)

    app = FastAPI(title="srpo env server", lifespan=lifespan)
    app.state.sessions = store
    served = allowed if allowed is not None else sorted(registry)
    if openenv_env_id is None and len(served) == 1:
        openenv_env_id = served[0]
    if openenv_env_id is not None and openenv_env_id not in served:
        raise ValueError(f"openenv_env_id {openenv_env_id!r} is not served; this server serves {served}")
    openenv = _OpenEnvRoutes(store, served, openenv_env_id, dict(openenv_env_kwargs or {}))
    app.add_api_websocket_route("/ws", openenv.websocket)

    @app.post("/reset")
    async def openenv_reset(req: OpenEnvReset | None = None) -> dict[str, Any]:
        try:
            return await openenv.http_reset(req or OpenEnvReset())
        except _EnvError as exc:
            raise HTTPException(exc.status, str(exc)) from None

    @app.post("/step")
    async def openenv_step(req: OpenEnvStep) -> dict[str, Any]:
        try:
            return await openenv.http_step(req)
        except _EnvError as exc:
            raise HTTPException(exc.status, str(exc)) from None

    @app.get("/state")
    async def openenv_state() -> dict[str, Any]:
        try:
            return await openenv.http_state()
        except _EnvError as exc:
            raise HTTPException(exc.status, str(exc)) from None

    @app.get("/schema")
    async def openenv_schema() -> dict[str, Any]:
        return {
            "action": OpenEnvAction.model_json_schema(),
            "observation": OpenEnvObservation.model_json_schema(),
            "state": OpenEnvState.model_json_schema(),
        }

    @app.get("/metadata")
    async def openenv_metadata() -> dict[str, Any]:
        return openenv.metadata()

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
        await run_in_threadpool(_close, session.env)
        return {"closed": sid}

    return app


# ---------------------------------------------------------------------------------------- OpenEnv
class OpenEnvAction(BaseModel):
    """One step's action in OpenEnv's payload: the text of every agent of the active set."""

    model_config = ConfigDict(extra="forbid")
    actions: dict[str, str] = Field(description="agent -> text; every agent of the active set must act")
    metadata: dict[str, Any] = Field(default_factory=dict, description="ignored by the env (OpenEnv's field)")


class OpenEnvObservation(BaseModel):
    """What OpenEnv's ``StepResult.observation`` holds for a multi-agent event env."""

    model_config = ConfigDict(extra="forbid")
    observations: dict[str, str] = Field(description="agent -> observation text (every live agent)")
    infos: dict[str, dict[str, Any]] = Field(description="agent -> the env's info dict")
    active_agents: list[str] = Field(description="the agents whose actions the next step consumes")
    agents: list[str] = Field(description="the agents still live (empty once the episode is over)")
    rewards: dict[str, float | None] = Field(description="agent -> reward of the step (empty after a reset)")
    terminations: dict[str, bool] = Field(default_factory=dict)
    truncations: dict[str, bool] = Field(default_factory=dict)


class OpenEnvState(BaseModel):
    """OpenEnv's ``State`` (``episode_id``, ``step_count``) with the env's multi-agent state."""

    model_config = ConfigDict(extra="forbid")
    episode_id: str | None = None
    step_count: int = 0
    env_id: str | None = None
    possible_agents: list[str] = Field(default_factory=list)
    agents: list[str] = Field(default_factory=list)
    active_agents: list[str] = Field(default_factory=list)
    state_text: str | None = None
    outcome: dict[str, Any] = Field(default_factory=dict)


class OpenEnvReset(BaseModel):
    """A reset's data (OpenEnv's ``seed`` and ``episode_id``; the env's ``options``; which env)."""

    model_config = ConfigDict(extra="forbid")
    seed: int | None = None
    episode_id: str | None = Field(default=None, max_length=255)
    options: dict[str, Any] | None = None
    env_id: str | None = None
    env_kwargs: dict[str, Any] | None = None


class OpenEnvStep(OpenEnvReset):
    """HTTP ``/step`` (stateless): the action plus the reset of the fresh env it is applied to."""

    action: OpenEnvAction
    timeout_s: float | None = Field(default=None, gt=0, description="accepted for OpenEnv, not enforced")
    request_id: str | None = Field(default=None, max_length=255)


def _openenv_result(
    env: Any, obs: dict[str, Any], infos: dict[str, Any], rewards: dict[str, Any] | None = None,
    terms: dict[str, Any] | None = None, truncs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """OpenEnv's ``{"observation", "reward", "done"}`` (``serialize_observation``'s shape) of one reset/step."""
    observation = OpenEnvObservation(
        observations=jsonable(obs),
        infos=jsonable(infos),
        active_agents=list(getattr(env, "active_agents", env.agents)),
        agents=list(env.agents),
        rewards=jsonable(rewards or {}),
        terminations=jsonable(terms or {}),
        truncations=jsonable(truncs or {}),
    )
    team = None if rewards is None else (sum(rewards.values()) / len(rewards) if rewards else 0.0)
    return {
        "observation": observation.model_dump(),
        "reward": None if team is None else jsonable(float(team)),
        "done": rewards is not None and not env.agents,
    }


def _openenv_state(env: Any, env_id: str | None, step_count: int, started: bool) -> dict[str, Any]:
    return OpenEnvState(
        episode_id=(getattr(env, "episode_id", None) or None) if started else None,
        step_count=step_count,
        env_id=env_id,
        possible_agents=list(env.possible_agents) if env is not None else [],
        agents=list(env.agents) if env is not None else [],
        active_agents=list(getattr(env, "active_agents", env.agents)) if started else [],
        state_text=jsonable(env.state()) if started else None,
        outcome=jsonable(getattr(env, "outcome", {})) if started else {},
    ).model_dump()


class _EnvError(Exception):
    """A request the env or the server refuses; ``code`` is OpenEnv's ``WSErrorCode`` name."""

    def __init__(self, message: str, code: str = "EXECUTION_ERROR", status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class _OpenEnvRoutes:
    """OpenEnv's ``/ws``, ``/reset``, ``/step``, ``/state``, ``/schema``, ``/metadata`` on an env server."""

    def __init__(
        self, store: SessionStore, served: list[str], default_env_id: str | None, default_env_kwargs: dict[str, Any]
    ) -> None:
        self.store = store
        self.served = served
        self.default_env_id = default_env_id
        self.default_env_kwargs = default_env_kwargs

    def _which(self, req: OpenEnvReset) -> tuple[str, dict[str, Any]]:
        env_id = req.env_id or self.default_env_id
        if env_id is None:
            raise _EnvError(
                f"name the env: reset(env_id=...) with one of {self.served} (or start the server with "
                "`srpo serve-env --openenv-env ID`)"
            )
        if env_id not in self.served:
            raise _EnvError(f"unknown env id {env_id!r}; this server serves {self.served}")
        if req.env_kwargs is not None:
            kwargs = dict(req.env_kwargs)
        else:
            kwargs = dict(self.default_env_kwargs) if env_id == self.default_env_id else {}
        return env_id, kwargs

    @staticmethod
    async def _build(env_id: str, kwargs: dict[str, Any]) -> Any:
        try:
            return await run_in_threadpool(make, env_id, **kwargs)
        except (TypeError, ValueError, KeyError) as exc:
            raise _EnvError(f"cannot build {env_id} with {kwargs}: {exc}", "FACTORY_ERROR") from None

    @staticmethod
    async def _reset(env: Any, req: OpenEnvReset) -> dict[str, Any]:
        options = dict(req.options or {})
        if req.episode_id is not None:
            options["episode_id"] = req.episode_id
        try:
            obs, infos = await run_in_threadpool(env.reset, seed=req.seed, options=options or None)
        except (TypeError, ValueError, KeyError) as exc:
            raise _EnvError(f"reset failed: {exc}") from None
        return _openenv_result(env, obs, infos)

    @staticmethod
    async def _step(env: Any, action: OpenEnvAction) -> dict[str, Any]:
        try:
            obs, rewards, terms, truncs, infos = await run_in_threadpool(env.step, action.actions)
        except (TypeError, ValueError, KeyError) as exc:
            raise _EnvError(f"bad action: {exc}") from None
        return _openenv_result(env, obs, infos, rewards, terms, truncs)

    # ------------------------------------------------------------ HTTP (stateless, as in OpenEnv)
    async def http_reset(self, req: OpenEnvReset) -> dict[str, Any]:
        env_id, kwargs = self._which(req)
        env = await self._build(env_id, kwargs)
        try:
            return await self._reset(env, req)
        finally:
            await run_in_threadpool(_close, env)

    async def http_step(self, req: OpenEnvStep) -> dict[str, Any]:
        env_id, kwargs = self._which(req)
        env = await self._build(env_id, kwargs)
        try:
            await self._reset(env, req)
            return await self._step(env, req.action)
        finally:
            await run_in_threadpool(_close, env)

    async def http_state(self) -> dict[str, Any]:
        if self.default_env_id is None:
            return _openenv_state(None, None, 0, False)
        env = await self._build(self.default_env_id, self.default_env_kwargs)
        try:
            return _openenv_state(env, self.default_env_id, 0, False)
        finally:
            await run_in_threadpool(_close, env)

    def metadata(self) -> dict[str, Any]:
        env_id = self.default_env_id
        return {
            "name": env_id or "srpo env server",
            "description": registry[env_id].description if env_id else f"srpo envs: {', '.join(self.served)}",
            "readme_content": None,
            "version": _version(),
            "author": None,
            "documentation_url": None,
        }

    # ------------------------------------------------------------ WebSocket (one env per connection)
    async def websocket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        conn = _WsSession(self)
        try:
            while True:
                frame = await websocket.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                raw = frame.get("text")
                if raw is None:  # a binary frame: the protocol is JSON text (RFC 6455 1003: unsupported data)
                    await websocket.close(code=1003, reason="binary frames are not accepted: send JSON text")
                    break
                if len(raw) > WS_MAX_MESSAGE_CHARS:  # RFC 6455 1009: message too big
                    await websocket.close(code=1009, reason=f"a message is at most {WS_MAX_MESSAGE_CHARS} characters")
                    break
                try:
                    reply = await conn.handle(raw)
                except _EnvError as exc:
                    reply = {"type": "error", "data": {"message": str(exc), "code": exc.code}}
                except ValidationError as exc:
                    reply = {
                        "type": "error",
                        "data": {
                            "message": f"invalid message: {_errors(exc)}",
                            "code": "VALIDATION_ERROR",
                            "errors": jsonable(exc.errors(include_url=False, include_context=False)),
                        },
                    }
                if reply is None:  # {"type": "close"}
                    break
                await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        except Exception as exc:  # noqa: BLE001 - a client's connection failing under us: one line, no traceback
            logger.info("env server /ws: connection ended: %s: %s", type(exc).__name__, str(exc)[:200])
        finally:
            conn.close()
            # already closed or gone (an abrupt disconnect): nothing to send, and nothing to log
            with contextlib.suppress(Exception):
                await websocket.close()


class _WsSession:
    """One WebSocket's env: built at its first reset (rebuilt when a reset names another env or kwargs)."""

    def __init__(self, routes: _OpenEnvRoutes) -> None:
        self.routes = routes
        self.session: Session | None = None
        self.kwargs: dict[str, Any] = {}
        self.started = False

    def _live(self) -> Session:
        if self.session is None:
            raise _EnvError("no episode: send a reset first")
        try:
            return self.routes.store.get(self.session.id)
        except HTTPException:
            self.session = None
            raise _EnvError(
                f"this socket's env was closed after idling {self.routes.store.idle_timeout_s:g}s; reset to start "
                "a new one", "SESSION_ERROR"
            ) from None

    async def handle(self, raw: str) -> dict[str, Any] | None:
        try:
            message = loads_bounded(raw, what="message")
        except (ValueError, RecursionError) as exc:  # malformed, too deep, or a number too long to convert
            raise _EnvError(f"invalid JSON: {str(exc)[:200]}", "INVALID_JSON") from None
        if not isinstance(message, dict):
            raise _EnvError(f"a message is a JSON object, got {type(message).__name__}", "INVALID_JSON")
        kind = message.get("type")
        data = message.get("data") or {}
        if kind == "close":
            return None
        if kind == "reset":
            return {"type": "observation", "data": await self.reset(OpenEnvReset.model_validate(data))}
        if kind == "step":
            action = OpenEnvAction.model_validate(data)
            session = self._live()
            async with session.lock:
                result = await self.routes._step(session.env, action)
                session.step_count += 1
                session.last_used = time.monotonic()
            return {"type": "observation", "data": result}
        if kind == "state":
            if self.session is None:
                return {"type": "state", "data": _openenv_state(None, self.routes.default_env_id, 0, False)}
            session = self._live()
            async with session.lock:
                state = await run_in_threadpool(
                    _openenv_state, session.env, session.env_id, session.step_count, self.started
                )
            return {"type": "state", "data": state}
        raise _EnvError(f"unknown message type {kind!r}; expected reset, step, state or close", "UNKNOWN_TYPE")

    async def reset(self, req: OpenEnvReset) -> dict[str, Any]:
        session = None
        if self.session is not None:
            with contextlib.suppress(_EnvError):
                session = self._live()
        if session is not None:  # a reset that names no env (or no kwargs) keeps the socket's
            req = req.model_copy()
            req.env_id = req.env_id or session.env_id
            if req.env_kwargs is None and req.env_id == session.env_id:
                req.env_kwargs = self.kwargs
        env_id, kwargs = self.routes._which(req)
        if session is None or session.env_id != env_id or kwargs != self.kwargs:
            env = await self.routes._build(env_id, kwargs)
            if session is None:
                try:
                    session = self.session = self.routes.store.add(env_id, env)
                except HTTPException as exc:
                    await run_in_threadpool(_close, env)
                    raise _EnvError(str(exc.detail), "CAPACITY_REACHED", exc.status_code) from None
            else:
                async with session.lock:
                    old, session.env, session.env_id = session.env, env, env_id
                await run_in_threadpool(_close, old)
            self.kwargs = kwargs
            self.started = False
        async with session.lock:
            result = await self.routes._reset(session.env, req)
            session.step_count = 0
            session.last_used = time.monotonic()
            self.started = True
        return result

    def close(self) -> None:
        if self.session is not None and self.routes.store.remove(self.session.id) is not None:
            _close(self.session.env)
        self.session = None


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}" for e in exc.errors())


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("srpo")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return None


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
