"""Text spaces for LLM agents.

``gymnasium.spaces.Text`` checks membership character by character against a finite charset. LLM
observations contain arbitrary Unicode (LaTeX, other scripts, emoji), so :class:`UnicodeText` keeps
``Text``'s sampling (from a printable charset, used by PettingZoo's API tests and random agents) but
accepts any string of allowed length without NUL bytes, the only character our envs strip.
"""

from __future__ import annotations

import functools
import string
from typing import Any

from gymnasium.spaces import Text

#: Characters random samples are drawn from: printable ASCII plus a few LaTeX-ish and non-ASCII ones.
SAMPLE_CHARSET = string.printable + "αβγπ∞≤≥√×÷°é中"


class UnicodeText(Text):
    """A ``gymnasium.spaces.Text`` that contains any NUL-free string within its length bounds."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and "\x00" not in x

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash(("UnicodeText", self.min_length, self.max_length))


class TextSpaces:
    """Per-agent :class:`UnicodeText` observation and action spaces of ``max_obs_chars`` /
    ``max_action_chars`` characters, one object per agent (PettingZoo's recommended cached pattern).

    A mixin listed before ``ParallelEnv``: the local envs (:class:`srpo_envs.base.EventParallelEnv`)
    and their HTTP client (:class:`srpo_envs.remote.RemoteEnv`) declare the same spaces."""

    max_obs_chars: int
    max_action_chars: int

    @functools.cache  # noqa: B019 - PettingZoo's recommended pattern: same object per agent
    def observation_space(self, agent: str) -> UnicodeText:
        return UnicodeText(self.max_obs_chars)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> UnicodeText:
        return UnicodeText(self.max_action_chars)
