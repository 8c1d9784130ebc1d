"""``member_cost_advantage="apart"``: the member cost reaches the advantage at its own scale, not as a
full-size push where every rollout of a group failed (issue 61's cost candidates)."""

from __future__ import annotations

import pytest
import torch

import srpo_envs
from agents.policy import PolicyMap
from agents.rollout import RolloutCollector
from learners.advantages import AdvantageConfig, get_adv_estimator, member_cost_advantages
from learners.batching import build_event_table
from learners.trainer import Trainer
from tests._builders import make_row, update_check_config
from tests.agents.test_rollout import EchoPolicy


def _group(outcomes: list[float], costs: list[float]) -> list:
    """One task's rollouts, each one K=1 event whose reward is its outcome minus its member cost."""
    return [
        make_row(f"ep{i}/0", 0, 1, reward=o - c, outcome_reward=o - c, member_cost=c)
        for i, (o, c) in enumerate(zip(outcomes, costs, strict=True))
    ]


@pytest.mark.parametrize("algo", ["srpo", "grpo"])
def test_a_failed_group_learns_its_cost_at_the_costs_size(algo: str) -> None:
    table = build_event_table(_group([0.0, 0.0, 0.0, 0.0], [0.02, 0.04, 0.06, 0.08]))
    estimator = get_adv_estimator(algo)
    joint = estimator(table, AdvantageConfig()).advantages
    apart = estimator(table.without_member_cost(), AdvantageConfig()).advantages + member_cost_advantages(table)
    # in the outcome, 0.02-0.08 of cost becomes unit-size advantages; apart, it stays 0.02-0.08 in size
    assert joint.abs().mean() == pytest.approx(0.894, abs=1e-3)
    assert torch.allclose(apart, torch.tensor([0.03, 0.01, -0.01, -0.03], dtype=torch.float64), atol=1e-12)


def test_where_outcomes_differ_the_outcome_is_normalised_alone() -> None:
    table = build_event_table(_group([1.0, 0.0], [0.10, 0.02]))
    apart = get_adv_estimator("srpo")(table.without_member_cost(), AdvantageConfig()).advantages
    assert torch.allclose(apart, torch.tensor([1.0, -1.0], dtype=torch.float64), atol=1e-5)
    assert torch.allclose(member_cost_advantages(table), torch.tensor([-0.04, 0.04], dtype=torch.float64))


def test_rows_of_one_episode_must_agree_on_its_cost() -> None:
    rows = [make_row("ep/0", 0, 2, member_cost=0.02), make_row("ep/0", 1, 2, member_cost=0.04)]
    with pytest.raises(ValueError, match="member_cost"):
        build_event_table(rows)


def test_rollout_rows_carry_the_envs_member_cost() -> None:
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow="routed", member_cost=0.05), PolicyMap.shared(EchoPolicy())
    )
    batch = collector.collect([0, 1], group_size=3, seed=7)
    table = build_event_table(batch.rows)
    sent = {ep.episode_id: max(k for k, t in zip(ep.ks, ep.event_types, strict=True) if t == "propose")
            for ep in batch.episodes}  # fmt: skip
    for n, episode in enumerate(table.episode_ids):
        assert float(table.episode_member_cost[n]) == pytest.approx(0.05 * sent[episode])
    # the table without the cost holds the outcome alone: the reward plus what was charged
    assert torch.allclose(
        table.without_member_cost().episode_outcome, table.episode_outcome + table.episode_member_cost
    )


def test_the_trainer_takes_the_cost_apart_when_configured(tiny_model_dir, tmp_path) -> None:  # noqa: ANN001
    trainer = Trainer(update_check_config(tiny_model_dir, tmp_path), log=None)
    table = build_event_table(_group([0.0, 0.0, 1.0, 1.0], [0.02, 0.06, 0.02, 0.06]))
    joint = trainer.updater.advantages(table)
    trainer.reconfigure(member_cost_advantage="apart")
    apart = trainer.updater.advantages(table)
    expected = get_adv_estimator("srpo")(table.without_member_cost(), AdvantageConfig()).advantages
    assert torch.allclose(apart.advantages, expected + member_cost_advantages(table))
    assert torch.allclose(apart.advantages, torch.tensor([-0.98, -1.02, 1.02, 0.98], dtype=torch.float64), atol=1e-5)
    assert not torch.allclose(apart.advantages, joint.advantages)
    assert apart.stats["actor/member_cost_adv_abs"] == pytest.approx(0.02)
