"""OpenAIPolicy against a stand-in server: parsing, retries, clear errors, the key, the response cache."""

from __future__ import annotations

import logging

import pytest

from agents.openai_policy import OpenAIPolicy, OpenAIServerError, openai_policy_map, parse_base_urls
from agents.policy import GenerationRequest, SamplingParams
from tests._openai_standin import EOS, Interrupted, StandIn, _ids


def _policy(server: StandIn, **kw) -> OpenAIPolicy:
    kw.setdefault("backoff", 0.0)
    return OpenAIPolicy("tiny", "http://standin/v1", transport=server.transport(), **kw)


def _chat(i: int = 0, seed: int | None = 7) -> GenerationRequest:
    return GenerationRequest(
        f"solver_{i}", "solver", [{"role": "user", "content": f"2+{i}?"}], SamplingParams(0.7, seed=seed)
    )


def test_vllm_answers_give_exact_ids_and_logprobs_for_chat_and_completions() -> None:
    server = StandIn()
    pol = _policy(server)
    text_req = GenerationRequest("a", "solver", "1+1=", SamplingParams(0.0, max_new_tokens=9, stop=("\n",)))
    ids_req = GenerationRequest("a", "solver", "", SamplingParams(1.0), prompt_ids=[5, 6, 7])
    chat, text, ids = pol.generate([_chat(), text_req, ids_req])
    for g in (chat, text, ids):
        assert g.evaluation_only is None
        assert g.token_ids == [*_ids(g.text), EOS]
        assert len(g.logprobs) == len(g.token_ids) and all(lp < 0 for lp in g.logprobs)
        assert g.finish_reason == "stop" and g.stop_reason == EOS
    assert ids.prompt_ids == [5, 6, 7]
    assert text.prompt_ids == _ids("1+1=")
    sent = [eval_body for eval_body in server.bodies]
    assert any('"logprobs": true' in b and '"top_logprobs": 0' in b for b in sent)  # chat
    assert any('"logprobs": 0' in b and '"stop": ["\\n"]' in b and '"temperature": 0.0' in b for b in sent)
    assert all('"return_token_ids": true' in b and '"include_stop_str_in_output": true' in b for b in sent)
    pol.close()


def test_plain_openai_server_rows_are_evaluation_only_with_the_reason() -> None:
    server = StandIn(vllm=False)
    pol = _policy(server)
    (g,) = pol.generate([_chat()])
    assert pol.vllm_fields is False  # the 400 naming return_token_ids switched them off for good
    assert g.text.startswith("The answer is")
    assert g.evaluation_only is not None and "no token ids" in g.evaluation_only
    assert g.token_ids == [] and g.logprobs == []
    assert all("return_token_ids" not in b for b in server.bodies)
    pol.close()


@pytest.mark.parametrize("failure", ["429", "500", "timeout", "malformed"])
def test_transient_failures_are_retried(failure: str) -> None:
    server = StandIn(sleep_s=2.0)
    server.failures = [failure, failure]
    pol = _policy(server, timeout=0.3, max_retries=3)
    (g,) = pol.generate([_chat()])
    assert g.evaluation_only is None and g.token_ids
    assert pol.stats["retries"] == 2 and pol.stats["requests"] == 3
    assert len(server.bodies) == 1
    pol.close()


@pytest.mark.parametrize("failure", ["429", "500", "timeout", "malformed"])
def test_persistent_failures_end_in_one_clear_error(failure: str) -> None:
    server = StandIn(sleep_s=2.0)
    server.failures = [failure] * 3
    pol = _policy(server, timeout=0.3, max_retries=2)
    expected = {"429": "HTTP 429 rate limited", "500": "HTTP 500 engine died", "timeout": "timed out after 0.3s",
                "malformed": "malformed JSON"}[failure]
    with pytest.raises(OpenAIServerError, match="gave up after 3 attempts") as info:
        pol.generate([_chat()])
    assert expected in str(info.value) and "\n" not in str(info.value)
    pol.close()


def test_a_bad_request_is_not_retried_and_says_why() -> None:
    server = StandIn()
    server.failures = ["bad-request"]
    pol = _policy(server, max_retries=3)
    with pytest.raises(OpenAIServerError, match="HTTP 400 max_tokens must be at least 1"):
        pol.generate([_chat()])
    assert pol.stats["requests"] == 1
    pol.close()


def test_an_answer_without_choices_is_a_clear_error() -> None:
    import httpx

    pol = OpenAIPolicy("m", "http://x/v1", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"x": 1})))
    with pytest.raises(OpenAIServerError, match="unexpected answer layout: KeyError"):
        pol.generate([_chat()])
    pol.close()


