"""Shared-prefix update forward vs the per-row forward: time and activation memory of forward + backward.

    python -m benchmarks.perf.bench_prefix [--forward-rows 64] [--repeats 3]
    python -m benchmarks.perf.bench_prefix --generation [--threads 1]   # prefill sharing in HFPolicy.generate

Rows shaped like one quick-math SRPO batch (16 tasks x G=8, proposers-aggregator): 384 proposer rows on
16 distinct prompts (each prompt 24 times: 8 rollouts x 3 proposers) and 128 aggregator rows with
their own longer prompts (the question plus three candidates); responses of 8..48 tokens. The prompts
are real quick-math proposer prompts in ``mini-sft``'s chat template; response and candidate tokens are
random ids (cost does not depend on their values). Rows are chunked ``--forward-rows`` at a time after
sorting by prompt (what a trainer does to keep a prompt's rows together), and each chunk runs
forward -> log-probs -> weighted sum -> backward, either through the per-row layout
(:func:`learners.batching.collate` + one forward + :func:`learners.batching.gather_response_logprobs`)
or :func:`learners.prefix.shared_prefix_logprobs`, or (``tree``) the whole batch in one
:func:`learners.prefix.packed_logprobs` call (the trainer's ``prefix_tree`` path; random response
tokens share no prefixes, so this understates its saving on real rollouts). Reported per path: the median over ``--repeats``
interleaved passes of the wall and process-CPU time per 1k response tokens, the positions forwarded, and the activation
memory autograd saves for backward (bytes of distinct storages, summed over chunks: the memory a single
backward over the minibatch holds; one chunk's share is what a per-micro-batch backward holds). The
largest log-prob difference between the paths is printed as a check.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from learners.batching import collate, gather_response_logprobs
from learners.prefix import packed_logprobs, prefix_tree_size, shared_prefix_logprobs

MODEL = Path(__file__).resolve().parents[2] / "agents" / "checkpoints" / "mini-sft"
SYSTEM = "You solve math problems step by step and end with the final answer in \\boxed{}."
OBSERVATION = "Problem: {problem}\nRole: proposer. Solve the problem and put the final answer in \\boxed{{}}."


def build_rows(tokenizer: Any, tasks: int, group: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, response_ids) pairs with the sharing pattern of a proposers-aggregator batch."""
    from srpo_envs.tasks.procedural import make_arithmetic_tasks

    rng = random.Random(seed)
    vocab = int(tokenizer.vocab_size)
    problems = [t.problem for t in make_arithmetic_tasks(tasks, difficulty=2, max_operand=9, seed=seed)]
    rows = []
    for problem in problems:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": OBSERVATION.format(problem=problem)},
        ]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])  # as agents.hf.encode_request
        for _ in range(3 * group):  # every proposer of every rollout reads the same prompt
            rows.append((prompt, [rng.randrange(4, vocab) for _ in range(rng.randint(8, 48))]))
        for _ in range(group):  # the aggregator reads its episode's three candidates: a prompt of its own
            candidates = [rng.randrange(4, vocab) for _ in range(3 * rng.randint(8, 48))]
            rows.append((prompt + candidates, [rng.randrange(4, vocab) for _ in range(rng.randint(8, 48))]))
    return rows


