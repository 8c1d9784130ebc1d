"""vf-guess: a multi-turn verifiers environment whose engine plays the user.

The engine thinks of a number in 1..16; the player guesses in ``\\boxed{}`` and hears "higher" or
"lower" until it is right or ``max_turns`` guesses are spent. Reward 1 for a hit, recorded on the
player's trace as OpenEnv's taskset in verifiers does. Nothing of srpo is used.
"""

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarnessConfig
from verifiers.v1.runtimes import SubprocessConfig

__all__ = ["GuessEnv", "GuessTaskset"]

_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    pass


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 64
    seed: int = 0


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterator[GuessTask]:
        rng = random.Random(self.config.seed)
        for i in range(self.config.num_tasks):
            yield GuessTask(GuessData(name=f"guess-{i}", prompt=None, secret=rng.randint(1, 16)), self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=SubprocessConfig())
    max_turns: int = 4


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret, hit = task.data.secret, 0.0
        message = "I am thinking of a number from 1 to 16. Guess it: answer with \\boxed{n}."
        async with agents.player.interaction(task) as interaction:
            for _ in range(self.config.max_turns):
                segment = await interaction.turn(message)
                if segment.terminated:
                    break
                found = _BOXED.findall(segment.last_reply)
                guess = int(found[-1]) if found else None
                if guess == secret:
                    hit = 1.0
                    break
                message = "No answer found." if guess is None else ("Higher." if guess < secret else "Lower.")
        interaction.trace.record_reward("hit", hit)
