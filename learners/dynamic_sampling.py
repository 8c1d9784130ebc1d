"""Dynamic sampling (DAPO, Yu et al. 2025, "filter groups"): train only on groups that carry a signal.

A group-relative advantage is zero for every event of a task whose G rollouts all earned the same
rewards (all solved or all failed), so such a group adds nothing to the policy gradient but still
counts in the loss's mean: with most groups flat (the search suites' warm start fails ~3 of 4 groups
outright) each optimizer step moves the policy a fraction of its nominal step. With
``TrainConfig.filter_groups`` the trainer drops flat groups and rolls out further tasks of the
iteration's pool, at most ``max_gen_batches`` rollout batches, until ``tasks_per_iter`` groups with a
signal are in hand (as verl's DAPO recipe does with ``max_num_gen_batches``); the surplus of the last
batch is cut so that every update sees the same number of groups.

What makes a group informative is ``TrainConfig.filter_signal``. ``reward`` (the default): a group is
flat when every row of it has the same reward; event rewards include an event's own penalties (a format
penalty) and a routed team's member costs, so a group whose outcomes agree but whose penalties differ
still teaches. ``correct`` is DAPO's own rule: a group is informative when some but not all of its G
rollouts solved the task. With a member cost the difference matters: in a group that failed every
rollout the costs are the only reward difference, and a std-normalised advantage turns that small
difference into a full-size push toward fewer searchers and fewer rounds (on quick-search-routed RL
stopped asking for the second search round that two-hop questions need; docs/results/quick-search-routed.md). ``correct`` drops
those groups, so costs are learned only where they break ties between outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.rollout import RolloutBatch

#: ``TrainConfig.filter_signal`` values: what must differ within a group for it to be kept.
FILTER_SIGNALS = ("reward", "correct")


def informative_groups(batch: RolloutBatch, signal: str = "reward") -> list[str]:
    """The batch's group ids whose rows' rewards (``signal="reward"``) or outcomes (``"correct"``: solved
    or not) are not all equal, in first-appearance order."""
    if signal not in FILTER_SIGNALS:
        raise ValueError(f"filter signal must be one of {FILTER_SIGNALS}, got {signal!r}")
    values: dict[str, set[float]] = {}
    for row in batch.rows:
        value = float(row.reward) if signal == "reward" else float(row.correct)
        values.setdefault(row.group_id, set()).add(value)
    return [g for g, seen in values.items() if len(seen) > 1]


def select_groups(batch: RolloutBatch, groups: Sequence[str]) -> RolloutBatch:
    """The rows, episodes and events of ``groups`` only (batch order kept)."""
    keep = set(groups)
    episodes = [e for e in batch.episodes if e.group_id in keep]
    kept_ids = {e.episode_id for e in episodes}
    return RolloutBatch(
        rows=[r for r in batch.rows if r.group_id in keep],
        episodes=episodes,
        events={k: v for k, v in batch.events.items() if k in kept_ids},
    )


@dataclass
class FilterStats:
    """What an iteration's dynamic sampling did (logged under ``rollout/``)."""

    gen_batches: int = 0
    groups_generated: int = 0
    groups_kept: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/gen_batches": float(self.gen_batches),
            "rollout/groups_generated": float(self.groups_generated),
            "rollout/groups_kept": float(self.groups_kept),
            "rollout/informative_group_frac": self.groups_kept / max(1, self.groups_generated),
        }
