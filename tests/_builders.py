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


def update_check_config(model: Any, out: Any, **overrides: Any) -> Any:
    """A ``TrainConfig`` for comparing update paths: one iteration of 2 tasks x G=2 with 8 new tokens,
    no evaluation or checkpoints, lr 0 (the weights never move, so one trainer can run several
    updates on the same parameters) and no gradient clipping (the gradients compared are the raw ones)."""
    from learners.trainer import TrainConfig

    base: dict[str, Any] = dict(
        model=str(model),
        out_dir=str(out),
        iterations=1,
        tasks_per_iter=2,
        group_size=2,
        epochs=1,
        max_new_tokens=8,
        eval_every=0,
        save_every=0,
        lr=0.0,
        max_grad_norm=1e9,
    )
    return TrainConfig(**{**base, **overrides})


def checkpoint_run_config(model: Any, out: Any, **overrides: Any) -> Any:
    """A ``TrainConfig`` for checkpoint and resume tests: 2 iterations of one task x G=2 with 6 new
    tokens, a checkpoint after every iteration, no evaluation, lr 5e-3 (the weights move), seed 7."""
    from learners.trainer import TrainConfig

    base: dict[str, Any] = dict(
        model=str(model),
        out_dir=str(out),
        iterations=2,
        tasks_per_iter=1,
        group_size=2,
        epochs=1,
        max_new_tokens=6,
        eval_every=0,
        save_every=1,
        lr=5e-3,
        seed=7,
    )
    return TrainConfig(**{**base, **overrides})


def g0_wins(rows: Sequence[Row]) -> None:
    """Sample g0 of each task wins (reward 1, the others 0, minus any format penalty), so every group
    has a non-zero advantage whatever the model generated."""
    for r in rows:
        r.outcome_reward = 1.0 if r.episode_id.endswith("-g0") else 0.0
        r.reward = r.outcome_reward - r.penalty


def update_inputs(trainer: Any, seed: int = 3) -> tuple[Any, Any, Any, Any, str]:
    """``(table, advantages, minibatch, loss_fn, unit)`` of a fresh rollout of tasks 0 and 1 (G=2,
    :func:`g0_wins`), the whole batch as one unshuffled minibatch: the arguments of
    ``PolicyUpdate.minibatch_step``."""
    from learners.batching import build_event_table, event_minibatches
    from learners.losses import get_policy_loss

    batch = trainer.collector.collect([0, 1], group_size=2, seed=seed)
    g0_wins(batch.rows)
    table = build_event_table(batch.rows)
    adv = trainer.updater.advantages(table)
    mb = event_minibatches(table, shuffle=False)[0]
    loss_fn = get_policy_loss(trainer.algorithm.loss)
    return table, adv, mb, loss_fn, loss_fn.unit(trainer.updater.loss_config())
