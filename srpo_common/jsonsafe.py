"""JSON from untrusted files, bounded before it is parsed: nesting depth and non-finite constants.

``json.loads`` recurses once per nesting level, so a few kilobytes of ``[[[[...`` raise
``RecursionError`` (or, in a thread with a small stack, crash the interpreter) from deep inside
the parser, and the caller sees a traceback instead of "this file is malformed". Every loader of a
file a user or an attacker can hand us (records, results lists, evidence lines, checkpoint state)
first measures the depth here, in one linear pass with no recursion, and refuses what is deeper
than the format can legitimately be.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

__all__ = ["DEFAULT_MAX_DEPTH", "JSONDepthError", "check_json_depth", "json_depth", "loads_bounded"]

#: Deeper than any srpo file format nests (records: 5 levels; checkpoint state: about 10).
DEFAULT_MAX_DEPTH = 64

# A JSON string (escapes included); removed before brackets are counted, so "[[[" inside a string
# does not count. Unterminated strings are left alone: json.loads rejects them afterwards anyway.
_STRING = re.compile(rb'"(?:[^"\\]+|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JSONDepthError(ValueError):
    """JSON text nests deeper than allowed (raised before it is parsed)."""


def json_depth(text: str | bytes) -> int:
    """Maximum nesting depth of arrays/objects in JSON ``text``, without parsing it.

    Linear time, constant stack: strings are blanked out with one regex, everything but the four
    bracket characters is dropped with ``bytes.translate``, and the depth is the running maximum of
    +1/-1 steps (numpy): a 1 MB record costs milliseconds, a 100k-bracket bomb no more.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    brackets = _STRING.sub(b'""', data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int64)
    level = np.cumsum(steps)
    # the largest rise over any stretch (not just from the start): stray closers before a bomb, or
    # several JSON lines scanned at once, cannot hide a deep part (for valid JSON: the plain depth)
    floor = np.minimum.accumulate(np.concatenate(([0], level[:-1])))
    return int(max(0, (level - floor).max()))


def check_json_depth(text: str | bytes, max_depth: int = DEFAULT_MAX_DEPTH, what: str = "JSON") -> None:
    """Raise :class:`JSONDepthError` (one line) when ``text`` nests deeper than ``max_depth``."""
    depth = json_depth(text)
    if depth > max_depth:
        raise JSONDepthError(f"{what} nests deeper than {max_depth} levels; refused before parsing")


def loads_bounded(
    text: str | bytes, max_depth: int = DEFAULT_MAX_DEPTH, what: str = "JSON", **kwargs: Any
) -> Any:
    """``json.loads(text, **kwargs)`` after :func:`check_json_depth` (a ``ValueError`` either way)."""
    check_json_depth(text, max_depth, what)
    return json.loads(text, **kwargs)
