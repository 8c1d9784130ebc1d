"""vf-arith: a single-turn verifiers taskset written the way verifiers' own docs write one.

Three-digit sums; the rubric gives 1 when the last ``\\boxed{}`` of the reply is the sum. It uses nothing of
srpo: it is the other side of the door that ``Verifiers-v0`` opens (``make("Verifiers-v0",
taskset="vf-arith")``, with this directory on ``PYTHONPATH``). Its system prompt and its "Role: solver."
line are the phrasing srpo's shipped tiny math models were warm-started on, so that they start at about
half right here (docs/verifiers.md) and have something to learn.
"""

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["ArithTaskset"]

SYSTEM = "You solve math problems step by step and end with the final answer in \\boxed{}."
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        found = _BOXED.findall(trace.last_reply)
        return float(bool(found) and found[-1].strip() == str(self.data.answer))


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 256
    seed: int = 0
    min_operand: int = 100
    max_operand: int = 999


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> Iterator[ArithTask]:
        rng = random.Random(self.config.seed)
        for i in range(self.config.num_tasks):
            a, b = (rng.randint(self.config.min_operand, self.config.max_operand) for _ in range(2))
            prompt = f"Problem: Compute {a} + {b}.\nRole: solver. Solve the problem and put the final answer in \\boxed{{}}."
            data = ArithData(name=f"sum-{i}", prompt=prompt, system_prompt=SYSTEM, answer=a + b)
            yield ArithTask(data, self.config.task)
