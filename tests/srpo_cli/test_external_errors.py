"""Issue 52 point 3: a failing external service is named, with its own exit status, never called our bug.

``srpo bench eval --model openai:x --base-url URL`` against a stand-in server answering HTTP 500, 429 with
``Retry-After`` or malformed JSON exits 5 with one line naming the server's URL, the status and what to do
(before: exit 70, "internal error: OpenAIServerError ... report it"). The retrieval and env clients raise
the same :class:`srpo_common.errors.ExternalServiceError` family; our own bugs still exit 70.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from srpo_cli.app import EXIT_CODES, classify, main
from srpo_common.errors import ExternalServiceError, retry_after_seconds
from tests._openai_standin import StandIn

pytest.importorskip("fastapi")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

EXTERNAL = 5


def _http_standin(server: StandIn):
    """The stand-in behind real HTTP on 127.0.0.1 (the CLI builds its own client), headers included."""
    from srpo_envs.env_server import serve_in_thread

    app = FastAPI()

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def any_path(path: str, request: Request) -> Response:
        r = await server.handle(httpx.Request(request.method, str(request.url), content=await request.body()))
        headers = {k: v for k, v in r.headers.items() if k.lower() == "retry-after"}
        return Response(r.content, status_code=r.status_code, media_type="application/json", headers=headers)

    return serve_in_thread(app)


def _srpo(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``srpo ARGS`` through the real entry point and its error boundary: (exit status, stderr)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    _, err = capsys.readouterr()
    return int(info.value.code or 0), err


def _eval_against_failing_server(
    failure: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """``srpo bench eval`` against a stand-in whose every completion request fails with ``failure``
    (GET /models answers): (exit code, stderr, the server's API root)."""
    server = StandIn(model="x")
    server.failures = [failure] * 100
    srv = _http_standin(server)
    url = f"{srv.url}/v1"
    try:
        code, err = _srpo(
            ["bench", "eval", "--model", "openai:x", "--base-url", url, "--suite", "quick-math", "--k", "1",
             "--limit", "1", "--out", str(tmp_path / "eval"), "--no-progress"],
            capsys,
        )  # fmt: skip
    finally:
        srv.stop()
    return code, err, url


@pytest.mark.slow  # five attempts with the CLI's backoff: ~8 s each
@pytest.mark.parametrize(
    ("failure", "says"),
    [
        ("500", "HTTP 500 engine died"),
        ("429", "HTTP 429 rate limited"),
        ("malformed", "malformed JSON in a 200 answer"),
    ],
)
def test_bench_eval_names_a_failing_server_with_its_own_exit_status(
    failure: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, url = _eval_against_failing_server(failure, tmp_path, capsys)
    last = err.strip().splitlines()[-1]
    assert code == EXTERNAL, err
    assert last.startswith(f"error: the OpenAI-compatible server at {url}/"), last
    assert says in last and "gave up after 5 attempts" in last
    assert "internal error" not in err and "report it" not in err and "Traceback" not in err
    assert "check that server" in last  # what to do
    if failure != "malformed":
        assert f"(HTTP {failure})" in last


def test_a_retry_after_longer_than_the_client_waits_stops_at_once_and_says_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.perf_counter()
    code, err, _ = _eval_against_failing_server("429:120", tmp_path, capsys)
    last = err.strip().splitlines()[-1]
    assert code == EXTERNAL, err
    assert "retry after 120s (Retry-After)" in last and "rerun in 120s or more" in last, last
    assert time.perf_counter() - t0 < 60  # did not hammer the server nor sleep the 120 s through


def test_retry_after_within_the_budget_is_waited_for() -> None:
    from agents.openai_policy import OpenAIPolicy
    from agents.policy import GenerationRequest, SamplingParams

    server = StandIn(model="x")
    server.failures = ["429:1"]
    policy = OpenAIPolicy("x", "http://standin/v1", transport=server.transport(), backoff=0.0)
    try:
        t0 = time.perf_counter()
        (gen,) = policy.generate([GenerationRequest("a0", "solver", "2+2?", SamplingParams(max_new_tokens=4))])
        waited = time.perf_counter() - t0
    finally:
        policy.close()
    assert gen.text and policy.stats["retries"] == 1
    assert waited >= 1.0  # backoff 0, so only Retry-After made it wait


def test_retry_after_header_forms() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    from email.utils import formatdate

    assert 50 < retry_after_seconds(formatdate(time.time() + 60, usegmt=True)) <= 60  # an HTTP date


def test_retrieval_server_failures_are_external_and_name_the_url() -> None:
    from srpo_envs.retrievers.remote import RemoteRetriever, RemoteRetrieverError

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="index loading")

    client = httpx.Client(transport=httpx.MockTransport(handler))
    remote = RemoteRetriever("http://retriever:8000", retries=1, backoff=0.0, client=client)
    with pytest.raises(RemoteRetrieverError) as info:
        remote.search(["q"], 1)
    exc = info.value
    assert isinstance(exc, ExternalServiceError) and exc.status == 503
    code, line = classify(exc)
    assert code == EXTERNAL
    assert line.startswith("error: the retrieval server at http://retriever:8000/retrieve failed (HTTP 503)")
    assert "index loading" in line and "check that server" in line

    def malformed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"{not json")

    remote = RemoteRetriever(
        "http://retriever:8000", retries=0, client=httpx.Client(transport=httpx.MockTransport(malformed))
    )
    with pytest.raises(RemoteRetrieverError, match="malformed response"):
        remote.search(["q"], 1)

    def later(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, text="busy", headers={"retry-after": "300"})

    remote = RemoteRetriever("http://retriever:8000", retries=3, client=httpx.Client(transport=httpx.MockTransport(later)))
    t0 = time.perf_counter()
    with pytest.raises(RemoteRetrieverError, match=r"retry after 300s \(Retry-After\)") as info:
        remote.search(["q"], 1)
    assert time.perf_counter() - t0 < 5 and info.value.status == 429  # stopped at once, no 300 s sleep
    assert "rerun in 300s or more" in classify(info.value)[1]


