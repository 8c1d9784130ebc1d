"""A stand-in OpenAI-compatible server for the main suite: vLLM's answer layout, injectable failures.

It is an ``httpx.MockTransport`` handler (no sockets). Answers are a pure function of the request body,
so a resumed eval that asks the same question gets the same answer, and every body is recorded so a
test can count duplicates. ``failures`` is a queue of what the next requests get instead of an answer:
``"429"`` (``"429:N"``: with ``Retry-After: N``), ``"500"``, ``"timeout"`` (sleeps past the client's timeout), ``"malformed"`` (200 with a body
that is not JSON), ``"bad-request"`` (400), ``"interrupt"`` (raises :class:`Interrupted`, which no
client retries: a stand-in for Ctrl-C / a killed process mid-eval).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from typing import Any

import httpx

EOS = 2


class Interrupted(Exception):
    """Raised by the transport: the eval stops mid-way as if killed."""


def _ids(text: str) -> list[int]:
    return [3 + (ord(c) % 500) for c in text]


class StandIn:
    """Fake vLLM (``vllm=True``: token ids and log-probs) or plain OpenAI server (``vllm=False``)."""

    def __init__(self, *, vllm: bool = True, model: str = "tiny", sleep_s: float = 1.0) -> None:
        self.vllm = vllm
        self.model = model
        self.sleep_s = sleep_s
        self.failures: list[str] = []
        self.bodies: list[str] = []  # every POST body that got an answer (sorted JSON)
        self.attempts = 0
        self.auth: list[str | None] = []
        self.interrupt_after: int | None = None  # raise Interrupted once this many bodies were answered

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def answered(self) -> Counter:
        return Counter(self.bodies)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        self.auth.append(request.headers.get("authorization"))
        if request.method == "GET" and request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if self.interrupt_after is not None and len(self.bodies) >= self.interrupt_after:
            raise Interrupted("the eval was killed here")
        if self.failures:
            what = self.failures.pop(0)
            if what.startswith("429"):  # "429:N": Retry-After N seconds (default 0)
                after = what.partition(":")[2] or "0"
                return httpx.Response(429, json={"error": {"message": "rate limited"}}, headers={"retry-after": after})
            if what == "500":
                return httpx.Response(500, json={"error": {"message": "engine died"}})
            if what == "timeout":
                await asyncio.sleep(self.sleep_s)
            elif what == "malformed":
                return httpx.Response(200, content=b'{"choices": [ {"text": "cut off', headers={"content-type": "application/json"})
            elif what == "bad-request":
                return httpx.Response(400, json={"error": {"message": "max_tokens must be at least 1"}})
            elif what == "interrupt":
                raise Interrupted("the eval was killed here")
        body = json.loads(request.content)
        if not self.vllm and any(k in body for k in ("return_token_ids", "return_tokens_as_token_ids")):
            return httpx.Response(400, json={"error": {"message": "Unrecognized request argument supplied: return_token_ids"}})
        key = json.dumps(body, sort_keys=True)
        self.bodies.append(key)
        digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
        text = f"The answer is \\boxed{{{digest % 7}}}"
        ids = [*_ids(text), EOS]
        lps = [-0.01 * (1 + (digest + i) % 50) for i in range(len(ids))]
        path = request.url.path
        if path.endswith("/chat/completions"):
            prompt_text = json.dumps(body["messages"])
        else:
            prompt = body["prompt"]
            prompt_text = prompt if isinstance(prompt, str) else None
        prompt_ids = _ids(prompt_text) if prompt_text is not None else body["prompt"]
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "stop_reason": None}
        if path.endswith("/chat/completions"):
            choice["message"] = {"role": "assistant", "content": text}
            content = [{"token": f"token_id:{t}" if self.vllm else chr(t % 90 + 33), "logprob": lp, "top_logprobs": []} for t, lp in zip(ids, lps, strict=True)]
            choice["logprobs"] = {"content": content} if body.get("logprobs") else None
            data: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"], "choices": [choice]}
            if self.vllm:
                choice["token_ids"] = ids
                data["prompt_token_ids"] = prompt_ids
        else:
            choice["text"] = text
            tokens = [f"token_id:{t}" if self.vllm else chr(t % 90 + 33) for t in ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None, "text_offset": []}
            if self.vllm:
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = prompt_ids
            data = {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice]}
        data["usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
        return httpx.Response(200, json=data)
