"""``RemoteEnv``: a PettingZoo ``ParallelEnv`` whose env lives in an ``srpo serve-env`` session.

Code written against a local env (``srpo_envs.make(id)``) runs unchanged against a server: the same
``reset``/``step`` tuple, ``agents``/``possible_agents``, the event's ``active_agents``, ``state()`` (the
shared state text) and the same text spaces (:class:`~srpo_envs.spaces.UnicodeText` with the server
env's length limits), so PettingZoo's ``parallel_api_test`` and ``parallel_seed_test`` pass against it
(``tests/srpo_envs/test_env_server.py``). Values come back through JSON (:func:`srpo_envs.env_server.jsonable`:
tuples become lists, non-finite floats ``None``). A 4xx answer raises ``ValueError`` with the server's
reason (what the local env would raise for the same bad action); connection failures, 5xx answers and
answers that are not JSON raise :class:`EnvServerError` (a ``ConnectionError`` and an external-service
failure: ``srpo`` exits with its own status, naming the server). The session is created on construction
and deleted by :meth:`close`.
"""

from __future__ import annotations

from typing import Any

from pettingzoo import ParallelEnv

from srpo_common.errors import ExternalServiceError
from srpo_envs.spaces import TextSpaces


class EnvServerError(ExternalServiceError, ConnectionError):
    """The env server was unreachable, failed (5xx) or answered something that is not JSON."""

    service = "the env server"
    default_hint = "check that `srpo serve-env` is running at that URL (its log), then rerun"


class RemoteEnv(TextSpaces, ParallelEnv):
    """One server session as a ParallelEnv.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8100``.
        env_id: a registered env id the server serves.
        env_kwargs: keyword arguments for the server's ``make(env_id, **env_kwargs)`` (JSON values).
        timeout: seconds per HTTP request.
        client: an ``httpx.Client`` to use instead of a new one (e.g. starlette's ``TestClient``).
    """

    metadata: dict[str, Any] = {"name": "srpo_remote_env", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        base_url: str,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        timeout: float = 60.0,
        client: Any = None,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.env_id = env_id
        self._own_client = client is None
        self._http = client if client is not None else httpx.Client(timeout=timeout)
        info = self._call("POST", "/sessions", {"env_id": env_id, "env_kwargs": dict(env_kwargs or {})})
        self.session_id: str = info["session_id"]
        self.possible_agents: list[str] = list(info["possible_agents"])
        self.max_obs_chars = int(info["max_obs_chars"])
        self.max_action_chars = int(info["max_action_chars"])
        self.roles: dict[str, str] = dict(info.get("roles") or {})
        self.agents: list[str] = []
        self._active: list[str] = []
        self._closed = False

    # ------------------------------------------------------------------ HTTP
    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        url = f"{self.base_url}{path}"
        try:
            resp = self._http.request(method, url, json=body)
        except httpx.HTTPError as exc:
            raise EnvServerError(f"{method} {url}: {type(exc).__name__}: {exc}", url=url) from None
        if 400 <= resp.status_code < 500:
            raise ValueError(f"{self.env_id} server: {_detail(resp)}")
        if resp.status_code >= 500:
            raise EnvServerError(f"{method} {url}: {_detail(resp)}", url=url, status=resp.status_code)
        try:
            return resp.json()
        except ValueError as exc:
            raise EnvServerError(
                f"{method} {url}: the answer is not JSON ({exc})", url=url, status=resp.status_code
            ) from None

    # ------------------------------------------------------------------ API
    @property
    def active_agents(self) -> tuple[str, ...]:
        """The active set of the next event (empty once the episode is over)."""
        return tuple(self._active)

    def role_of(self, agent: str) -> str:
        return self.roles.get(agent, agent)

    def _take(self, observation: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        self.agents = list(observation["agents"])
        self._active = list(observation["active_agents"])
        return observation["observations"], observation["infos"]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        data = self._call("POST", f"/sessions/{self.session_id}/reset", {"seed": seed, "options": options})
        return self._take(data["observation"])

    def step(self, actions: dict[str, Any]):
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict agent -> text, got {type(actions).__name__}")
        data = self._call(
            "POST", f"/sessions/{self.session_id}/step", {"action": {"actions": {str(a): v for a, v in actions.items()}}}
        )
        obs, infos = self._take(data["observation"])
        return obs, data["rewards"], data["terminations"], data["truncations"], infos

    def state(self) -> str:
        return self.state_info()["state_text"]

    def state_info(self) -> dict[str, Any]:
        """The server's ``GET /state``: episode id, step count, agents, active set, state text, outcome."""
        return self._call("GET", f"/sessions/{self.session_id}/state")

    @property
    def outcome(self) -> dict[str, Any]:
        return self.state_info()["outcome"]

    def render(self) -> str:
        return self.state()

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._call("DELETE", f"/sessions/{self.session_id}")
        except (ValueError, ConnectionError):
            pass  # already expired, or the server is gone: nothing left to free
        finally:
            if self._own_client:
                self._http.close()


def _detail(resp: Any) -> str:
    try:
        data = resp.json()
        detail = data.get("detail", data) if isinstance(data, dict) else data
    except ValueError:
        detail = resp.text
    return f"HTTP {resp.status_code} {detail}"


__all__ = ["EnvServerError", "RemoteEnv"]