class SavedBytes:
    """Bytes of distinct storages autograd saves for backward while active."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        self.seen[s.data_ptr()] = s.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def per_row(model: Any, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    rows = [
        SimpleNamespace(
            prompt_ids=p,
            response_ids=r,
            response_mask=[1] * len(r),
            behaviour_logprobs=[0.0] * len(r),
            reward=0.0,
        )
        for p, r in zip(prompts, responses, strict=True)
    ]
    batch = collate(rows, pad_id=0)  # type: ignore[arg-type]  # collate reads only these fields
    logits = model(**batch.model_inputs(), logits_to_keep=batch.response_width + 1).logits
    return gather_response_logprobs(logits, batch) * batch.response_attention


def shared(model: Any, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    return shared_prefix_logprobs(model, prompts, responses)[0]


def tree(model: Any, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    return packed_logprobs(model, prompts, responses, pack_len=512)[0]


def one_pass(
    model: Any, fn: Callable[..., torch.Tensor], chunks: list[list[tuple[list[int], list[int]]]]
) -> tuple[float, float, int, list[torch.Tensor]]:
    """Forward + backward chunk by chunk: wall and CPU seconds, saved bytes summed over chunks, log-probs."""
    saved = 0
    out = []
    t0, c0 = time.perf_counter(), time.process_time()
    for chunk in chunks:
        meter = SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
            lp = fn(model, [p for p, _ in chunk], [r for _, r in chunk])
        lp.sum().backward()
        saved += meter.total
        out.append(lp.detach())
    return time.perf_counter() - t0, time.process_time() - c0, saved, out


def generation_ab(model_dir: str, tasks: int, group: int, new: int, repeats: int) -> None:
    """Shared-prefix prefill off/on, interleaved: the proposer round of a quick-math batch (every
    task's prompt sampled 3 x ``group`` times, per-request seeds), ``new`` tokens each (EOS ignored)."""
    from agents.hf import HFPolicy
    from agents.policy import GenerationRequest, SamplingParams
    from srpo_envs.tasks.procedural import make_arithmetic_tasks

    policy = HFPolicy(model_dir)
    problems = [t.problem for t in make_arithmetic_tasks(tasks, difficulty=2, max_operand=9, seed=0)]
    requests = [
        GenerationRequest(
            f"proposer_{j % 3}",
            "proposer",
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": OBSERVATION.format(problem=problem)},
            ],
            SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=1000 * i + j),
        )
        for i, problem in enumerate(problems)
        for j in range(3 * group)
    ]
    walls: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, list[list[int]]] = {}
    for _ in range(repeats):
        for share in (False, True):
            policy.share_prefix = share
            t0, c0 = time.perf_counter(), time.process_time()
            gens = policy.generate(requests)
            walls[share].append(time.perf_counter() - t0)
            cpus[share].append(time.process_time() - c0)
            outputs[share] = [g.token_ids for g in gens]
    n_tok = sum(len(t) for t in outputs[True])
    print(
        f"generation: {len(requests)} requests, {len(problems)} distinct prompts, {n_tok} tokens; "
        f"same tokens with and without sharing: {outputs[True] == outputs[False]}"
    )
    for share in (False, True):
        w, c = statistics.median(walls[share]), statistics.median(cpus[share])
        print(
            f"share_prefix={share!s:5s} wall {1000 * w / n_tok:.3f} s/1k tokens, CPU {1000 * c / n_tok:.3f} s/1k tokens"
        )
    ratio = statistics.median(b / a for a, b in zip(cpus[False], cpus[True], strict=True))
    print(f"shared/unshared CPU time: {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--forward-rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument(
        "--generation", action="store_true", help="time the prefill sharing of generation instead"
    )
    ap.add_argument("--new", type=int, default=48, help="--generation: new tokens per request")
    args = ap.parse_args()
    if min(args.tasks, args.group, args.forward_rows, args.repeats) < 1:
        ap.error("--tasks, --group, --forward-rows and --repeats must be >= 1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.generation:
        generation_ab(args.model, args.tasks, args.group, args.new, args.repeats)
        return
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    rows = sorted(build_rows(tokenizer, args.tasks, args.group, seed=0), key=lambda r: (len(r[0]), r[0]))
    chunks = [rows[i : i + args.forward_rows] for i in range(0, len(rows), args.forward_rows)]
    tokens = sum(len(r) for _, r in rows)
    positions = {
        "per-row": sum(len(c) * (max(len(p) for p, _ in c) + max(len(r) for _, r in c)) for c in chunks),
        "shared": sum(
            len({tuple(p) for p, _ in c}) * max(len(p) for p, _ in c)
            + len(c) * (max(len(r) for _, r in c) - 1)
            for c in chunks
        ),
        "tree": prefix_tree_size([p + r for p, r in rows]),
    }
    fns = {"per-row": per_row, "shared": shared, "tree": tree}
    # the prefix tree takes the whole batch in one call (it packs its own sequences, as the trainer does)
    batches = {"per-row": chunks, "shared": chunks, "tree": [rows]}
    times: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    saved: dict[str, int] = {}
    lps: dict[str, list[torch.Tensor]] = {}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            model.zero_grad(set_to_none=True)
            s, c, b, lp = one_pass(model, fn, batches[name])
            times[name].append(s)
            cpu[name].append(c)
            saved[name], lps[name] = b, lp
    ref = torch.zeros(len(rows), max(len(r) for _, r in rows))
    for i, lp in enumerate(lps["per-row"]):
        ref[i * args.forward_rows : i * args.forward_rows + lp.shape[0], : lp.shape[1]] = lp
    diff_shared = max((a - b).abs().max().item() for a, b in zip(lps["per-row"], lps["shared"], strict=True))
    diff_tree = (lps["tree"][0] - ref).abs().max().item()
    n_prompts = len({tuple(p) for p, _ in rows})
    print(
        f"{len(rows)} rows, {n_prompts} distinct prompts, {tokens} response tokens, "
        f"{len(chunks)} chunks of <= {args.forward_rows} rows; max |log-prob diff| vs per-row: shared {diff_shared:.2e}, tree {diff_tree:.2e}"
    )
    for name in fns:
        med, med_cpu = statistics.median(times[name]), statistics.median(cpu[name])
        print(
            f"{name:8s} wall {1000 * med / tokens:.3f} s/1k tokens, CPU {1000 * med_cpu / tokens:.3f} s/1k tokens  "
            f"positions {positions[name]:>7d}  saved for backward {saved[name] / 1024**2:.0f} MiB"
        )
    for name in ("shared", "tree"):
        ratio = statistics.median(s / p for s, p in zip(times[name], times["per-row"], strict=True))
        ratio_cpu = statistics.median(s / p for s, p in zip(cpu[name], cpu["per-row"], strict=True))
        print(
            f"{name}/per-row: wall time {ratio:.2f}, CPU time {ratio_cpu:.2f}, "
            f"saved memory {saved[name] / saved['per-row']:.2f}"
        )


if __name__ == "__main__":
    main()
