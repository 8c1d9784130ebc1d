"""HTTP client for a Search-R1-style ``/retrieve`` server (ours or Search-R1's own).

Keeps the :class:`Retriever` contract across the network: blank queries get ``[]`` locally
(servers reject them), batches larger than the server's limit are split, over-long queries are
cut to the server's limit (a 4k-character query is noise to BM25 anyway, and a rollout must not
die on it), and transient failures - connection errors, timeouts, 429 and 5xx - are retried with
exponential backoff (never sooner than a ``Retry-After`` asks, within ``max_backoff``). A 4xx other than
429 is a caller error and raises ``ValueError`` at once; a server that keeps failing is a
:class:`RemoteRetrieverError` (an external-service failure: ``srpo`` exits with its own status, naming it).
"""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any

import httpx

from srpo_common.errors import ExternalServiceError, retry_after_seconds
from srpo_envs.retrievers.base import Passage, Retriever, ServerLimits, passage_from_record

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RemoteRetrieverError(ExternalServiceError):
    """The server stayed unreachable or failing after all retries, or answered in a layout it should not."""

    service = "the retrieval server"
    default_hint = "check that server (`srpo serve-retriever` or Search-R1's: its log) and the retriever URL, then rerun"


class RemoteRetriever(Retriever):
    """``search`` via ``POST {url}/retrieve``. ``url`` may be the base or the full ``/retrieve`` URL.

    ``timeout`` is per HTTP attempt (seconds); ``retries`` is the number of *extra* attempts after
    the first; the wait before retry ``i`` is ``backoff * 2**i`` plus up to 25% jitter, capped at
    ``max_backoff``. One ``httpx.Client`` (a thread-safe connection pool) is shared by all threads.
    """

    name = "remote"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        max_batch: int = ServerLimits.max_queries,
        max_query_chars: int = ServerLimits.max_query_chars,
        max_topk: int = ServerLimits.max_topk,
        max_results: int = ServerLimits.max_results,
        client: httpx.Client | None = None,
    ) -> None:
        if retries < 0 or timeout <= 0 or max_batch < 1:
            raise ValueError("need retries >= 0, timeout > 0 and max_batch >= 1")
        base = url.rstrip("/")
        self.retrieve_url = base if base.endswith("/retrieve") else f"{base}/retrieve"
        self.base_url = self.retrieve_url[: -len("/retrieve")]
        self.timeout, self.retries = float(timeout), int(retries)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.max_batch, self.max_query_chars = int(max_batch), int(max_query_chars)
        self.max_topk, self.max_results = int(max_topk), int(max_results)
        self._own_client = client is None
        self._client = client or httpx.Client(timeout=self.timeout, limits=httpx.Limits(max_connections=64))
        self._rng = random.Random()
        self._rng_lock = threading.Lock()

    def health(self) -> dict[str, Any]:
        """``GET /health`` (one attempt; raises ``httpx.HTTPError`` when down)."""
        resp = self._client.get(f"{self.base_url}/health", timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()

    def _sleep(self, attempt: int, at_least: float | None = None) -> None:
        with self._rng_lock:
            jitter = self._rng.random()
        delay = min(self.max_backoff, self.backoff * 2**attempt)
        time.sleep(max(delay * (1 + 0.25 * jitter), at_least or 0.0))

    def _post(self, payload: dict[str, Any]) -> Any:
        last = ""
        status: int | None = None
        wait: float | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(attempt - 1, wait)
            try:
                resp = self._client.post(self.retrieve_url, json=payload, timeout=self.timeout)
            except httpx.TransportError as exc:  # connect/read errors and timeouts
                last, status, wait = f"{type(exc).__name__}: {exc}", None, None
                continue
            if resp.status_code in _RETRY_STATUS:
                last, status = f"HTTP {resp.status_code}: {resp.text[:300]}", resp.status_code
                wait = retry_after_seconds(resp.headers.get("retry-after"))
                if wait is not None and wait > self.max_backoff and attempt < self.retries:
                    raise RemoteRetrieverError(
                        f"{self.retrieve_url}: {last}; the server asks to retry after {wait:g}s (Retry-After), "
                        f"longer than this client waits ({self.max_backoff:g}s)",
                        url=self.retrieve_url,
                        status=status,
                        hint=f"rerun in {math.ceil(wait)}s or more",
                    )
                continue
            if resp.status_code >= 400:
                raise ValueError(
                    f"retriever rejected the request (HTTP {resp.status_code}): {resp.text[:500]}"
                )
            try:
                return resp.json()["result"]
            except (ValueError, KeyError, TypeError) as exc:
                last, status, wait = f"malformed response: {exc}", resp.status_code, None
                continue
        raise RemoteRetrieverError(
            f"{self.retrieve_url} failed after {self.retries + 1} attempts: {last}", url=self.retrieve_url, status=status
        )

    @staticmethod
    def _to_passage(item: Any) -> Passage:
        if isinstance(item, dict) and "document" in item:
            doc, score = item["document"], float(item.get("score", 0.0))
        else:
            doc, score = item, 0.0
        p = passage_from_record(doc, "server document")
        return Passage(p.id, p.title, p.text, score)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if isinstance(queries, str):
            raise ValueError("queries must be a list of strings, not a single string")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise ValueError(f"query {i} is {type(q).__name__}, not str")
        k = min(k, self.max_topk)
        out: list[list[Passage]] = [[] for _ in queries]
        idx = [i for i, q in enumerate(queries) if q.strip()]
        step = max(1, min(self.max_batch, self.max_results // k))  # stay under the server's per-request caps
        for start in range(0, len(idx), step):
            chunk = idx[start : start + step]
            payload = {
                "queries": [queries[i].strip()[: self.max_query_chars] for i in chunk],
                "topk": k,
                "return_scores": True,
            }
            result = self._post(payload)
            if not isinstance(result, list) or len(result) != len(chunk):
                raise RemoteRetrieverError(
                    f"server returned {type(result).__name__} for {len(chunk)} queries",
                    url=self.retrieve_url,
                    hint="is the URL a Search-R1-style /retrieve server? check its version and log",
                )
            for i, hits in zip(chunk, result, strict=True):
                out[i] = [self._to_passage(h) for h in hits]
        return out

    def close(self) -> None:
        if self._own_client:
            self._client.close()
