"""TRL's ``GRPOTrainer`` trains a tiny model on an srpo env through TRL's ``rollout_func`` hook (TRL 1.16).

    pip install -e '.[trl]'          # in .[all]: trl==1.16.*, on the project's torch and transformers
    python examples/trl_grpo.py [--steps 2] [--model agents/checkpoints/mini-columns-sft]

The env is the quick-columns suite's (``ProcArith-v0``, column arithmetic of difficulty 2-3, three
proposers then an aggregator) and the model its warm start, the shipped ``mini-columns-sft`` (4.7 MB, on
CPU in seconds). ``rollout_func`` plays whole episodes with srpo's own rollout collector
(:class:`agents.rollout.RolloutCollector`) on the model TRL is training (an :class:`agents.hf.HFPolicy`
around the same module, so every generation samples the current weights), and hands TRL, for each of
its prompt rows, ``proposer_0``'s output of that episode: its exact prompt and response token ids and
behaviour log-probs, plus the env's reward for it (``env_reward``, read by the reward function).

**Which hook.** TRL 1.16 has two: ``environment_factory`` exposes an environment's public methods as
*tools* the model calls inside one chat (it needs a tool-calling chat template; the env's ``reset``
text is appended to the prompt and ``get_reward`` scores the finished chat) and ``rollout_func``
(``prompts, trainer -> {"prompt_ids", "completion_ids", "logprobs", ...}``) replaces generation. An srpo
env is not a tool of one agent: each event's action is the whole text of every agent of its active set,
so ``rollout_func`` is the hook that fits (and the tiny models' template has no tool calls).

**What a multi-agent env needs that the hook does not give.** The hook's unit is one completion per
prompt row, scored by one scalar and compared within a group of ``num_generations`` rows of one prompt.

* *Events with several members.* An episode here has two events: ``propose`` (K=3 members acting on the
  same state) and ``aggregate`` (K=1, reading the proposals). TRL takes one row per episode, so 3 of
  the 4 outputs an episode generates (``proposer_1``, ``proposer_2``, the aggregator) are sampled but
  never trained: the example prints the count. ``env_mask`` splices env text into *one* sequence (a
  single agent's multi-turn transcript); parallel members and roles that read different prompts are
  not one sequence.
* *A per-event set ratio.* SRPO clips the event's joint ratio (``exp(sum_j l_j / c(K))`` over its
  members, :func:`learners.losses.srpo_loss`) with one advantage per event, compared across the G
  rollouts by (task, event type, step); TRL's ratio and clip are per completion token/sequence.
* *The active set.* Which agents act, and how many events an episode has, is decided during the
  episode (a router picks k proposers; a verifier's reject adds a revise and a verify). TRL's batch
  is a fixed ``prompts x num_generations`` grid of single rows; a varying set of rows per episode,
  and groups whose events exist in only some rollouts, have no place in it.
* *Roles with separate adapters.* TRL trains one model (one PEFT adapter); srpo's ``--sharing
  per-role|lora`` gives every role its own weights or LoRA adapter, each updated on its own rows.
* *Per-agent credit.* The env writes a reward per agent and per event (an invalid output's format
  penalty lands on its own event); TRL gets one scalar per completion.

**What srpo's own trainer gives instead** (``srpo train``, :mod:`learners.trainer`): every member of
every event becomes a training row (:class:`agents.rows.Row`), advantages are computed per event and
compared by (task, event type, step) across the G rollouts (SRPO, AT-GRPO; per output for GRPO, RLOO,
Dr. MAS; GAE with a centralised critic on the shared state for MAPPO), the loss clips SRPO's event set
ratio, batches hold whatever active sets the episodes produced, and roles train shared, per-role or
per-LoRA-adapter weights; with vLLM it adds truncated importance sampling.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "agents" / "checkpoints" / "mini-columns-sft"
ENV_ID = "ProcArith-v0"
#: the quick-columns suite's env (benchmarks.presets.TRAINING_ENVS["quick-columns"])
ENV_KWARGS: dict[str, Any] = {"dataset": "procedural-columns", "difficulty": [2, 3]}
#: the agent whose output is TRL's completion (the first proposer: its prompt is the task itself)
TRAINED_AGENT = "proposer_0"


def build_dataset(env_fn: Any, prompts: Any, tasks: int) -> list[dict[str, Any]]:
    """One row per task: TRL's ``prompt`` (the trained agent's first chat) and the env's task index."""
    env = env_fn()
    rows = []
    for t in range(tasks):
        obs, infos = env.reset(seed=0, options={"task_index": t})
        if TRAINED_AGENT not in env.active_agents:
            raise ValueError(f"{ENV_ID}'s first event has no {TRAINED_AGENT} (active: {env.active_agents})")
        role = infos[TRAINED_AGENT]["role"]
        rows.append({"prompt": prompts.messages(role, obs[TRAINED_AGENT]), "task_index": t})
    env.close()
    return rows


