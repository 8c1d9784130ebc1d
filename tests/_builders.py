"""Test data builders shared by several test modules (plain functions, not fixtures: tests call them
with different shapes; import with ``from tests._builders import make_row``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.rows import Row


def make_row(
    event_id: str,
    member: int,
    k: int,
    prompt: Sequence[int] = (5, 6),
    response: Sequence[int] = (7, 8, 9),
    mask: Sequence[int] | None = None,
    lps: Sequence[float] | None = None,
    reward: float = 1.0,
    **fields: Any,
) -> Row:
    """One :class:`Row`: member ``member`` of a ``k``-member event ``event_id`` (``"<episode>/<n>"``).

    Defaults: every response token in the loss, behaviour log-prob -0.1 per token, one task ``T`` and
    one group ``g``, event type ``t`` at step 0; ``fields`` override any other :class:`Row` field.
    """
    response = list(response)
    base: dict[str, Any] = dict(
        event_id=event_id,
        episode_id=event_id.split("/")[0],
        pre_state_id="s",
        event_type="t",
        step=0,
        agent=f"a{member}",
        role="r",
        member_index=member,
        k=k,
        prompt_ids=list(prompt),
        response_ids=response,
        response_mask=list(mask) if mask is not None else [1] * len(response),
        behaviour_logprobs=list(lps) if lps is not None else [-0.1] * len(response),
        policy_version=0,
        task_id="T",
        group_id="g",
        reward=reward,
    )
    return Row(**{**base, **fields})
