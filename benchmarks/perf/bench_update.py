"""Update-step cost of the SRPO loss vs the GRPO loss on the same rows.

SRPO only changes the loss head (a scatter-add of member log-ratios per event instead of a
per-token ratio), so a policy update should cost the same as GRPO's: target ``SRPO / GRPO <= 1.05``.

What is timed, per loss: one pass over the same event-atomic minibatches of synthetic rows, each
minibatch doing forward -> :func:`gather_response_logprobs` -> loss -> backward -> AdamW step, on a
tiny randomly initialised Llama (no download). Collation and advantages are computed once, outside
the timing (they happen once per batch, not per step). The two losses run on two identical model
copies, interleaved minibatch by minibatch so machine load hits both alike. Reported: the median
pass time per 1k *response* tokens (the tokens the loss covers), the ratio of the medians, and the
headline ratio: the median over repeats of the paired per-repeat ratio, which is what the target is
checked against (robust on a shared CPU). A "head" column times the two loss functions alone
(forward + backward) on fixed ``[R, T]`` log-probs to show the loss's own overhead.

    python -m benchmarks.perf.bench_update           # --quick (default), < 60 s on 2 CPU cores
    python -m benchmarks.perf.bench_update --full    # more rows and repeats
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from agents.rows import Row
from learners.advantages import AdvantageConfig, event_advantages_from_rows, get_adv_estimator
from learners.batching import Batch, MiniBatch, build_event_table, event_minibatches, gather_response_logprobs
from learners.losses import grpo_loss, srpo_loss

PAD_ID = 0


def build_model(vocab: int, hidden: int, layers: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def synthetic_rows(n_rows: int, vocab: int, seed: int, group_size: int = 4) -> list[Row]:
    """Events with K in 1..4 (complete), G rollouts per task, env-inserted tokens masked out."""
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    ev = 0
    outcome = 0.0
    while len(rows) < n_rows:
        k = int(rng.integers(1, 5))
        task = ev // (2 * group_size)
        episode = ev // 2
        if ev % 2 == 0:  # one team outcome per episode (two events each)
            outcome = float(rng.integers(0, 2))
        reward = outcome - 0.1 * float(rng.random() < 0.2)  # event reward: outcome minus a format penalty
        for m in range(k):
            t = int(rng.integers(32, 65))
            mask = [1] * t
            if rng.random() < 0.3:  # a tool result spliced into the response: not the policy's tokens
                start = int(rng.integers(0, t - 8))
                mask[start : start + 8] = [0] * 8
            rows.append(
                Row(
                    event_id=f"ep{episode}/{ev % 2}",
                    episode_id=f"ep{episode}",
                    pre_state_id="s",
                    event_type="propose" if ev % 2 == 0 else "aggregate",
                    step=ev % 2,
                    agent=f"agent{m}",
                    role=f"role{m % 2}",
                    member_index=m,
                    k=k,
                    prompt_ids=rng.integers(1, vocab, int(rng.integers(16, 49))).tolist(),
                    response_ids=rng.integers(1, vocab, t).tolist(),
                    response_mask=mask,
                    behaviour_logprobs=[0.0] * t,  # replaced by the model's own below
                    policy_version=0,
                    task_id=f"task{task}",
                    group_id=f"g{task}",
                    reward=reward,
                    outcome_reward=outcome,
                )
            )
        ev += 1
    return rows


@torch.no_grad()
def set_behaviour_logprobs(
    model: torch.nn.Module, minibatches: list[MiniBatch], batches: list[Batch]
) -> None:
    """Behaviour = current model + small noise, so ratios differ from 1 and some events clip."""
    g = torch.Generator().manual_seed(0)
    for mb, b in zip(minibatches, batches, strict=True):
        lp = gather_response_logprobs(model(**b.model_inputs()).logits, b).float().cpu()
        lp = lp + 0.05 * torch.randn(lp.shape, generator=g)
        b.old_logprobs.copy_(lp.to(b.old_logprobs.device))
        for i, row in enumerate(mb.rows):
            row.behaviour_logprobs = lp[i, : len(row.response_ids)].tolist()


def make_step(
    kind: str, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> Callable[[Batch, torch.Tensor], None]:
    def step(batch: Batch, adv: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        out = model(**batch.model_inputs(), logits_to_keep=batch.response_width + 1)
        lp = gather_response_logprobs(out.logits, batch)
        if kind == "srpo":
            loss, _ = srpo_loss(lp, batch.old_logprobs, batch.response_mask, batch.event_index, adv)
        else:
            loss, _ = grpo_loss(lp, batch.old_logprobs, batch.response_mask, adv)
        loss.backward()
        opt.step()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="64 rows, up to 9 repeats within 30 s (default)")
    mode.add_argument("--full", action="store_true", help="256 rows, 15 repeats")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--rows-per-batch", type=int, default=16)
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU intra-op threads (default 1: spin-waiting thread pools make timings erratic on a shared CPU)",
    )
    ap.add_argument(
        "--budget-s", type=float, default=None, help="stop repeating after this many seconds (quick: 30)"
    )
    args = ap.parse_args()
    n_rows = args.rows or (256 if args.full else 64)
    repeats = args.repeats or (15 if args.full else 9)
    if args.budget_s is None and not args.full:
        args.budget_s = 30.0  # keeps --quick under a minute even on a loaded machine (>= 3 repeats)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    vocab, hidden, layers = 1000, 128, 2

    t_start = time.perf_counter()
    rows = synthetic_rows(n_rows, vocab, args.seed)
    plan = event_minibatches(rows, rows_per_batch=args.rows_per_batch, seed=args.seed)
    minibatches = list(plan)
    batches = [mb.collate(PAD_ID).to(device) for mb in minibatches]
    base = build_model(vocab, hidden, layers, args.seed).to(device)
    set_behaviour_logprobs(base, minibatches, batches)

    event_ids, event_adv = event_advantages_from_rows(rows)
    event_map = dict(zip(event_ids, event_adv.tolist(), strict=True))
    row_adv = get_adv_estimator("grpo")(build_event_table(rows), AdvantageConfig(), None).advantages.tolist()
    row_map = {(r.event_id, r.member_index): a for r, a in zip(rows, row_adv, strict=True)}
    srpo_adv = [mb.event_values(event_map).to(device) for mb in minibatches]
    grpo_adv = [
        torch.tensor([row_map[(r.event_id, r.member_index)] for r in mb.rows], device=device)
        for mb in minibatches
    ]

    steps = {}
    for kind in ("srpo", "grpo"):
        model = copy.deepcopy(base).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        steps[kind] = make_step(kind, model, opt)
    advs = {"srpo": srpo_adv, "grpo": grpo_adv}

    def timed_step(kind: str, i: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        steps[kind](batches[i], advs[kind][i])
        sync(device)
        return time.perf_counter() - t0

    for kind in steps:  # warm-up (allocator, kernels)
        for i in range(len(batches)):
            timed_step(kind, i)
    # SRPO and GRPO steps alternate minibatch by minibatch (order flipped each time), so both see the
    # same machine load; a shared, noisy CPU then shifts the paired per-repeat ratio far less than
    # the separate medians.
    times: dict[str, list[float]] = {"srpo": [], "grpo": []}
    t_bench = time.perf_counter()
    for r in range(repeats):
        total = {"srpo": 0.0, "grpo": 0.0}
        for i in range(len(batches)):
            for kind in ("srpo", "grpo") if (r + i) % 2 == 0 else ("grpo", "srpo"):
                total[kind] += timed_step(kind, i)
        for kind in total:
            times[kind].append(total[kind])
        if args.budget_s is not None and r >= 2 and time.perf_counter() - t_bench > args.budget_s:
            break
    n_done = len(times["srpo"])

    # loss head alone: forward + backward of the loss on fixed log-probs of the largest minibatch
    big = max(range(len(batches)), key=lambda i: batches[i].num_rows)
    b, n_loss = batches[big], 200
    lp_leaf = b.old_logprobs.clone().add_(0.01).requires_grad_(True)
    head = {
        "srpo": lambda: srpo_loss(lp_leaf, b.old_logprobs, b.response_mask, b.event_index, srpo_adv[big])[0],
        "grpo": lambda: grpo_loss(lp_leaf, b.old_logprobs, b.response_mask, grpo_adv[big])[0],
    }
    head_us = {}
    for kind, fn in head.items():
        fn().backward()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n_loss):
            fn().backward()
        sync(device)
        head_us[kind] = (time.perf_counter() - t0) / n_loss * 1e6

    resp_tokens = sum(len(r.response_ids) for mb in minibatches for r in mb.rows)
    loss_tokens = sum(mb.num_loss_tokens for mb in minibatches)
    all_tokens = int(sum(int(b.attention_mask.sum()) for b in batches))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"device={device} threads={torch.get_num_threads()} model=llama(h={hidden}, L={layers}, V={vocab}) "
        f"rows={sum(mb.num_rows for mb in minibatches)} events={sum(mb.num_events for mb in minibatches)} "
        f"minibatches={len(minibatches)} dropped_events={plan.dropped_events}"
    )
    print(f"tokens: response={resp_tokens} loss(masked)={loss_tokens} prompt+response={all_tokens}")
    print(
        f"{'loss':<6}{'median pass (ms)':>18}{'ms / 1k resp tok':>18}{'min (ms)':>10}{'max (ms)':>10}{'head (us)':>11}"
    )
    for kind in ("srpo", "grpo"):
        print(
            f"{kind:<6}{med[kind] * 1e3:>18.1f}{med[kind] * 1e6 / resp_tokens:>18.2f}"
            f"{min(times[kind]) * 1e3:>10.1f}{max(times[kind]) * 1e3:>10.1f}{head_us[kind]:>11.0f}"
        )
    paired = statistics.median(s / g for s, g in zip(times["srpo"], times["grpo"], strict=True))
    verdict = "OK" if paired <= 1.05 else "ABOVE TARGET"
    print(f"ratio srpo/grpo of median update times = {med['srpo'] / med['grpo']:.3f}")
    print(f"ratio srpo/grpo, median of paired repeats = {paired:.3f}  (target <= 1.05: {verdict})")
    load = f", load avg {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"wall {time.perf_counter() - t_start:.1f} s, repeats={n_done}{load}")


if __name__ == "__main__":
    main()
