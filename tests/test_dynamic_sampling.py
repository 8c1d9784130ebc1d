"""Dynamic sampling (DAPO filter groups): flat groups are dropped, more tasks refill the update batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.rollout import EpisodeStats, RolloutBatch
from agents.rows import Row
from learners.dynamic_sampling import informative_groups, select_groups
from learners.trainer import TrainConfig, Trainer


def _row(group: str, g: int, reward: float, step: int = 0) -> Row:
    return Row(
        event_id=f"{group}-g{g}-e{step}",
        episode_id=f"{group}-g{g}",
        pre_state_id="s",
        event_type="answer",
        step=step,
        agent="a",
        role="solver",
        member_index=0,
        k=1,
        prompt_ids=[1],
        response_ids=[2],
        response_mask=[1],
        behaviour_logprobs=[-0.5],
        policy_version=0,
        task_id=group,
        group_id=group,
        reward=reward,
    )


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


def _cfg(model: Path, out: Path, **kw) -> TrainConfig:
    base = dict(
        model=str(model),
        out_dir=str(out),
        iterations=1,
        tasks_per_iter=2,
        group_size=2,
        epochs=1,
        max_new_tokens=8,
        eval_every=0,
        save_every=0,
        lr=5e-3,
        algo="srpo",
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("max_gen_batches", [3, 1])
def test_trainer_refills_the_batch_with_informative_groups(
    tiny_model_dir: Path, tmp_path: Path, max_gen_batches: int
) -> None:
    trainer = Trainer(
        _cfg(tiny_model_dir, tmp_path, filter_groups=True, max_gen_batches=max_gen_batches), log=None
    )
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
    update = trainer._update
    trainer._update = lambda batch, it: (seen.append(batch), update(batch, it))[1]
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
