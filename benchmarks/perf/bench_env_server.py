"""Env server throughput: env steps/second over HTTP (``srpo serve-env``) against the same env in-process.

    python -m benchmarks.perf.bench_env_server [--env ProcArith-v0] [--sessions 1,8,32] [--steps 200] [--openenv]

Each session is a :class:`srpo_envs.remote.RemoteEnv` on a thread of its own (one client each, as separate
trainers or agent processes would be) talking to one in-process uvicorn server on 127.0.0.1; every live
agent sends a fixed answer each step. Prints steps/s and the mean latency of one step per session count.
``--openenv`` adds the same runs through OpenEnv's WebSocket protocol (``/ws``), each session one
openenv-core ``GenericEnvClient`` (the ``openenv`` extra).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import srpo_envs
from srpo_envs.env_server import create_app, serve_in_thread
from srpo_envs.remote import RemoteEnv


def _run(env, steps: int, seed: int) -> int:
    env.reset(seed=seed)
    for i in range(steps):
        if not env.agents:
            env.reset(seed=seed * 1000 + i)
        env.step({a: "\\boxed{1}" for a in env.agents})
    return steps


def _run_openenv(url: str, env_id: str, steps: int, seed: int) -> int:
    """``_run`` through OpenEnv's client: one WebSocket, the multi-agent action in ``{"actions": ...}``."""
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(seed=seed, env_id=env_id)
        for i in range(steps):
            if result.done:
                result = env.reset(seed=seed * 1000 + i)
            result = env.step({"actions": {a: "\\boxed{1}" for a in result.observation["agents"]}})
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ProcArith-v0")
    parser.add_argument("--sessions", default="1,8,32")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--openenv", action="store_true", help="also over OpenEnv's /ws (openenv-core's client)")
    args = parser.parse_args()
    start = time.perf_counter()
    _run(srpo_envs.make(args.env), args.steps, 0)
    local = args.steps / (time.perf_counter() - start)
    print(f"{args.env}: in-process {local:,.0f} steps/s (one env)")
    if args.openenv:
        import openenv.core.generic_client  # noqa: F401  (its import takes seconds: not inside the timing)
    server = serve_in_thread(create_app(max_sessions=max(int(n) for n in args.sessions.split(","))))
    try:
        for n in (int(x) for x in args.sessions.split(",")):
            envs = [RemoteEnv(server.url, args.env) for _ in range(n)]
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=n) as pool:
                total = sum(pool.map(lambda ie: _run(ie[1], args.steps, ie[0]), enumerate(envs)))
            elapsed = time.perf_counter() - start
            print(
                f"{n:3d} sessions x {args.steps} steps over HTTP: {total / elapsed:,.0f} steps/s, "
                f"{1000 * elapsed * n / total:.1f} ms per step per session, {elapsed:.1f}s"
            )
            for env in envs:
                env.close()
            if args.openenv:
                start = time.perf_counter()
                with ThreadPoolExecutor(max_workers=n) as pool:
                    total = sum(pool.map(lambda i: _run_openenv(server.url, args.env, args.steps, i), range(n)))
                elapsed = time.perf_counter() - start
                print(
                    f"{n:3d} sessions x {args.steps} steps over OpenEnv /ws: {total / elapsed:,.0f} steps/s, "
                    f"{1000 * elapsed * n / total:.1f} ms per step per session, {elapsed:.1f}s"
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
