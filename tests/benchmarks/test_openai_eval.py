"""``bench eval`` with a served model: resume without re-asking the server, the CLI's files, demo."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from agents.openai_policy import OpenAIPolicy
from agents.policy import SamplingParams
from benchmarks.evaluate import evaluate
from tests._openai_standin import Interrupted, StandIn

fastapi = pytest.importorskip("fastapi")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=16)


def _eval(server: StandIn, cache: Path) -> object:
    policy = OpenAIPolicy(
        "tiny", "http://standin/v1", transport=server.transport(), backoff=0.0,
        cache_path=cache / "openai-responses.jsonl",
    )
    try:
        return evaluate(
            policy, "quick-math", "proposers-aggregator", 2, sampling=SAMPLING, limit=3, chunk_size=2,
            cache_dir=cache, progress=False,
        )
    finally:
        policy.close()


def test_interrupted_eval_resumes_without_asking_again(tmp_path) -> None:
    full_server = StandIn()
    full = _eval(full_server, tmp_path / "uninterrupted")
    total = len(full_server.bodies)
    assert max(full_server.answered().values()) == 1

    server = StandIn()
    server.interrupt_after = total * 5 // 8  # killed mid-way: inside a chunk (4 equal chunks), mid-episode
    with pytest.raises(Interrupted):
        _eval(server, tmp_path / "run")
    before = len(server.bodies)
    assert 0 < before < total
    server.interrupt_after = None
    resumed = _eval(server, tmp_path / "run")
    assert max(server.answered().values()) == 1, "a finished request was sent to the server twice"
    assert len(server.bodies) == total  # each request of the whole eval answered exactly once
    assert resumed.run_info["runtime"]["chunks_cached"] >= 1
    assert resumed.samples.drop(columns=[]).equals(full.samples)
    assert (resumed.table.fillna(-1) == full.table.fillna(-1)).all().all()


def _http_standin(server: StandIn):
    """The stand-in behind real HTTP on 127.0.0.1 (for the CLI, which builds its own client)."""
    from srpo_envs.env_server import serve_in_thread

    app = FastAPI()

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def any_path(path: str, request: Request) -> Response:
        r = await server.handle(httpx.Request(request.method, str(request.url), content=await request.body()))
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    return serve_in_thread(app)


def test_bench_eval_cli_with_a_served_model_writes_the_usual_files(tmp_path) -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    server = StandIn(model="tiny-served")
    srv = _http_standin(server)
    out = tmp_path / "eval"
    args = ["bench", "eval", "--model", "openai:", "--base-url", f"{srv.url}/v1", "--suite", "quick-math",
            "--k", "2", "--limit", "2", "--out", str(out), "--no-progress", "--algorithm", "served-baseline"]
    try:
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        asked = len(server.bodies)
        again = CliRunner().invoke(app, args)
        assert again.exit_code == 0, again.output
    finally:
        srv.stop()
    assert len(server.bodies) == asked  # the rerun came from the cache
    for name in ("eval.json", "eval_samples.parquet", "eval_samples.csv", "record.json"):
        assert (out / name).is_file(), name
    info = json.loads((out / "eval.json").read_text())
    text = json.dumps(info)
    assert "openai|" in text and "tiny-served" in text  # the server's model name keys the cache
    assert f"{srv.url}/v1" in text
    record = json.loads((out / "record.json").read_text())
    assert "served-baseline" in json.dumps(record)


def test_bench_eval_openai_model_needs_a_base_url() -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    result = CliRunner().invoke(app, ["bench", "eval", "--model", "openai:m", "--suite", "quick-math"])
    assert result.exit_code == 2 and "--base-url" in result.output


@pytest.mark.parametrize("vllm", [True, False])
def test_demo_with_a_served_model(vllm: bool) -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    server = StandIn(vllm=vllm)
    srv = _http_standin(server)
    try:
        result = CliRunner().invoke(
            app, ["demo", "--model", "openai:tiny", "--base-url", f"{srv.url}/v1", "--env", "ProcArith-v0",
                  "--episodes", "2"],
        )
    finally:
        srv.stop()
    assert result.exit_code == 0, result.output
    assert "## step 0" in result.output and "The answer is" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("ProcArith-v0 [proposers-aggregator] model=openai:tiny: ")
    assert ("trainable" in last) == vllm and ("evaluation only: the server returned no token ids" in last) != vllm


def test_demo_with_a_local_model(tiny_model_dir: Path) -> None:
    from typer.testing import CliRunner

    from srpo_cli.app import app

    result = CliRunner().invoke(
        app, ["demo", "--model", str(tiny_model_dir), "--env", "ProcArith-v0", "--episodes", "1",
              "--max-new-tokens", "8", "--json"],
    )
    assert result.exit_code == 0, result.output
    # the model's loading bar (stderr, mixed in by the runner) may share a line with the first event
    events = [json.loads(line[line.index('{"'):]) for line in result.output.splitlines() if '{"' in line]
    assert events and events[0]["step"] == 0
    assert "1 correct; rows trainable (exact ids + log-probs)" in result.output
