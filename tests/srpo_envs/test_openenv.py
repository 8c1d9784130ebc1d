"""``srpo serve-env`` speaks OpenEnv's wire protocol: openenv-core's own ``GenericEnvClient`` plays our envs.

The client is openenv-core 0.3.0's (the ``openenv`` extra): it opens ``/ws`` and sends ``reset`` / ``step``
/ ``state`` / ``close`` messages; every step's payload is compared with the same env stepped in-process,
so a wrong mapping (a dropped agent, a stale active set, per-agent rewards lost) fails here.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openenv")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

import srpo_envs  # noqa: E402
from srpo_envs.env_server import WS_MAX_MESSAGE_CHARS, create_app, jsonable, serve_in_thread  # noqa: E402
from srpo_envs.remote import RemoteEnv  # noqa: E402

SERVED = ["MathVerify-v0", "MathVerify-Routed-v0", "MathVerify-SolverVerifier-v0"]
KWARGS = {"n_proposers": 2}


@pytest.fixture(scope="module")
def server():
    srv = serve_in_thread(create_app(env_ids=SERVED, openenv_env_id="MathVerify-v0", max_sessions=8))
    yield srv
    srv.stop()


def _client(url: str):
    return GenericEnvClient(base_url=url, message_timeout_s=60).sync()


def _check_against_local(result, local_step: tuple | None, local_env) -> None:
    """The OpenEnv payload carries exactly what the in-process env returned for the same calls."""
    obs = result.observation
    if local_step is None:  # a reset
        assert result.reward is None and result.done is False and obs["rewards"] == {}
    else:
        local_obs, rewards, terms, truncs, infos = local_step
        assert obs["observations"] == jsonable(local_obs) and obs["infos"] == jsonable(infos)
        assert obs["rewards"] == jsonable(rewards) and obs["terminations"] == terms and obs["truncations"] == truncs
        assert result.reward == pytest.approx(sum(rewards.values()) / len(rewards), abs=1e-12)
    assert obs["active_agents"] == list(local_env.active_agents) and obs["agents"] == list(local_env.agents)
    assert result.done is (local_step is not None and not local_env.agents)


def _play(env, local, actions_of, label: str) -> list:
    """Step both until the episode ends; ``actions_of(active_set)`` -> the fixed actions; prints the transcript."""
    results = []
    result = None
    while result is None or not result.done:
        active = list(local.active_agents)
        actions = actions_of(active)
        result = env.step({"actions": actions})
        _check_against_local(result, local.step(actions), local)
        results.append(result)
        print(
            f"{label} step {len(results)}: actions {actions} -> reward {result.reward} rewards "
            f"{result.observation['rewards']} next active {result.observation['active_agents']} done {result.done}"
        )
    return results


def test_openenv_client_plays_a_math_verification_episode_to_its_end(server) -> None:
    local = srpo_envs.make("MathVerify-v0", **KWARGS)
    with _client(server.url) as env:
        first = env.reset(seed=0, env_kwargs=KWARGS)
        local.reset(seed=0)
        _check_against_local(first, None, local)
        assert first.observation["active_agents"] == ["proposer_0", "proposer_1"]  # one event, two members
        print(f"reset seed=0: active {first.observation['active_agents']} agents {first.observation['agents']}")
        wrong = _play(env, local, lambda active: {a: "\\boxed{1}" for a in active}, "wrong")
        state = env.state()
        gold = state["outcome"]["gold"]
        assert [r.observation["active_agents"] for r in wrong] == [["aggregator"], []]
        assert wrong[-1].reward == 0.0 and state["outcome"]["correct"] is False and state["step_count"] == 2
        assert state["episode_id"] == local.episode_id and state["state_text"] == local.state()
        print(f"state: episode {state['episode_id']} steps {state['step_count']} outcome {state['outcome']}")

        with pytest.raises(RuntimeError, match="finished episode"):  # the env's own reason
            env.step({"actions": {"aggregator": "x"}})

        again = env.reset(seed=0)  # same socket, same env and kwargs: the same problem again
        local.reset(seed=0)
        _check_against_local(again, None, local)
        assert again.observation["observations"] == first.observation["observations"]
        with pytest.raises(RuntimeError, match=r"missing actions for active agents \['proposer_1'\]"):
            env.step({"actions": {"proposer_0": "\\boxed{2}"}})
        answers = {"proposer_0": "\\boxed{2}", "proposer_1": f"\\boxed{{{gold}}}", "aggregator": f"\\boxed{{{gold}}}"}
        right = _play(env, local, lambda active: {a: answers[a] for a in active}, "right")
        assert right[-1].reward == 1.0 and right[-1].observation["rewards"] == {a: 1.0 for a in answers}
        assert env.state()["outcome"]["correct"] is True


def test_active_sets_of_routed_and_solver_verifier_workflows(server) -> None:
    with _client(server.url) as env:
        # the router's choice sets the next event's members: 2 of 3 proposers
        r = env.reset(seed=3, env_id="MathVerify-Routed-v0")
        local = srpo_envs.make("MathVerify-Routed-v0")
        local.reset(seed=3)
        _check_against_local(r, None, local)
        assert r.observation["active_agents"] == ["router"]
        routed = _play(
            env, local, lambda active: {a: "\\boxed{2}" for a in active}, "routed"
        )
        assert [x.observation["active_agents"] for x in routed] == [["proposer_0", "proposer_1"], ["aggregator"], []]
        env.reset(seed=3, env_id="MathVerify-Routed-v0")
        with pytest.raises(RuntimeError, match="not live"):
            env.step({"actions": {"router": "\\boxed{1}", "intruder": "hi"}})

        # another env on the same socket: the reset rebuilds it; reject -> revise -> verify
        r = env.reset(seed=1, env_id="MathVerify-SolverVerifier-v0")
        local = srpo_envs.make("MathVerify-SolverVerifier-v0")
        local.reset(seed=1)
        _check_against_local(r, None, local)
        verdicts = iter(["\\boxed{reject}", "\\boxed{accept}"])
        sv = _play(
            env, local, lambda active: {a: next(verdicts) if a == "verifier" else "\\boxed{5}" for a in active}, "sv"
        )
        assert [x.observation["active_agents"] for x in sv] == [["verifier"], ["solver"], ["verifier"], []]
        assert env.state()["env_id"] == "MathVerify-SolverVerifier-v0"


def test_bad_messages_get_openenv_errors(server) -> None:
    with _client(server.url) as env:
        with pytest.raises(RuntimeError, match="no episode: send a reset first.*EXECUTION_ERROR"):
            env.step({"actions": {"proposer_0": "x"}})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.reset(sed=0)  # a typo is refused, not dropped
        with pytest.raises(RuntimeError, match="unknown env id 'Nope-v0'"):
            env.reset(env_id="Nope-v0")
        with pytest.raises(RuntimeError, match="FACTORY_ERROR"):
            env.reset(env_kwargs={"no_such_kwarg": 1})
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"proposer_0": "an action that is not in an actions dict"})
        assert env.state()["step_count"] == 0  # refused messages change nothing


def test_websocket_sessions_share_the_session_limit_and_expire() -> None:
    srv = serve_in_thread(create_app(env_ids=["ProcArith-v0"], max_sessions=1, idle_timeout_s=0.5, sweep_s=0.05))
    try:
        remote = RemoteEnv(srv.url, "ProcArith-v0")  # the session API holds the only slot
        with _client(srv.url) as env:
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                env.reset(seed=0)
            remote.close()
            env.reset(seed=0)  # the only served env is the default
            assert httpx.get(f"{srv.url}/health").json()["sessions"] == 1
            time.sleep(1.0)
            with pytest.raises(RuntimeError, match="closed after idling.*SESSION_ERROR"):
                env.step({"actions": {"proposer_0": "x"}})
            assert env.reset(seed=0).observation["active_agents"]  # a reset starts a new one
        deadline = time.monotonic() + 10
        while httpx.get(f"{srv.url}/health").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the socket's close frees its env
        assert httpx.get(f"{srv.url}/health").json()["sessions"] == 0
    finally:
        srv.stop()


def test_openenv_http_endpoints() -> None:
    with TestClient(create_app(env_ids=SERVED, openenv_env_id="MathVerify-v0")) as client:
        assert client.get("/health").json()["status"] == "healthy"
        schema = client.get("/schema").json()
        assert set(schema) == {"action", "observation", "state"}
        assert schema["action"]["properties"]["actions"]["type"] == "object"
        assert {"active_agents", "rewards", "observations"} <= set(schema["observation"]["properties"])
        meta = client.get("/metadata").json()
        assert meta["name"] == "MathVerify-v0" and meta["description"]
        state = client.get("/state").json()
        assert state["step_count"] == 0 and state["possible_agents"][-1] == "aggregator"

        # stateless, as OpenEnv's HTTP routes: a fresh env per request
        local = srpo_envs.make("MathVerify-v0", **KWARGS)
        obs, infos = local.reset(seed=5)
        r = client.post("/reset", json={"seed": 5, "env_kwargs": KWARGS}).json()
        assert r["observation"]["observations"] == jsonable(obs) and r["reward"] is None and r["done"] is False
        actions = {"proposer_0": "\\boxed{1}", "proposer_1": "\\boxed{2}"}
        lobs, rewards, *_ = local.step(actions)
        s = client.post("/step", json={"seed": 5, "env_kwargs": KWARGS, "action": {"actions": actions}}).json()
        assert s["observation"]["observations"] == jsonable(lobs) and s["observation"]["rewards"] == rewards
        assert s["observation"]["active_agents"] == ["aggregator"] and s["done"] is False
        routed = client.post("/reset", json={"seed": 0, "env_id": "MathVerify-Routed-v0"}).json()
        assert routed["observation"]["active_agents"] == ["router"]

        bad = client.post("/step", json={"seed": 5, "action": {"actions": {"proposer_0": "x"}}})
        assert bad.status_code == 400 and "missing actions for active agents" in bad.json()["detail"]
        assert client.post("/step", json={"action": {"actions": "no"}}).status_code == 422
        assert client.post("/reset", json={"env_id": "ProcArith-v0"}).status_code == 400  # not served
        assert client.post("/reset", json={"sed": 1}).status_code == 422
    with TestClient(create_app()) as client:  # every env served, none named: the reason says how
        r = client.post("/reset", json={})
        assert r.status_code == 400 and "name the env" in r.json()["detail"]
    with pytest.raises(ValueError, match="is not served"):
        create_app(env_ids=["ProcArith-v0"], openenv_env_id="MathVerify-v0")


def test_ws_answers_every_bad_frame_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A binary frame closes with 1003, an oversized one with 1009; deep JSON and a 5000-digit integer get
    an error frame and the socket stays usable; none of them logs a traceback."""
    from starlette.websockets import WebSocketDisconnect

    client = TestClient(create_app(env_ids=["MathVerify-v0"]))
    caplog.set_level("DEBUG")
    with client.websocket_connect("/ws") as ws:
        ws.send_bytes(b"\x00\x01")
        with pytest.raises(WebSocketDisconnect) as info:
            ws.receive_text()
        assert info.value.code == 1003
    with client.websocket_connect("/ws") as ws:
        ws.send_text(" " * (WS_MAX_MESSAGE_CHARS + 1))
        with pytest.raises(WebSocketDisconnect) as info:
            ws.receive_text()
        assert info.value.code == 1009
    with client.websocket_connect("/ws") as ws:
        for bad in ("[" * 100_000 + "]" * 100_000, '{"type": "reset", "data": {"seed": ' + "9" * 5000 + "}}"):
            ws.send_text(bad)
            reply = ws.receive_json()
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
        ws.send_text('{"type": "reset", "data": {"seed": 0}}')
        assert ws.receive_json()["type"] == "observation"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_an_abrupt_disconnect_logs_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """A client that drops the TCP connection mid-session (no close frame, a reply in flight): uvicorn's
    log (its own handler on stderr) holds no traceback."""
    import asyncio

    import websockets

    # a server of its own, started under this capture: uvicorn's log handler binds stderr when it starts
    server = serve_in_thread(create_app(env_ids=["MathVerify-v0"]))

    async def drop() -> None:
        url = server.url.replace("http://", "ws://") + "/ws"
        idle = await websockets.connect(url)
        idle.transport.abort()  # gone at once: no close frame, the server is waiting for a message
        ws = await websockets.connect(url)
        await ws.send('{"type": "reset", "data": {"seed": 0}}')
        await ws.recv()
        ws.transport.abort()  # gone mid-session

    try:
        for _ in range(5):
            asyncio.run(drop())
        time.sleep(1.0)  # let the server notice and clean up
    finally:
        server.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err[-3000:]