def test_api_key_comes_from_the_env_var_and_is_never_shown(monkeypatch, caplog) -> None:
    secret = "sk-test-very-secret-123"
    monkeypatch.setenv("MY_KEY", secret)
    server = StandIn()
    server.failures = ["500", "bad-request"]
    pol = _policy(server, api_key_env="MY_KEY", max_retries=1)
    with caplog.at_level(logging.DEBUG), pytest.raises(OpenAIServerError) as info:
        pol.generate([_chat()])
    assert server.auth == [f"Bearer {secret}", f"Bearer {secret}"]
    shown = str(info.value) + repr(pol) + caplog.text + pol.eval_cache_key
    assert secret not in shown
    pol.close()


def test_model_name_from_the_server_when_not_given() -> None:
    server = StandIn(model="served-name")
    pol = OpenAIPolicy(None, "http://standin/v1", transport=server.transport())
    pol.generate([_chat()])
    assert pol.model == "served-name" and '"model": "served-name"' in server.bodies[0]
    pol.close()


def test_bounded_concurrency() -> None:
    import asyncio

    import httpx

    inner = StandIn()
    live = {"now": 0, "max": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        await asyncio.sleep(0.02)
        live["now"] -= 1
        return await inner.handle(request)

    pol = OpenAIPolicy("tiny", "http://x/v1", transport=httpx.MockTransport(handler), max_concurrency=3)
    gens = pol.generate([_chat(i) for i in range(12)])
    assert len(gens) == 12 and live["max"] == 3
    pol.close()


def test_response_cache_answers_repeats_without_the_server(tmp_path) -> None:
    server = StandIn()
    cache = tmp_path / "responses.jsonl"
    pol = _policy(server, cache_path=cache)
    first = pol.generate([_chat(0), _chat(1)])
    pol.close()
    with cache.open("a") as fh:
        fh.write('{"key": "cut')  # a write cut by a crash is skipped, not fatal
    again = _policy(server, cache_path=cache)
    second = again.generate([_chat(0), _chat(1), _chat(2)])
    assert [g.token_ids for g in second[:2]] == [g.token_ids for g in first]
    assert again.stats["cache_hits"] == 2 and len(server.bodies) == 3
    assert max(server.answered().values()) == 1
    again.close()


def test_an_interrupt_is_not_retried() -> None:
    server = StandIn()
    server.failures = ["interrupt"]
    pol = _policy(server, max_retries=3)
    with pytest.raises(Interrupted):
        pol.generate([_chat()])
    assert pol.stats["requests"] == 1
    pol.close()


def test_policy_map_one_endpoint_per_role() -> None:
    urls = parse_base_urls(["solver=http://a:1/v1", "verifier=http://b:2/v1", "http://c:3/v1"])
    assert urls == {"solver": "http://a:1/v1", "verifier": "http://b:2/v1", "*": "http://c:3/v1"}
    pmap = openai_policy_map("m", urls)
    assert pmap["solver"].base_url == "http://a:1/v1" and pmap["verifier"].base_url == "http://b:2/v1"
    assert pmap["aggregator"].base_url == "http://c:3/v1"
    assert parse_base_urls(["http://c:3/v1"]) == "http://c:3/v1"
    with pytest.raises(ValueError, match="given twice"):
        parse_base_urls(["http://a/v1", "http://b/v1"])
    with pytest.raises(ValueError, match="http"):
        OpenAIPolicy("m", "localhost:8000")


def test_requests_name_the_neutral_sampling_set_unless_the_user_chooses() -> None:
    import json

    server = StandIn()
    pol = _policy(server)
    pol.generate([_chat()])
    (body,) = [json.loads(b) for b in server.bodies]
    # a stock vLLM fills every field a request leaves out from generation_config (Qwen2.5: top_k=20)
    assert {k: body[k] for k in ("top_k", "min_p", "repetition_penalty", "min_tokens")} == {
        "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
    }  # fmt: skip
    assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    pol.close()
    chosen = StandIn()
    pol = _policy(chosen, extra_body={"top_k": 20, "repetition_penalty": 1.05})
    pol.generate([_chat()])
    (body,) = [json.loads(b) for b in chosen.bodies]
    assert body["top_k"] == 20 and body["repetition_penalty"] == 1.05 and body["min_p"] == 0.0
    pol.close()
    plain = StandIn(vllm=False)  # a strict OpenAI server: vLLM's extension fields go with the others
    pol = _policy(plain)
    pol.generate([_chat()])
    (body,) = [json.loads(b) for b in plain.bodies]
    assert "top_k" not in body and "min_p" not in body and body["presence_penalty"] == 0.0
    pol.close()
