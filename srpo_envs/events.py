"""Decision events: the unit every learner in srpo consumes.

A step of an srpo env is one *event*: the transition consumed the outputs of exactly the agents in
its active set. Recording that set (``members``) together with the outputs, a stable hash of the
state before the step and, once the episode ends, the outcome reward, lets a learner build
event-level objectives (SRPO) without replaying the env.

Events are immutable; the outcome reward is written exactly once, at episode end, by
:meth:`EventLog.finalize`, which replaces each event with a copy carrying its reward.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from srpo_common import sha256_json


def stable_hash(obj: Any, length: int = 16) -> str:
    """Hash a JSON-serialisable object canonically (sorted keys, no whitespace drift).

    Used for ``pre_state_id``: the same seed and the same history must hash to the same id across
    processes and Python versions, so we never rely on ``hash()`` (salted per process).
    """
    return sha256_json(obj, ascii_only=True, length=length)


class FrozenDict(dict):
    """A read-only dict: events stay immutable, yet pickle and copy like plain data."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("event fields are immutable")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]
    __ior__ = _readonly  # type: ignore[assignment]

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


def _freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return FrozenDict(mapping or {})


@dataclass(frozen=True)
class Event:
    """One decision event: which agents' outputs one transition consumed, and what came of it.

    Attributes:
        event_id: unique id (``<episode_id>/<step>``).
        episode_id: the episode this event belongs to.
        step: 0-based index of the transition within the episode.
        pre_state_id: stable hash of the shared state before the transition.
        event_type: what the transition does (``propose``, ``verify``, ``revise``, ``aggregate``,
            ``route``, ``search``...). Together with ``task_id`` and ``step`` it defines which events
            of the G rollouts of a task are comparable.
        members: agent names whose outputs were consumed, in a fixed order (the active set).
        outputs: agent -> text exactly as consumed (after truncation, see ``valid``).
        valid: agent -> whether the output parsed (format check); invalid outputs are penalised.
        task_id: id of the task the episode is solving.
        reward: outcome reward written back at episode end (``None`` while the episode runs).
        info: extra facts about the transition (parsed answers, tool calls, chosen team size...).
    """

    event_id: str
    episode_id: str
    step: int
    pre_state_id: str
    event_type: str
    members: tuple[str, ...]
    outputs: Mapping[str, str]
    valid: Mapping[str, bool]
    task_id: str = ""
    reward: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.outputs) != set(self.members):
            raise ValueError(f"event outputs {sorted(self.outputs)} != members {list(self.members)}")
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "outputs", _freeze(self.outputs))
        object.__setattr__(self, "valid", _freeze(self.valid))
        object.__setattr__(self, "info", _freeze(self.info))

    @property
    def k(self) -> int:
        """K, the number of members whose outputs the transition consumed."""
        return len(self.members)

    @property
    def all_valid(self) -> bool:
        return all(self.valid.get(m, False) for m in self.members)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (JSON-serialisable), including the derived ``k``."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["members"] = list(self.members)
        d["outputs"] = dict(self.outputs)
        d["valid"] = dict(self.valid)
        d["info"] = dict(self.info)
        d["k"] = self.k
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Event:
        kwargs = {k: v for k, v in d.items() if k != "k"}
        kwargs["members"] = tuple(kwargs["members"])
        return cls(**kwargs)


class EventLog:
    """The events of one episode, in order; rewards are written once when the episode ends."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self.finalized = False

    def append(self, event: Event) -> None:
        if self.finalized:
            raise RuntimeError("episode already finalized; no event can be appended")
        self._events.append(event)

    def finalize(self, rewards: float | Sequence[float]) -> None:
        """Write the outcome reward back to every event of the episode (exactly once).

        ``rewards`` is either one team reward for all events, or a list with one reward per event.
        """
        if self.finalized:
            raise RuntimeError("episode rewards were already written")
        if isinstance(rewards, int | float):
            per_event = [float(rewards)] * len(self._events)
        else:
            per_event = [float(r) for r in rewards]
            if len(per_event) != len(self._events):
                raise ValueError("need one reward per event")
        self._events = [replace(e, reward=r) for e, r in zip(self._events, per_event, strict=True)]
        self.finalized = True

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, i: int) -> Event:
        return self._events[i]

    def to_list(self) -> list[Event]:
        return list(self._events)
