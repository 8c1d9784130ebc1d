"""A policy served over the OpenAI-compatible HTTP API (vLLM, SGLang, hosted APIs): any LLM plays the envs.

:class:`OpenAIPolicy` implements :class:`agents.policy.Policy` by posting each request to
``{base_url}/chat/completions`` (chat messages) or ``{base_url}/completions`` (raw text or prompt ids),
all requests of a ``generate`` call concurrently (``max_concurrency`` in flight, one ``httpx.AsyncClient``
on a private event loop thread, so ``generate`` works the same from plain code, Ray actors or a
notebook whose loop is already running). One policy talks to one endpoint; :func:`openai_policy_map`
gives each role its own endpoint (or shares one).

Failures: 408/409/425/429/5xx answers, connection errors, timeouts (``timeout`` seconds for the whole
request, not just per socket read) and a 200 whose body is not JSON are retried ``max_retries`` times
with exponential backoff and jitter, never sooner than a ``Retry-After`` asks (one longer than
``max_backoff`` stops at once, saying when to rerun); anything else (a 400 naming a bad argument, a 401, a
body without ``choices``) is one :class:`OpenAIServerError` line with the status and the server's message
(an external-service failure: ``srpo`` exits with its own status, naming the server). The API key is read from the environment variable
``api_key_env`` (default ``OPENAI_API_KEY``) and only ever placed in the ``Authorization`` header: it
is in no message, ``repr``, log line or cache key.

RL-grade rows from vLLM. Re-tokenising returned text does not give the sampled ids back (rLLM and verl
document the drift), so against a vLLM server the policy asks for the exact ids and the behaviour
log-probs of the sampled tokens: ``return_token_ids`` (response ``token_ids`` and
``prompt_token_ids``), ``return_tokens_as_token_ids`` (log-prob tokens spelled ``token_id:N``, a second
source of the ids that is cross-checked) and ``logprobs`` (completions: ``logprobs=0``, the sampled
token only; chat: ``logprobs=true, top_logprobs=0``); ``include_stop_str_in_output`` keeps text and
ids ending at the same place (the :class:`~agents.policy.Generation` contract). vLLM returns *raw*
log-probs by default (before temperature); start the server with ``--logprobs-mode processed_logprobs``
so they follow :mod:`agents.policy`'s convention ``log_softmax(logits / T)`` (with ``top_p = 1``). A
learner still recomputes ``pi_old`` and applies truncated importance sampling (``srpo train --backend
openai``), exactly as for the in-process vLLM engine, so the server's numerics only enter through the
TIS weights. Against a server that returns no token ids (OpenAI itself, most others) every
:class:`~agents.policy.Generation` carries ``evaluation_only`` = the reason, its ``token_ids`` are the
local tokenizer's re-tokenisation of the text (empty without a ``tokenizer``) and its log-probs NaN:
fine for evaluation tables, refused by training.

Sampling. Every request names the whole sampling set, not just temperature and top_p: the neutral
values (:data:`NEUTRAL_SAMPLING`: no presence/frequency penalty; :data:`NEUTRAL_VLLM_SAMPLING`:
``top_k=-1``, ``min_p=0``, ``repetition_penalty=1``, ``min_tokens=0``) unless ``extra_body`` chooses
others, because a server fills what a request leaves out from the model's generation config.
``srpo train --backend openai`` also checks the outcome before training (:mod:`learners.served`).

Prompts. With ``api="auto"`` chat messages go to the chat endpoint (the server applies the model's
chat template, as :func:`agents.hf.encode_request` does in-process) and text or ``prompt_ids`` go to
completions. With a local ``tokenizer`` every request is tokenised here with
:func:`agents.hf.encode_request` and sent to completions as ids: the prompt ids are then bit-identical
to the in-process backends'.

Resume. With ``cache_path`` every successful response is appended to a JSON-lines file keyed by the
sha256 of (endpoint, request body); a later identical request (same prompt, sampling and seed: the
collector derives seeds from the episode, never from timing) is answered from the file without asking
the server. ``srpo bench eval --model openai:NAME`` puts it in the eval cache, so an interrupted eval
resumes with no duplicate request even for the samples of the chunk it was in the middle of.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import random
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agents.policy import Generation, GenerationRequest, PolicyMap
from srpo_common.errors import ExternalServiceError, retry_after_seconds

log = logging.getLogger(__name__)

Api = Literal["auto", "chat", "completions"]

#: Statuses worth another try: rate limits, timeouts, conflicts and server errors.
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: vLLM's additions to the OpenAI request; sent unless ``vllm_fields=False`` (or a 400 names one of them).
VLLM_FIELDS = (
    "return_token_ids",
    "return_tokens_as_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "ignore_eos",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
)
#: The neutral sampling set every request carries unless ``extra_body`` chooses otherwise. A stock
#: ``vllm serve`` fills each field a request leaves out from the model's ``generation_config.json``
#: (Qwen2.5-Instruct: ``top_k=20``, ``repetition_penalty=1.05``), so a request that names only
#: temperature and top_p is sampled from a truncated, penalised distribution while a learner assumes
#: ``softmax(logits / T)``. OpenAI's own penalty fields go to every server; vLLM's extension fields
#: (also in :data:`VLLM_FIELDS`) only while ``vllm_fields`` is not False.
NEUTRAL_SAMPLING: dict[str, Any] = {"presence_penalty": 0.0, "frequency_penalty": 0.0}
NEUTRAL_VLLM_SAMPLING: dict[str, Any] = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0}
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
#: How ``srpo bench eval`` / ``srpo demo`` spell a served model: ``openai:NAME``.
MODEL_PREFIX = "openai:"


class OpenAIServerError(ExternalServiceError):
    """The server refused a request, or kept failing past the retries (one line: status and reason).

    An :class:`~srpo_common.errors.ExternalServiceError`: ``srpo`` exits with the external-service status
    and names the server, not "internal error"."""

    service = "the OpenAI-compatible server"
    default_hint = (
        "check that server (its log, its load, the model it serves) and --base-url, then rerun "
        "(an eval resumes from its response cache)"
    )


@dataclass(frozen=True)
class _Attempt:
    """One answered HTTP attempt: retry it (``retry``), or its JSON ``data`` / final ``error``."""

    data: dict[str, Any] | None = None
    retry: str | None = None
    retry_after: float | None = None
    error: str | None = None
    status: int | None = None  # the HTTP status of the answer, when there was one


def parse_model_spec(spec: str) -> str | None:
    """``openai:NAME`` -> ``NAME`` (``""`` for ``openai:``: the server's only model); anything else -> None."""
    if not spec.startswith(MODEL_PREFIX):
        return None
    return spec[len(MODEL_PREFIX) :]


class _LoopThread:
    """A private asyncio loop on a daemon thread: sync callers submit coroutines to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="openai-policy", daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


class OpenAIPolicy:
    """A :class:`agents.policy.Policy` on an OpenAI-compatible server (see the module docstring).

    Args:
        model: the served model name (vLLM: ``--served-model-name``, default the path it serves);
            ``None``/``""``: the only model ``GET {base_url}/models`` lists.
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        api: ``auto`` (chat messages -> chat, text/ids -> completions), ``chat`` or ``completions``.
        api_key_env: environment variable holding the API key (none set: no ``Authorization`` header).
        max_concurrency: requests in flight at once.
        timeout: seconds one attempt may take in total (connect, queue, generate, read).
        max_retries / backoff / max_backoff: retries of retryable failures, first delay, longest delay.
        tokenizer: a tokenizer or its path: tokenise prompts here and send ids (exact prompt ids), and
            count tokens of servers that return no ids.
        vllm_fields: send vLLM's token-id/log-prob fields (``None``: send them, and stop for good when a
            400 answer names one of them, as strict OpenAI servers do).
        cache_path: JSON-lines response cache (resume without re-asking); ``None``: no cache.
        policy_version: the version rows record (the learner bumps it after weight pushes).
        transport: an ``httpx`` transport (tests: ``httpx.MockTransport``).
        extra_body: more fields for every request body, sent last: they replace the neutral sampling set
            (:data:`NEUTRAL_SAMPLING`, :data:`NEUTRAL_VLLM_SAMPLING`), e.g. ``{"top_k": 20}`` to sample
            as the model card recommends (a learner's probe then sees a distribution it does not assume).
    """

    def __init__(
        self,
        model: str | None = None,
        base_url: str = "http://127.0.0.1:8000/v1",
        *,
        api: Api = "auto",
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        tokenizer: Any = None,
        vllm_fields: bool | None = None,
        cache_path: str | os.PathLike[str] | None = None,
        policy_version: int = 0,
        transport: Any = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if api not in ("auto", "chat", "completions"):
            raise ValueError(f"api must be auto, chat or completions, got {api!r}")
        if max_concurrency < 1 or max_retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0, timeout > 0 and backoff >= 0 are required")
        if not re.match(r"^https?://", base_url):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model or None
        self.api: Api = api
        self.api_key_env = api_key_env
        self._api_key = os.environ.get(api_key_env) or None
        self.max_concurrency = int(max_concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        if isinstance(tokenizer, str | os.PathLike):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        self.vllm_fields = vllm_fields
        self.policy_version = policy_version
        self.extra_body = dict(extra_body or {})
        self._transport = transport
        self._client: Any = None
        self._sem: asyncio.Semaphore | None = None
        self._runner: _LoopThread | None = None
        self._rng = random.Random(0)  # backoff jitter only; never affects samples
        #: requests sent (attempts), retries, answers served from the cache
        self.stats = {"requests": 0, "retries": 0, "cache_hits": 0}
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._cache: dict[str, dict[str, Any]] = self._load_cache() if self.cache_path else {}
        self._cache_lock = threading.Lock()

    def __repr__(self) -> str:  # never the key
        return f"OpenAIPolicy(model={self.model!r}, base_url={self.base_url!r}, api={self.api!r})"

    # ------------------------------------------------------------------ identity
    @property
    def eval_cache_key(self) -> str:
        """What the eval cache keys a served model's samples by (no key material)."""
        return f"openai|{self.base_url}|{self.model}|{self.api}|ids={self.tokenizer is not None}"

    # ------------------------------------------------------------------ lifecycle
    def _loop(self) -> _LoopThread:
        if self._runner is None or not self._runner.thread.is_alive():
            self._client = self._sem = None  # bound to a loop that is gone (e.g. a view closed it)
            self._runner = _LoopThread()
            weakref.finalize(self, self._runner.stop)
        return self._runner

    def close(self) -> None:
        """Close the HTTP client and stop the loop thread (a later ``generate`` starts them again)."""
        if self._runner is None:
            return
        if self._client is not None:
            self._runner.submit(self._client.aclose()).result(timeout=10)
            self._client = None
        self._runner.stop()
        self._runner = None
        self._sem = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def _ensure_client(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                transport=self._transport,
                timeout=httpx.Timeout(self.timeout),
                limits=httpx.Limits(max_connections=self.max_concurrency),
                headers=self._headers(),
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return self._client

    def _run(self, coro: Any) -> Any:
        return self._loop().submit(coro).result()

    # ------------------------------------------------------------------ HTTP
    async def _attempt(
        self, method: str, url: str, body: dict[str, Any] | None, expect_json: bool = True
    ) -> _Attempt:
        import httpx

        client = await self._ensure_client()
        self.stats["requests"] += 1
        try:
            call = client.post(url, json=body) if method == "POST" else client.get(url)
            resp = await asyncio.wait_for(call, timeout=self.timeout)
        except (TimeoutError, httpx.TimeoutException):
            return _Attempt(retry=f"timed out after {self.timeout:g}s")
        except httpx.TransportError as exc:
            return _Attempt(retry=f"{type(exc).__name__}: {exc}")
        status = resp.status_code
        if status in RETRY_STATUSES:
            wait = retry_after_seconds(resp.headers.get("retry-after"))
            return _Attempt(retry=f"HTTP {status} {_server_message(resp)}", retry_after=wait, status=status)
        if status >= 400:
            return _Attempt(error=f"HTTP {status} {_server_message(resp)}", status=status)
        if not expect_json:  # vLLM's adapter routes answer 200 with a plain-text sentence
            return _Attempt(data={"status": resp.status_code, "text": resp.text[:300]})
        try:
            data = resp.json()
        except ValueError as exc:
            return _Attempt(retry=f"malformed JSON in a {status} answer ({exc})", status=status)
        if not isinstance(data, dict):
            return _Attempt(retry=f"the answer is JSON {type(data).__name__}, not an object", status=status)
        return _Attempt(data=data)

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, expect_json: bool = True
    ) -> dict[str, Any]:
        """One logical request with retries; the answer's JSON object or :class:`OpenAIServerError`."""
        url = f"{self.base_url}{path}"
        last = ""
        status: int | None = None
        for attempt in range(self.max_retries + 1):
            await self._ensure_client()
            assert self._sem is not None
            async with self._sem:
                result = await self._attempt(method, url, body, expect_json)
            if result.data is not None:
                return result.data
            if result.error is not None:
                raise OpenAIServerError(f"{method} {url}: {result.error}", url=url, status=result.status)
            last, status = result.retry or "failed", result.status
            if attempt == self.max_retries:
                break
            if result.retry_after is not None and result.retry_after > self.max_backoff:
                # asking again sooner than the server said would only be refused again: stop, and say when
                raise OpenAIServerError(
                    f"{method} {url}: {last}; the server asks to retry after {result.retry_after:g}s "
                    f"(Retry-After), longer than this client waits ({self.max_backoff:g}s)",
                    url=url,
                    status=status,
                    hint=f"rerun in {math.ceil(result.retry_after)}s or more (an eval resumes from its cache)",
                )
            self.stats["retries"] += 1
            delay = min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + 0.5 * self._rng.random())
            if result.retry_after is not None:  # never sooner than the server asked (within max_backoff)
                delay = max(delay, result.retry_after)
            log.warning("%s %s: %s; retry %d/%d in %.2fs", method, url, last, attempt + 1, self.max_retries, delay)
            await asyncio.sleep(delay)
        raise OpenAIServerError(
            f"{method} {url}: gave up after {self.max_retries + 1} attempts: {last}", url=url, status=status
        )

    # ------------------------------------------------------------------ model name
    async def _resolve_model(self) -> str:
        if self.model:
            return self.model
        data = await self._call("GET", "/models")
        cards = [m for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
        ids = [str(m["id"]) for m in cards if not m.get("parent")]  # vLLM lists LoRA adapters with a parent
        if len(ids) != 1:
            raise OpenAIServerError(
                f"GET {self.base_url}/models lists {ids or 'no models'}: name one with openai:NAME / model=",
                url=f"{self.base_url}/models",
                hint="name the model with --model openai:NAME",
            )
        self.model = ids[0]
        return self.model

    def resolve_model(self) -> str:
        """The served model name (asks ``GET /models`` when none was given): call it before the eval cache
        key is taken, so the key names the model actually served."""
        return self._run(self._resolve_model())

    def check_server(self) -> str:
        """Ask ``GET /models`` once: the server answers and serves this policy's model (a server without that
        route is taken at its word). Returns the model name."""

        async def check() -> str:
            try:
                data = await self._call("GET", "/models")
            except OpenAIServerError as exc:
                if " 404 " in str(exc) and self.model:
                    return self.model
                raise
            ids = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
            if self.model and ids and self.model not in ids:
                raise OpenAIServerError(
                    f"{self.base_url} serves {ids}, not {self.model!r}",
                    url=self.base_url,
                    hint=f"name one of {ids} with --model openai:NAME, or point --base-url at the right server",
                )
            return await self._resolve_model()

        return self._run(check())

    # ------------------------------------------------------------------ requests
    def _endpoint(self, request: GenerationRequest) -> str:
        if self.api == "chat":
            if request.prompt_ids is not None:
                raise ValueError("prompt_ids need api='completions' (the chat endpoint takes messages)")
            return "chat"
        if self.api == "completions" or self.tokenizer is not None:
            return "completions"
        return "chat" if request.prompt_ids is None and not isinstance(request.prompt, str) else "completions"

    def _body(self, request: GenerationRequest, endpoint: str, model: str) -> dict[str, Any]:
        sp = request.sampling
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": sp.max_new_tokens,
            "temperature": max(sp.temperature, 0.0),
            "top_p": sp.top_p,
            "n": 1,
            **NEUTRAL_SAMPLING,
        }
        if sp.seed is not None:
            body["seed"] = int(sp.seed)
        if sp.stop:
            body["stop"] = list(sp.stop)
        if endpoint == "chat":
            prompt = request.prompt
            body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            body.update(logprobs=True, top_logprobs=0)
        else:
            body["prompt"] = self._completion_prompt(request)
            body["logprobs"] = 0
        if self.vllm_fields is not False:
            body.update(
                return_token_ids=True,
                return_tokens_as_token_ids=True,
                include_stop_str_in_output=True,
                skip_special_tokens=True,
                **NEUTRAL_VLLM_SAMPLING,
            )
            if sp.ignore_eos:
                body["ignore_eos"] = True
        body.update(self.extra_body)
        return body

    def _completion_prompt(self, request: GenerationRequest) -> str | list[int]:
        if request.prompt_ids is not None:
            return [int(i) for i in request.prompt_ids]
        if self.tokenizer is not None:
            from agents.hf import encode_request

            return encode_request(self.tokenizer, request)
        if isinstance(request.prompt, str):
            return request.prompt
        from agents.hf import render_chat

        return render_chat(None, request.prompt)  # no template here: a plain role transcript

    def _cache_key(self, endpoint: str, body: dict[str, Any]) -> str:
        material = json.dumps({"base_url": self.base_url, "endpoint": endpoint, "body": body}, sort_keys=True)
        return hashlib.sha256(material.encode("utf-8")).hexdigest()

    async def _one(self, request: GenerationRequest) -> Generation:
        model = await self._resolve_model()
        endpoint = self._endpoint(request)
        body = self._body(request, endpoint, model)
        key = self._cache_key(endpoint, body)
        data = self._cache.get(key)
        if data is not None:
            self.stats["cache_hits"] += 1
        else:
            path = "/chat/completions" if endpoint == "chat" else "/completions"
            try:
                data = await self._call("POST", path, body)
            except OpenAIServerError as exc:
                sent_fields = any(f in body for f in VLLM_FIELDS)  # concurrent requests may all hit this
                if (
                    self.vllm_fields is not True
                    and sent_fields
                    and " 400 " in str(exc)
                    and any(f in str(exc) for f in VLLM_FIELDS)
                ):
                    if self.vllm_fields is None:
                        log.warning("%s rejects vLLM's fields; sending plain OpenAI requests", self.base_url)
                    self.vllm_fields = False
                    return await self._one(request)
                raise
            self._store(key, data)
        try:
            return self._parse(request, endpoint, body, data)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise OpenAIServerError(
                f"POST {self.base_url} ({endpoint}): unexpected answer layout: {type(exc).__name__}: {exc}",
                url=self.base_url,
                hint="is --base-url an OpenAI-compatible API root (.../v1)? check that server's version and log",
            ) from None

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """The async form of :meth:`generate` (on this policy's loop: call it through :meth:`generate`)."""
        await self._ensure_client()
        tasks = [asyncio.ensure_future(self._one(r)) for r in requests]
        # Every request runs to its end even when another fails: answers already on their way are then
        # in the response cache, so a rerun after the failure asks for none of them again.
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)  # type: ignore[arg-type]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One :class:`Generation` per request, in request order (all sent concurrently)."""
        if not requests:
            return []
        return self._run(self.agenerate(list(requests)))

    # ------------------------------------------------------------------ parsing
    def _parse(
        self, request: GenerationRequest, endpoint: str, body: dict[str, Any], data: dict[str, Any]
    ) -> Generation:
        choice = data["choices"][0]
        if endpoint == "chat":
            text = (choice.get("message") or {}).get("content") or ""
            prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
            content = (choice.get("logprobs") or {}).get("content") or []
            lp_tokens = [c.get("token") for c in content]
            lp_values = [c.get("logprob") for c in content]
        else:
            text = choice.get("text") or ""
            prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
            lps = choice.get("logprobs") or {}
            lp_tokens = list(lps.get("tokens") or [])
            lp_values = list(lps.get("token_logprobs") or [])
        if prompt_ids is None and isinstance(body.get("prompt"), list):
            prompt_ids = body["prompt"]  # the ids sent are the ids the model saw
        ids_from_lp = [_token_id(t) for t in lp_tokens]
        token_ids = choice.get("token_ids")
        reason: str | None = None
        if token_ids is None and lp_tokens and all(i is not None for i in ids_from_lp):
            token_ids = ids_from_lp
        if token_ids is not None:
            token_ids = [int(t) for t in token_ids]
            if lp_tokens and all(i is not None for i in ids_from_lp) and ids_from_lp != token_ids:
                raise ValueError("token_ids and the log-prob tokens (token_id:N) name different tokens")
        if token_ids is None:
            reason = (
                "the server returned no token ids (not a vLLM server with return_token_ids): its text cannot "
                "be mapped back to the sampled ids without re-tokenising, which drifts"
            )
        elif prompt_ids is None:
            reason = "the server returned no prompt_token_ids: the prompt the model saw is unknown"
        elif len(lp_values) != len(token_ids) or any(
            not isinstance(v, int | float) or not math.isfinite(v) for v in lp_values
        ):
            reason = (
                f"the server returned {len(lp_values)} finite behaviour log-probs for {len(token_ids)} tokens"
            )
        if reason is not None:
            if token_ids is None:
                token_ids = self._retokenize(text)
            logprobs = [float("nan")] * len(token_ids)
            if prompt_ids is None:
                prompt_ids = []
        else:
            logprobs = [float(v) for v in lp_values]
        finish_raw = choice.get("finish_reason")
        finish = "length" if finish_raw == "length" else "stop"
        stop_reason = choice.get("stop_reason")
        if finish == "stop" and stop_reason is None and token_ids and reason is None:
            stop_reason = token_ids[-1]  # EOS, as the in-process backends report it
        return Generation(
            text=text,
            token_ids=list(token_ids),
            logprobs=logprobs,
            prompt_ids=[int(i) for i in prompt_ids],
            policy_version=self.policy_version,
            finish_reason=finish,
            stop_reason=stop_reason,
            evaluation_only=reason,
        )

    def _retokenize(self, text: str) -> list[int]:
        if self.tokenizer is None or not text:
            return []
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    # ------------------------------------------------------------------ cache
    def _load_cache(self) -> dict[str, dict[str, Any]]:
        assert self.cache_path is not None
        out: dict[str, dict[str, Any]] = {}
        if not self.cache_path.is_file():
            return out
        with self.cache_path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                try:
                    entry = json.loads(line)
                    out[str(entry["key"])] = dict(entry["response"])
                except (ValueError, KeyError, TypeError):
                    log.warning("%s line %d is not a cached response (a cut write?): ignored", self.cache_path, n)
        return out

    def _store(self, key: str, data: dict[str, Any]) -> None:
        if self.cache_path is None:
            return
        line = json.dumps({"key": key, "response": data}, ensure_ascii=False) + "\n"
        with self._cache_lock:
            self._cache[key] = data
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()

    # ------------------------------------------------------------------ LoRA adapters (vLLM)
    def load_lora_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Serve a PEFT adapter directory under ``name`` (vLLM: ``POST /v1/load_lora_adapter``).

        The server needs ``--enable-lora`` (``--max-lora-rank``/``--max-loras`` to fit) and the environment
        variable ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, and ``path`` must be readable by the server.
        """
        self._run(
            self._call("POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, expect_json=False)
        )

    def unload_lora_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (vLLM: ``POST /v1/unload_lora_adapter``)."""
        self._run(self._call("POST", "/unload_lora_adapter", {"lora_name": name}, expect_json=False))

    def view(self, model: str, policy_version: int = 0) -> OpenAIPolicy:
        """Another policy on the same server and connection pool whose requests name ``model``
        (e.g. a LoRA adapter's name); it keeps its own ``policy_version``."""
        import copy

        other = copy.copy(self)
        other.model = model
        other.policy_version = policy_version
        other.stats = self.stats
        other._parent = self  # the loop thread stops when the policy that started it is collected
        return other


