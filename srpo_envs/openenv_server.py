"""The OpenEnv adapter of the env server: OpenEnv's wire protocol over the same sessions.

OpenEnv clients (openenv-core's ``GenericEnvClient``, as ``tests/srpo_envs/test_openenv.py`` uses it) open ``/ws``
and send ``reset`` / ``step`` / ``state`` / ``close`` messages, or use the HTTP ``/reset``, ``/step``,
``/state``, ``/schema`` and ``/metadata`` routes; :func:`add_openenv_routes` puts them on an app built by
:func:`srpo_envs.env_server.create_app`. One WebSocket holds one env, a session of the server's
:class:`~srpo_envs.sessions.SessionStore`. Every frame gets an answer: a bad message an error frame, a
binary frame a 1003 close, a message over :data:`WS_MAX_MESSAGE_CHARS` a 1009 close; a client that drops
its connection leaves no traceback in the server's log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from srpo_common.jsonsafe import loads_bounded
from srpo_envs.registry import make, registry
from srpo_envs.sessions import Session, SessionStore, close_env, jsonable, package_version, validation_errors

#: The longest ``/ws`` text message (characters): an observation request is a few KB; past this the socket
#: closes with 1009 (message too big) before the text is parsed.
WS_MAX_MESSAGE_CHARS = 1 << 20
logger = logging.getLogger("srpo.env_server")


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
            await run_in_threadpool(close_env, env)

    async def http_step(self, req: OpenEnvStep) -> dict[str, Any]:
        env_id, kwargs = self._which(req)
        env = await self._build(env_id, kwargs)
        try:
            await self._reset(env, req)
            return await self._step(env, req.action)
        finally:
            await run_in_threadpool(close_env, env)

    async def http_state(self) -> dict[str, Any]:
        if self.default_env_id is None:
            return _openenv_state(None, None, 0, False)
        env = await self._build(self.default_env_id, self.default_env_kwargs)
        try:
            return _openenv_state(env, self.default_env_id, 0, False)
        finally:
            await run_in_threadpool(close_env, env)

    def metadata(self) -> dict[str, Any]:
        env_id = self.default_env_id
        return {
            "name": env_id or "srpo env server",
            "description": registry[env_id].description if env_id else f"srpo envs: {', '.join(self.served)}",
            "readme_content": None,
            "version": package_version(),
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
                            "message": f"invalid message: {validation_errors(exc)}",
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
                    await run_in_threadpool(close_env, env)
                    raise _EnvError(str(exc.detail), "CAPACITY_REACHED", exc.status_code) from None
            else:
                async with session.lock:
                    old, session.env, session.env_id = session.env, env, env_id
                await run_in_threadpool(close_env, old)
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
            close_env(self.session.env)
        self.session = None



def add_openenv_routes(
    app: FastAPI, store: SessionStore, served: list[str], openenv_env_id: str | None, openenv_env_kwargs: dict[str, Any]
) -> None:
    """Put OpenEnv's ``/ws``, ``/reset``, ``/step``, ``/state``, ``/schema`` and ``/metadata`` on ``app``;
    ``openenv_env_id`` / ``openenv_env_kwargs``: the env a reset that names none gets."""
    openenv = _OpenEnvRoutes(store, served, openenv_env_id, dict(openenv_env_kwargs))
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



__all__ = ["WS_MAX_MESSAGE_CHARS", "OpenEnvAction", "OpenEnvObservation", "OpenEnvState", "add_openenv_routes"]
