"""Learners: the trainer, its config, and the registries of algorithms, advantage estimators and losses.

The main names import from the package itself (lazily: ``import learners`` loads no torch)::

    from learners import TrainConfig, Trainer

    trainer = Trainer(TrainConfig(model="agents/checkpoints/mini-columns-sft", env_id="ProcArith-v0"))
    batch = trainer.rollout(1)         # one iteration's rollouts: complete events only
    stats = trainer.update(batch, 1)   # the algorithm's update on them

docs/python.md is the page for training from Python.
"""

from srpo_common.lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": "learners.config",
    "Trainer": "learners.trainer",
    "train": "learners.trainer",
    "run_summary": "learners.trainer",
    "ALGORITHMS": "learners.algorithms",
    "Algorithm": "learners.algorithms",
    "get_algorithm": "learners.algorithms",
    "register_algorithm": "learners.algorithms",
    "register_adv_estimator": "learners.advantages",
    "register_policy_loss": "learners.losses",
    "register_tracker": "learners.tracking",
    "settings_for": "learners.profiles",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