def _token_id(token: Any) -> int | None:
    m = _TOKEN_ID.match(token) if isinstance(token, str) else None
    return int(m.group(1)) if m else None


def _server_message(resp: Any) -> str:
    """The server's error text, one line, at most 300 characters (never request headers)."""
    try:
        data = resp.json()
        msg = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        text = str(msg)
    except ValueError:
        text = resp.text
    text = " ".join(text.split())
    return text[:300] + ("..." if len(text) > 300 else "")


def openai_policy_map(
    model: str | None,
    base_url: str | Mapping[str, str],
    *,
    roles: Sequence[str] = (),
    factory: Callable[..., OpenAIPolicy] = OpenAIPolicy,
    **kwargs: Any,
) -> PolicyMap:
    """Roles -> served policies. ``base_url`` is one URL (every role shares one policy) or ``role -> URL``
    (key ``"*"`` or ``"default"``: the roles not listed); roles on the same URL share one policy."""
    if isinstance(base_url, str):
        return PolicyMap.shared(factory(model, base_url, **kwargs), roles)
    urls = dict(base_url)
    default_url = urls.pop("*", None) or urls.pop("default", None)
    by_url: dict[str, OpenAIPolicy] = {}

    def policy(url: str) -> OpenAIPolicy:
        if url not in by_url:
            by_url[url] = factory(model, url, **kwargs)
        return by_url[url]

    return PolicyMap(
        {role: policy(url) for role, url in urls.items()},
        default=policy(default_url) if default_url else None,
    )


