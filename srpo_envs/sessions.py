"""The env server's sessions: live envs by id, their locks and expiry, and JSON-safe values.

Shared by the native session API (:mod:`srpo_envs.env_server`) and the OpenEnv adapter
(:mod:`srpo_envs.openenv_server`): both hold their envs in one :class:`SessionStore`, so they count against
one ``max_sessions`` and expire the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException
from pydantic import ValidationError

DEFAULT_MAX_SESSIONS = 64
DEFAULT_IDLE_TIMEOUT_S = 600.0


def jsonable(obj: Any) -> Any:
    """A JSON-safe copy: tuples -> lists, non-finite floats -> None, unknown objects -> str.

    The client's :class:`~srpo_envs.remote.RemoteEnv` returns exactly this, so a local trajectory
    compares equal to a remote one after ``jsonable`` (``tests/srpo_envs/test_env_server.py``).
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


@dataclass
class Session:
    """One client's env: its own object, its own lock, the time it was last used."""

    id: str
    env_id: str
    env: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    step_count: int = 0


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
            close_env(s.env)
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


def close_env(env: Any) -> None:
    # closing a dead session must not fail the request that expired it
    with contextlib.suppress(Exception):
        env.close()


def validation_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}" for e in exc.errors())



def package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("srpo")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return None