def make_rollout_func(env_fn: Any, dataset: list[dict[str, Any]], tokenizer: Any, temperature: float, log: list):
    """TRL's ``rollout_func``: whole srpo episodes per prompt row, the trained agent's output returned."""
    from agents.hf import HFPolicy, encode_request
    from agents.policy import GenerationRequest, PolicyMap, SamplingParams
    from agents.rollout import RolloutCollector

    task_of = {json.dumps(r["prompt"]): r["task_index"] for r in dataset}
    calls = {"n": 0}
    cache: dict[str, Any] = {}

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        g = trainer.num_generations
        tasks = [task_of[json.dumps(p)] for p in prompts]
        groups = tasks[::g]
        if len(tasks) % g or tasks != [t for t in groups for _ in range(g)]:
            raise ValueError(f"expected each prompt {g} times in a row (TRL's RepeatSampler), got tasks {tasks}")
        model = trainer.accelerator.unwrap_model(trainer.model)
        if cache.get("model") is not model:  # the module TRL trains, wrapped once: generations see its weights
            policy = HFPolicy(model, tokenizer)
            sampling = SamplingParams(temperature=temperature, max_new_tokens=trainer.args.max_completion_length)
            cache.update(model=model, collector=RolloutCollector(env_fn, PolicyMap.shared(policy), sampling))
        batch = cache["collector"].collect(groups, group_size=g, seed=calls["n"])
        calls["n"] += 1
        by_episode: dict[str, list] = {}
        for row in batch.rows:
            by_episode.setdefault(row.episode_id, []).append(row)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_reward": []}
        for prompt, episode in zip(prompts, batch.episodes, strict=True):
            rows = by_episode[episode.episode_id]
            row = next(r for r in rows if r.agent == TRAINED_AGENT)
            expected = encode_request(tokenizer, GenerationRequest(TRAINED_AGENT, row.role, prompt))
            if row.prompt_ids != expected:  # what TRL logs as the prompt is what was generated from
                raise RuntimeError(f"episode {episode.episode_id}: {TRAINED_AGENT}'s prompt differs from TRL's")
            out["prompt_ids"].append(row.prompt_ids)
            out["completion_ids"].append(row.response_ids)
            out["logprobs"].append(row.behaviour_logprobs)
            out["env_reward"].append(row.reward)  # the team outcome minus this event's format penalty
        log.append(
            {
                "episodes": len(batch.episodes),
                "outputs": len(batch.rows),
                "trained": len(out["completion_ids"]),
                "events": sum(len(batch.events[e.episode_id]) for e in batch.episodes),
                "accuracy": batch.accuracy,
            }
        )
        return out

    return rollout_func


def env_reward(completions: list[Any], env_reward: list[float], **_: Any) -> list[float]:
    """The reward the env gave the trained agent's event (``rollout_func``'s extra field)."""
    return [float(r) for r in env_reward]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4, help="tasks per step (each x --generations episodes)")
    ap.add_argument("--generations", type=int, default=8, help="TRL's num_generations (episodes per task)")
    ap.add_argument("--tasks", type=int, default=16, help="dataset size (the env's first task indices)")
    ap.add_argument("--max-new", type=int, default=48, help="max new tokens per output")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if min(args.steps, args.prompts, args.generations, args.tasks) < 1 or args.generations < 2:
        ap.error("--steps, --prompts, --tasks must be >= 1 and --generations >= 2 (GRPO compares within a group)")

    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import srpo_envs
    from agents.prompts import prompts_for_env

    def env_fn() -> Any:
        return srpo_envs.make(ENV_ID, **ENV_KWARGS)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"  # TRL's requirement
    dataset = build_dataset(env_fn, prompts_for_env(env_fn()), args.tasks)
    rollouts: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=args.prompts * args.generations,
            gradient_accumulation_steps=1,
            num_generations=args.generations,
            max_completion_length=args.max_new,
            temperature=args.temperature,
            learning_rate=args.lr,
            beta=0.0,
            max_steps=args.steps,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=args.model,  # loaded in float32 by TRL
            reward_funcs=env_reward,
            args=config,
            train_dataset=Dataset.from_list(dataset),
            processing_class=tokenizer,
            rollout_func=make_rollout_func(env_fn, dataset, tokenizer, args.temperature, rollouts),
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        change = max(
            (p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters()
        )
    steps = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    for i, (h, r) in enumerate(zip(steps, rollouts, strict=False), 1):
        print(
            f"trl step {i}: loss {h['loss']:.4f} reward {h['reward']:.3f} reward_std {h['reward_std']:.3f} "
            f"frac_reward_zero_std {h['frac_reward_zero_std']:.2f} completion_len "
            f"{h['completions/mean_length']:.1f} | episodes {r['episodes']} events {r['events']} outputs "
            f"{r['outputs']} trained {r['trained']} team_accuracy {r['accuracy']:.3f}"
        )
    summary = {
        "steps": trainer.state.global_step,
        "max_abs_weight_change": change,
        "outputs": sum(r["outputs"] for r in rollouts),
        "trained": sum(r["trained"] for r in rollouts),
        "seconds": round(time.perf_counter() - started, 1),
        "torch": torch.__version__,
    }
    if not all(math.isfinite(h["loss"]) for h in steps):
        raise RuntimeError(f"non-finite loss: {steps}")
    print("trl_grpo: " + json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