def parse_base_urls(values: Sequence[str]) -> str | dict[str, str]:
    """``--base-url`` values: one ``URL``, or ``ROLE=URL`` entries (plus at most one plain URL: the rest)."""
    if not values:
        raise ValueError("--base-url is required for an openai: model (e.g. http://127.0.0.1:8000/v1)")
    out: dict[str, str] = {}
    for v in values:
        m = re.match(r"^([A-Za-z_][\w-]*)=(https?://.+)$", v)
        key, url = (m.group(1), m.group(2)) if m else ("*", v)
        if key in out:
            raise ValueError(f"--base-url given twice for {'the default' if key == '*' else key!r}")
        out[key] = url
    if list(out) == ["*"]:
        return out["*"]
    return out


def served_policies(
    model: str,
    base_urls: Sequence[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> PolicyMap:
    """What ``--model openai:NAME --base-url ...`` evaluates with: :func:`openai_policy_map` over the
    parsed ``--base-url`` values, each policy with a response cache in ``cache_dir`` (one file per URL)."""
    urls = parse_base_urls(base_urls)

    def factory(name: str | None, url: str, **kw: Any) -> OpenAIPolicy:
        digest = hashlib.sha256(url.encode()).hexdigest()[:10]
        path = Path(cache_dir) / f"openai-responses-{digest}.jsonl" if cache_dir is not None else None
        return OpenAIPolicy(name, url, cache_path=path, **kw)

    policies = openai_policy_map(model or None, urls, factory=factory, **kwargs)
    for pol in policies.policies:
        pol.check_server()  # fails fast on a wrong URL or model, and names the model in the eval cache key
    return policies


__all__ = [
    "MODEL_PREFIX",
    "NEUTRAL_SAMPLING",
    "NEUTRAL_VLLM_SAMPLING",
    "OpenAIPolicy",
    "OpenAIServerError",
    "RETRY_STATUSES",
    "VLLM_FIELDS",
    "openai_policy_map",
    "parse_base_urls",
    "parse_model_spec",
    "served_policies",
]
