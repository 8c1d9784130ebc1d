"""The algorithm table: a name -> (advantage estimator, policy loss, defaults) the trainer looks up.

The trainer never branches on the algorithm's name: it reads the :class:`Algorithm` registered
under ``TrainConfig.algo`` and calls the estimator from :data:`learners.advantages.ADV_ESTIMATORS`
and the loss from :data:`learners.losses.POLICY_LOSSES` named there. ``defaults`` fill the
:class:`~learners.config.TrainConfig` fields the user left unset (``None``), e.g. Dr.GRPO's
aggregation and advantage scale, GSPO's clip range (``clip_eps`` / ``clip_eps_high``; a user's
``clip_eps`` replaces both, see :meth:`~learners.config.TrainConfig.clip_range`). An algorithm with ``critic=True`` gets a centralised value critic
(its estimator receives the critic's per-event values).

Adding an algorithm = registering its estimator and/or loss and one :func:`register_algorithm`
call; no edit to the training loop::

    from learners.algorithms import register_algorithm
    from learners.losses import register_policy_loss

    @register_policy_loss("my-pg", unit="tokens")
    def my_pg(logprobs, old_logprobs, mask, advantages, event_index, cfg):
        ...
        return loss, {}

    register_algorithm("my-algo", estimator="grpo", loss="my-pg")
    # srpo train --algo my-algo ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from learners.advantages import ADV_ESTIMATORS
from learners.losses import POLICY_LOSSES
from srpo_common import plugins

__all__ = ["ALGORITHMS", "Algorithm", "get_algorithm", "register_algorithm"]


@dataclass(frozen=True)
class Algorithm:
    """What ``TrainConfig.algo`` resolves to.

    Attributes:
        estimator: name in :data:`learners.advantages.ADV_ESTIMATORS`.
        loss: name in :data:`learners.losses.POLICY_LOSSES`.
        defaults: values for the ``TrainConfig`` fields left ``None`` (``agg``, ``adv_scale``,
            ``clip_eps``, ``clip_eps_high``...).
        critic: train a centralised value critic beside the policy (MAPPO).
        description: one line for ``--help``.
    """

    estimator: str
    loss: str
    defaults: dict[str, Any] = field(default_factory=dict)
    critic: bool = False
    description: str = ""


ALGORITHMS: dict[str, Algorithm] = {}
"""Algorithm name -> :class:`Algorithm`."""
plugins.watch("algorithm", ALGORITHMS)  # type: ignore[arg-type]  # a plugin may add, not replace


def register_algorithm(
    name: str,
    estimator: str,
    loss: str,
    defaults: dict[str, Any] | None = None,
    critic: bool = False,
    description: str = "",
) -> Algorithm:
    """Register (or replace) an algorithm; the estimator and loss must already be registered."""
    if estimator not in ADV_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {sorted(ADV_ESTIMATORS)}")
    if loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {loss!r}; known: {sorted(POLICY_LOSSES)}")
    algo = Algorithm(estimator, loss, dict(defaults or {}), critic, description)
    ALGORITHMS[name] = algo
    return algo


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; an unknown name raises with the known ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {sorted(ALGORITHMS)}") from None


register_algorithm("srpo", "srpo", "srpo", description="event-level ratio over the K members of an event")
register_algorithm(
    "grpo", "grpo", "grpo", description="group-relative per-output advantage, token-level clip"
)
register_algorithm(
    "dr-grpo",
    "grpo",
    "grpo",
    defaults={"agg": "seq-mean-token-sum-norm", "adv_scale": "none"},
    description="GRPO without std division and with a constant length normaliser",
)
register_algorithm(
    "gspo",
    "grpo",
    "gspo",
    # The paper's clip range (Zheng et al. 2025): the ratio is a geometric mean over the
    # output's tokens, so it stays within ~1e-3 of 1 where a token ratio moves by ~0.1; PPO's 0.2
    # would almost never clip it.
    defaults={"clip_eps": 3e-4, "clip_eps_high": 4e-4},
    description="sequence-level, length-normalised ratio and clip (clip 3e-4 / 4e-4)",
)
register_algorithm("dr-mas", "dr-mas", "grpo", description="agent-wise advantage normalisation")
register_algorithm("at-grpo", "at-grpo", "grpo", description="groups keyed by agent and turn")
register_algorithm("rloo", "rloo", "grpo", description="leave-one-out baseline")
register_algorithm("mappo", "gae", "ppo", critic=True, description="GAE with a centralised critic")