def test_env_server_failures_are_external_and_name_the_url() -> None:
    from srpo_envs.remote import EnvServerError, RemoteEnv

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, json={"detail": "bad gateway"})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with pytest.raises(EnvServerError) as info:
        RemoteEnv("http://envs:8100", "ProcArith-v0", client=client)
    exc = info.value
    assert isinstance(exc, ConnectionError)  # what callers caught before
    code, line = classify(exc)  # a ConnectionError is an OSError: it used to read "the system failed" (4)
    assert code == EXTERNAL
    assert line.startswith("error: the env server at http://envs:8100/sessions failed (HTTP 502)")
    assert "srpo serve-env" in line

    def not_json(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"<html>proxy login</html>")

    with pytest.raises(EnvServerError, match="not JSON"):
        RemoteEnv("http://envs:8100", "ProcArith-v0", client=httpx.Client(transport=httpx.MockTransport(not_json)))


def test_our_own_bugs_are_still_internal_errors_and_the_table_has_the_new_status() -> None:
    code, line = classify(KeyError("oops"))
    assert code == 70 and "report it" in line
    assert EXTERNAL in EXIT_CODES and "external service" in EXIT_CODES[EXTERNAL]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "| 5 | an external service failed" in readme


def test_the_exit_status_table_names_classes_that_exist() -> None:
    """The boundary matches exceptions by (module, name) so that it imports nothing a command did not;
    each pair must name a real class, or moving one (learners.checkpoint's NonFiniteError went to
    learners.state_check) would silently turn its exit status into a crash's."""
    import importlib

    from srpo_cli import app

    for module, name in (*app.INPUT_ERRORS, app.NONFINITE_ERROR):
        cls = getattr(importlib.import_module(module), name, None)
        assert isinstance(cls, type) and issubclass(cls, BaseException), f"{module}.{name} is no exception class"
