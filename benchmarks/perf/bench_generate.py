"""Rollout generation throughput: ``HFPolicy.generate`` vs a bare ``model.generate``.

    python -m benchmarks.perf.bench_generate [--model DIR] [--size small] [--batch 32] [--new 64]

Both sides get the same left-padded batch of chat prompts of mixed lengths (procedural math problems
in the chat template), sample at temperature 1 / top-p 1 for exactly ``--new`` tokens (EOS ignored by
``HFPolicy``, suppressed with ``min_new_tokens`` in ``generate``; top-k off), and report generated
tokens per second (best of ``--repeats`` interleaved rounds). The overhead is what ``HFPolicy`` costs on top of the bare
loop for its per-request seeds, exact log-probs and stop handling; the target is <= 20%.

A second line shows the rollout case ``generate`` cannot express: per-request ``max_new_tokens``
spread over [new/4, new]. ``HFPolicy`` drops finished rows from the batch; ``generate`` has to run the
whole batch to the longest request, so its useful tokens/s is what it generated for the rows that
wanted them.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable

import torch

from agents.hf import HFPolicy, render_chat
from agents.policy import GenerationRequest, SamplingParams


def _prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    try:
        from srpo_envs.tasks.procedural import make_arithmetic_tasks

        problems = [t.problem for t in make_arithmetic_tasks(n, seed=seed)]
    except ImportError:  # older trees: any mixed-length text will do
        problems = [f"Compute {i} + {i * 7} - {i % 5}." for i in range(n)]
    rng = random.Random(seed)
    roles = ["solver", "verifier", "proposer", "aggregator"]
    out = []
    for i, problem in enumerate(problems):
        extra = " Show your work step by step." * rng.randint(0, 6)  # prompt lengths vary like a rollout's
        out.append(
            [
                {"role": "system", "content": f"You are the {roles[i % len(roles)]}.{extra}"},
                {"role": "user", "content": problem},
            ]
        )
    return out


class _ForwardClock:
    """Time spent inside the model's forward (module hooks, so ``generate``'s own checks still see the
    real ``forward`` signature). Total minus this is the decoding loop's own cost, which -- unlike the
    forward -- barely moves when other jobs share the CPU."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds = 0.0
        self._start = 0.0
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, *_: object) -> None:
        self._start = time.perf_counter()

    def _post(self, *_: object) -> None:
        self.seconds += time.perf_counter() - self._start


def _interleaved(
    fns: list[Callable[[], int]], repeats: int, clock: _ForwardClock
) -> list[tuple[float, int, float]]:
    """Best total time, tokens and best non-forward time of each function over ``repeats`` rounds,
    alternating them so load spikes on a shared machine hit both sides alike."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    loop = [float("inf")] * len(fns)
    tokens = [0] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            clock.seconds = 0.0
            start = time.perf_counter()
            tokens[k] = fn()
            elapsed = time.perf_counter() - start
            best[k] = min(best[k], elapsed)
            loop[k] = min(loop[k], elapsed - clock.seconds)
    return list(zip(best, tokens, loop, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model directory or hub id (default: a fresh tiny model)")
    parser.add_argument("--size", default="small", choices=["tiny", "small", "base"])
    parser.add_argument("--arch", default="qwen2", choices=["llama", "qwen2"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new", type=int, default=64, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            from agents.tiny import init_tiny

            info = init_tiny(tmp, size=args.size, arch=args.arch, seed=0)
            path = tmp
            print(f"model: fresh {args.arch}/{args.size} ({info.n_params:,} params, vocab {info.vocab_size})")
        policy = HFPolicy(path, device=args.device, max_batch_size=args.batch)
    model, tok = policy.model, policy.tokenizer
    model.eval()
    chats = _prompts(args.batch, seed=0)
    requests = [
        GenerationRequest(
            f"a{i}",
            "r",
            c,
            SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new, seed=i, ignore_eos=True),
        )
        for i, c in enumerate(chats)
    ]

    # the same left-padded batch for the bare loop
    tok.padding_side = "left"
    texts = [render_chat(tok, c) for c in chats]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
    lengths = enc["attention_mask"].sum(-1)
    print(
        f"batch {args.batch}, prompt tokens {int(lengths.min())}-{int(lengths.max())}, {args.new} new tokens, "
        f"{torch.get_num_threads()} threads, {args.device}"
    )

    def bare() -> int:
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                pad_token_id=policy.pad_id,
            )
        return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]

    def ours() -> int:
        return sum(len(g.token_ids) for g in policy.generate(requests))

    clock = _ForwardClock(model)
    (t_bare, n_bare, l_bare), (t_ours, n_ours, l_ours) = _interleaved([bare, ours], args.repeats, clock)
    assert n_bare == n_ours == args.batch * args.new, (n_bare, n_ours)
    overhead = 100.0 * (t_ours - t_bare) / t_bare
    print(f"{'':22s} {'tokens':>8s} {'seconds':>9s} {'tokens/s':>10s} {'loop s (outside forward)':>26s}")
    print(f"{'model.generate':22s} {n_bare:8d} {t_bare:9.3f} {n_bare / t_bare:10.0f} {l_bare:26.3f}")
    print(f"{'HFPolicy.generate':22s} {n_ours:8d} {t_ours:9.3f} {n_ours / t_ours:10.0f} {l_ours:26.3f}")
    print(f"overhead: {overhead:+.1f}% (target <= 20%)")

    rng = random.Random(1)
    uneven = [
        GenerationRequest(
            r.agent,
            r.role,
            r.prompt,
            SamplingParams(max_new_tokens=rng.randint(args.new // 4, args.new), seed=i, ignore_eos=True),
        )
        for i, r in enumerate(requests)
    ]
    wanted = sum(r.sampling.max_new_tokens for r in uneven)
    ((t_uneven, n_uneven, _),) = _interleaved(
        [lambda: sum(len(g.token_ids) for g in policy.generate(uneven))], args.repeats, clock
    )
    print(
        f"uneven lengths ({wanted} useful tokens): HFPolicy {n_uneven / t_uneven:.0f} tokens/s, "
        f"model.generate to the longest {wanted / t_bare:.0f} useful tokens/s"
    )


if __name__ == "__main__":
    main()
