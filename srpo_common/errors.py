"""Failures of services outside srpo, told apart from srpo's own bugs.

An OpenAI-compatible server (``agents.openai_policy``), a retrieval server
(``srpo_envs.retrievers.remote``) and an env server (``srpo_envs.remote``) each raise a subclass of
:class:`ExternalServiceError` when *they* fail (an HTTP 5xx or 429 past the retries, a malformed answer,
no answer at all). The ``srpo`` error boundary (``srpo_cli.app``) gives these their own exit status and
one line naming the service, its URL, the HTTP status and what to do, instead of "internal error ...
report it", which is kept for srpo's own bugs. The class lives here, at the bottom of the dependency
order, so that every client package and the CLI can name one type.
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from time import time


class ExternalServiceError(RuntimeError):
    """A service srpo talks to over the network failed (not a bug in srpo).

    ``str(exc)`` is the client's own message (what was asked and what came back); :meth:`one_line` adds
    the service, URL, status and ``hint`` for the command line.
    """

    #: what the service is, for the one-line message (subclasses name theirs)
    service = "external service"
    #: what to do when the subclass's raiser gave no hint
    default_hint = "check that the service is running and reachable, then rerun"

    def __init__(
        self, message: str, *, url: str | None = None, status: int | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.hint = hint

    def one_line(self) -> str:
        """``<service> at <url> failed (HTTP <status>): <message>; <hint>`` (the parts that are known)."""
        where = f" at {self.url}" if self.url else ""
        status = f" (HTTP {self.status})" if self.status is not None else ""
        text = " ".join(str(self).split())
        return f"{self.service}{where} failed{status}: {text}; {self.hint or self.default_hint}"


def retry_after_seconds(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` header in seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3);
    None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time())


__all__ = ["ExternalServiceError", "retry_after_seconds"]
