"""Task sources for srpo envs: bundled benchmark data, user datasets and procedural families."""

from srpo_envs.tasks.math_data import MATH_DATASETS, MathTask, load_math

__all__ = ["MATH_DATASETS", "MathTask", "load_math"]
