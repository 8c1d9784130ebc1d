"""Dynamic sampling (DAPO filter groups): flat groups are dropped, more tasks refill the update batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.rollout import EpisodeStats, RolloutBatch
from agents.rows import Row
from learners.dynamic_sampling import informative_groups, select_groups
from learners.trainer import Trainer
from tests._builders import make_row, update_check_config


def _row(group: str, g: int, reward: float, step: int = 0) -> Row:
    return make_row(f"{group}-g{g}/{step}", 0, 1, reward=reward, step=step, task_id=group, group_id=group)


def _episode(group: str, g: int) -> EpisodeStats:
    return EpisodeStats(f"{group}-g{g}", group, group, 0.0, False, 1, 1, 0, [1], ["answer"])


def test_flat_groups_are_found_and_selection_keeps_whole_groups() -> None:
    rows = [_row("t0", 0, 1.0), _row("t0", 1, 0.0), _row("t1", 0, 0.0), _row("t1", 1, 0.0)]
    # t2: equal outcomes, but one event paid a format penalty: still a signal
    rows += [_row("t2", 0, 0.0), _row("t2", 1, 0.0), _row("t2", 1, -0.1, step=1)]
    batch = RolloutBatch(
        rows=rows,
        episodes=[_episode(t, g) for t in ("t0", "t1", "t2") for g in (0, 1)],
        events={f"{t}-g{g}": [t] for t in ("t0", "t1", "t2") for g in (0, 1)},
    )
    assert informative_groups(batch) == ["t0", "t2"]
    kept = select_groups(batch, ["t2"])
    assert [r.group_id for r in kept.rows] == ["t2"] * 3
    assert [e.episode_id for e in kept.episodes] == ["t2-g0", "t2-g1"]
    assert sorted(kept.events) == ["t2-g0", "t2-g1"]


def test_a_group_that_differs_only_in_costs_is_dropped_by_the_correct_signal() -> None:
    """DAPO's rule (filter_signal="correct"): keep a group only when some but not all rollouts solved the
    task. A routed team's failed group whose member costs differ has a reward signal, not an outcome one."""

    def row(group: str, g: int, reward: float, correct: bool) -> Row:
        return make_row(f"{group}-g{g}/0", 0, 1, reward=reward, task_id=group, group_id=group, correct=correct)

    rows = [row("costs", 0, -0.02, False), row("costs", 1, -0.10, False)]  # all failed, K differed
    rows += [row("mixed", 0, 0.98, True), row("mixed", 1, -0.02, False)]
    rows += [row("solved", 0, 0.98, True), row("solved", 1, 0.90, True)]  # all solved, costs differ
    batch = RolloutBatch(rows=rows, episodes=[], events={})
    assert informative_groups(batch) == ["costs", "mixed", "solved"]
    assert informative_groups(batch, "correct") == ["mixed"]
    with pytest.raises(ValueError, match="filter signal"):
        informative_groups(batch, "outcome")
    with pytest.raises(ValueError, match="filter_signal"):
        update_check_config("/nonexistent", "/tmp/unused", filter_signal="outcome")


@pytest.mark.parametrize("max_gen_batches", [3, 1])
def test_trainer_refills_the_batch_with_informative_groups(
    tiny_model_dir: Path, tmp_path: Path, max_gen_batches: int
) -> None:
    cfg = update_check_config(
        tiny_model_dir, tmp_path, algo="srpo", filter_groups=True, max_gen_batches=max_gen_batches
    )
    trainer = Trainer(cfg, log=None)
    collect = trainer.scale.collect
    calls: list[list[int]] = []

    def scripted(collector, tasks, group_size, seed):  # first batch: one group with a signal; then two
        batch = collect(collector, tasks, group_size, seed)
        first = sorted({r.group_id for r in batch.rows})[0]
        for r in batch.rows:
            win = r.episode_id.endswith("-g0") and (calls or r.group_id == first)
            r.penalty, r.outcome_reward = 0.0, 1.0 if win else 0.0
            r.reward = r.outcome_reward
        calls.append(list(tasks))
        return batch

    trainer.scale.collect = scripted
    seen: list[RolloutBatch] = []
    update = trainer.update
    trainer.update = lambda batch, it: (seen.append(batch), update(batch, it))[1]
    trainer.train()
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(calls) == min(2, max_gen_batches)
    assert len({t for c in calls for t in c}) == 2 * len(calls)  # the pool is drawn without replacement
    groups = {r.group_id for r in seen[0].rows}
    assert len(groups) == min(2, max_gen_batches)  # one from each batch, the surplus cut
    assert metrics["rollout/gen_batches"] == len(calls)
    assert metrics["rollout/groups_generated"] == 2 * len(calls)
    assert metrics["rollout/groups_kept"] == len(groups)
    assert metrics["actor/zero_adv_frac"] == 0.0
    assert metrics["rows"] == len(seen[0].rows)
