"""``srpo serve-env`` + ``RemoteEnv``: PettingZoo's tests over HTTP, 4xx reasons, limits, isolation."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from pettingzoo.test import parallel_api_test, parallel_seed_test  # noqa: E402

import srpo_envs  # noqa: E402
from srpo_envs.env_server import create_app, jsonable, serve_in_thread  # noqa: E402
from srpo_envs.remote import RemoteEnv  # noqa: E402

ENV = "ProcArith-v0"
TEXTS = ["\\boxed{1}", "\\boxed{2}", "no answer", "", "\\boxed{accept}", "x" * 50, "\\boxed{17}"]


@pytest.fixture(scope="module")
def server():
    srv = serve_in_thread(create_app(max_sessions=64))
    yield srv
    srv.stop()


@pytest.mark.parametrize("env_id", ["ProcArith-v0", "MathVerify-SolverVerifier-v0", "MathVerify-Routed-v0"])
def test_pettingzoo_api_and_seed_tests_over_http(server, env_id: str) -> None:
    env = RemoteEnv(server.url, env_id)
    parallel_api_test(env, num_cycles=60)
    env.close()
    made: list[RemoteEnv] = []

    def factory() -> RemoteEnv:
        made.append(RemoteEnv(server.url, env_id))
        return made[-1]

    parallel_seed_test(factory)
    for e in made:
        e.close()


def _trajectory(env, seed: int, steps: int) -> list:
    """``steps`` steps of seeded random texts (every live agent acts), resetting finished episodes."""
    rng = random.Random(seed)
    out = []
    obs, infos = env.reset(seed=seed)
    out.append(("reset", jsonable(obs), jsonable(infos), list(env.active_agents)))
    for i in range(steps):
        if not env.agents:
            obs, infos = env.reset(seed=seed * 1000 + i)
            out.append(("reset", jsonable(obs), jsonable(infos), list(env.active_agents)))
        actions = {a: rng.choice(TEXTS) for a in env.agents}
        result = env.step(actions)
        out.append(("step", *(jsonable(x) for x in result), list(env.active_agents), env.state()))
    return out


@pytest.mark.slow  # ~45 s on 2 shared cores
def test_32_concurrent_sessions_match_local_trajectories(server) -> None:
    sessions, steps = 32, 200
    envs = [RemoteEnv(server.url, ENV) for _ in range(sessions)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=sessions) as pool:
        remote = list(pool.map(lambda ie: _trajectory(ie[1], ie[0], steps), enumerate(envs)))
    elapsed = time.monotonic() - started
    for i, traj in enumerate(remote):
        assert traj == _trajectory(srpo_envs.make(ENV), i, steps), f"session {i} diverged from its local run"
    assert len({str(t) for t in remote}) == sessions  # different seeds, different trajectories
    for env in envs:
        env.close()
    print(f"{sessions} sessions x {steps} steps over HTTP: {elapsed:.1f}s")


def test_bad_requests_get_4xx_with_the_reason() -> None:
    with TestClient(create_app(max_sessions=2)) as client:
        with pytest.raises(ValueError, match=r"400 unknown env id 'Nope-v0'"):
            RemoteEnv("http://testserver", "Nope-v0", client=client)
        with pytest.raises(ValueError, match="400 cannot build ProcArith-v0"):
            RemoteEnv("http://testserver", ENV, {"no_such_kwarg": 1}, client=client)
        env = RemoteEnv("http://testserver", ENV, client=client)
        env.reset(seed=0)
        with pytest.raises(ValueError, match="400 bad action: actions for agents that are not live"):
            env.step({"intruder": "hi"})
        active = env.active_agents
        with pytest.raises(ValueError, match="missing actions for active agents"):
            env.step({})
        assert env.active_agents == active  # a refused step changes nothing
        r = client.post(f"/sessions/{env.session_id}/step", json={"action": {"actions": "not a dict"}})
        assert r.status_code == 422
        r = client.post(f"/sessions/{env.session_id}/step", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        while env.agents:
            env.step({a: "\\boxed{1}" for a in env.agents})
        with pytest.raises(ValueError, match="finished episode"):
            env.step({})
        r = client.get("/sessions/nope/state")
        assert r.status_code == 404 and "no session" in r.json()["detail"]
        env.close()


def test_session_limit_and_idle_expiry() -> None:
    app = create_app(max_sessions=2, idle_timeout_s=0.3, sweep_s=0.05)
    with TestClient(app) as client:
        a = RemoteEnv("http://testserver", ENV, client=client)
        b = RemoteEnv("http://testserver", ENV, client=client)
        r = client.post("/sessions", json={"env_id": ENV})
        assert r.status_code == 503 and "limit" in r.json()["detail"] and r.headers["retry-after"] == "1"
        a.close()  # a slot frees at once
        c = RemoteEnv("http://testserver", ENV, client=client)
        time.sleep(0.6)
        with pytest.raises(ValueError, match="404 no session"):
            b.reset(seed=0)
        assert client.get("/health").json()["sessions"] == 0
        c.close()


def test_sessions_share_nothing() -> None:
    with TestClient(create_app()) as client:
        a = RemoteEnv("http://testserver", ENV, client=client)
        b = RemoteEnv("http://testserver", ENV, client=client)
        a.reset(seed=1)
        b.reset(seed=2)
        state_b = b.state()
        while a.agents:
            a.step({x: "\\boxed{3}" for x in a.agents})
        assert b.state() == state_b and b.agents  # a's whole episode left b untouched
        assert a.outcome and not b.outcome
        a.close()
        b.close()


def test_serve_env_cli_refuses_unknown_env_ids() -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    result = CliRunner().invoke(app, ["serve-env", "--env", "Nope-v0"])
    assert result.exit_code == 2 and "unknown env ids ['Nope-v0']" in result.output
