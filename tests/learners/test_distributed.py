"""Data-parallel learner: event-atomic sharding of a minibatch across ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agents.rows import Row
from learners.batching import event_minibatches, shard_minibatch
from tests._builders import make_row


def _rows(ks: list[int]) -> list[Row]:
    """Events of the given sizes, each member with its own response length (1..7 tokens)."""
    return [
        make_row(f"ep{e}/0", m, k, response=[7] * (1 + (3 * e + m) % 7), task_id="t")
        for e, k in enumerate(ks)
        for m in range(k)
    ]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("ks", [[1, 3, 2, 4, 1, 2], [4], [2, 2, 2, 2, 2, 2, 2, 2]])
def test_shards_partition_the_minibatch_by_whole_events(ks: list[int], world_size: int) -> None:
    (mb,) = event_minibatches(_rows(ks), seed=3)
    shards = [shard_minibatch(mb, r, world_size) for r in range(world_size)]
    # concatenated in rank order, the shards are the minibatch: nothing lost, duplicated or reordered
    assert [r for s in shards for r in s.rows] == mb.rows
    assert [e for s in shards for e in s.event_ids] == mb.event_ids
    assert torch.equal(torch.cat([s.row_index for s in shards]), mb.row_index)
    for s in shards:
        # whole events only, event_index renumbered 0..E_shard-1 in order
        assert s.event_index.tolist() == sorted(s.event_index.tolist())
        assert sorted(set(s.event_index.tolist())) == list(range(s.num_events))
        for e, event_id in enumerate(s.event_ids):
            members = [r for r, i in zip(s.rows, s.event_index.tolist(), strict=True) if i == e]
            assert {r.event_id for r in members} == {event_id}
            assert [r.member_index for r in members] == list(range(members[0].k))
    if world_size <= len(ks):  # enough events: every rank works, shares are about equal in tokens
        tokens = [sum(len(r.prompt_ids) + len(r.response_ids) for r in s.rows) for s in shards]
        assert min(tokens) > 0
        biggest_event = max(
            sum(len(r.prompt_ids) + len(r.response_ids) for r in mb.rows if r.event_id == e)
            for e in mb.event_ids
        )
        assert max(tokens) - min(tokens) <= 2 * biggest_event


def test_shard_rejects_bad_rank() -> None:
    (mb,) = event_minibatches(_rows([1, 2]), seed=0)
    with pytest.raises(ValueError):
        shard_minibatch(mb, 2, 2)


# --------------------------------------------------------------------------------------------------
# 2 gloo processes vs 1: the same update (DDP-style all-reduce and FSDP2 sharding), and a 2-rank
# checkpoint resumed by 1 rank
# --------------------------------------------------------------------------------------------------

#: float64 end to end. The 2-rank gradient is the sum of two shard gradients, the 1-process one a
#: single sum: they differ by summation-order round-off (~1e-16 relative), which Adam's first step
#: (lr * g / (|g| + eps)) turns into parameter differences far below this bound. The same bound holds
#: for FSDP2, whose reduce-scatter sums the same shard gradients (and whose runs below also split the
#: shards into one micro-batch per event and one forward per row, another summation order).
PARAM_TOL = 1e-9
ALGOS = ("srpo", "grpo")
ENGINES = ("allreduce", "fsdp2")
#: The FSDP2 runs take a forward per row and a micro-batch per event, so the two ranks' event-atomic
#: shards need different numbers of forward calls and micro-batches: the lockstep padding
#: (ScaleOut.forward_plan) must run, or the collectives would hang or mix up layers.
ENGINE_KWARGS = {
    "allreduce": {},
    "fsdp2": dict(dp_engine="fsdp2", forward_rows=1, max_tokens_per_microbatch=1),
}
#: One model per role (two sharded models, whose forwards the ranks must also order alike) with the
#: KL to a frozen reference and the entropy bonus on; SRPO only.
PER_ROLE = dict(sharing="per-role", kl_coef=0.1, entropy_coef=0.01)
#: (run name, algorithm, config overrides of the 2-rank run, of the 1-process reference)
RUNS = [(engine, algo, ENGINE_KWARGS[engine], {}) for engine in ENGINES for algo in ALGOS] + [
    ("fsdp2-per-role", "srpo", {**ENGINE_KWARGS["fsdp2"], **PER_ROLE}, PER_ROLE)
]


def _params(trainer) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """Full parameters of every distinct model, ``model<i>.<name>`` (collective under FSDP2)."""
    states = trainer.scale.model_states()
    return {
        f"{m}.{n}": states[m][n].detach().clone()
        for m, pol in zip(states, trainer.distinct_models(), strict=True)
        for n, _ in pol.model.named_parameters()
    }


def _cfg(model_dir: str, out_dir: str, algo: str, **extra) -> dict:
    return dict(
        algo=algo, model=model_dir, out_dir=out_dir, epochs=1, rows_per_batch=12, eval_every=0,
        save_every=0, dtype="float64", device="cpu", max_new_tokens=8, seed=3, **extra,
    )  # fmt: skip


def _dp_worker(rank: int, world: int, port: int, model_dir: str, rows_path: str, tmp: str) -> None:
    import json
    import os

    import torch.distributed as dist

    from agents.rollout import RolloutBatch
    from agents.rows import load_rows
    from learners.trainer import TrainConfig, Trainer

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    batch = RolloutBatch(rows=load_rows(rows_path), episodes=[])
    try:
        for engine, algo, kwargs, _ in RUNS:
            trainer = Trainer(
                TrainConfig(**_cfg(model_dir, f"{tmp}/{engine}-{algo}", algo, **kwargs)), log=None
            )
            assert trainer.dist.world_size == world and trainer.dist.rank == rank
            assert trainer.scale.fsdp == engine.startswith("fsdp2")
            lockstep = [0]
            real = trainer.forward.lockstep_forward

            def counted(pol, real=real, lockstep=lockstep):  # noqa: ANN001, ANN202
                lockstep[0] += 1
                return real(pol)

            trainer.forward.lockstep_forward = counted  # type: ignore[method-assign]
            stats = trainer.update(batch, 1)  # the trainer is now at iteration 1
            trainer.save_checkpoint()  # rank 0 writes the full state, every rank meets at a barrier
            params = _params(trainer)  # gathered full weights (collective)
            if rank == 0:
                torch.save(params, f"{tmp}/{engine}-{algo}-dp-params.pt")
            with open(f"{tmp}/{engine}-{algo}-lockstep-{rank}.json", "w") as f:
                json.dump({"lockstep": lockstep[0], "grad_norm": stats["actor/grad_norm"]}, f)
            if engine.startswith("fsdp2") and algo == "srpo":  # resume sharded, on 2 ranks again
                optim = trainer.scale.optimizer_state(trainer.optimizer)
                again = Trainer(trainer.cfg, log=None)
                again.load_checkpoint()
                optim2 = again.scale.optimizer_state(again.optimizer)
                diffs = [(params[n] - p).abs().max().item() for n, p in _params(again).items()]
                diffs += [
                    (v - optim2["state"][i][k]).abs().max().item()
                    for i, entries in optim["state"].items()
                    for k, v in entries.items()
                ]
                with open(f"{tmp}/{engine}-{algo}-resume2-{rank}.json", "w") as f:
                    json.dump({"max_diff": max(diffs), "n": len(diffs), "iteration": again.iteration}, f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dp_run(tiny_model_dir, tmp_path_factory):
    """One 2-process gloo run (both engines, both algorithms) on a fixed rollout batch; its outputs."""
    import socket

    import torch.multiprocessing as mp

    from agents.rows import save_rows
    from learners.trainer import TrainConfig, Trainer

    tmp = tmp_path_factory.mktemp("dp")
    collector = Trainer(TrainConfig(**_cfg(str(tiny_model_dir), str(tmp / "collect"), "srpo")), log=None)
    batch = collector.collector.collect([0, 1, 2], group_size=2, seed=5)
    # a random tiny model fails every task (all advantages 0, no update): give the G rollouts of each
    # task different outcomes, consistently for every row of an episode
    episodes = sorted({r.episode_id for r in batch.rows})
    won = {e: float(i % 2) for i, e in enumerate(episodes)}
    rows = [
        dataclasses.replace(r, reward=won[r.episode_id] - r.penalty, outcome_reward=won[r.episode_id])
        for r in batch.rows
    ]
    batch = dataclasses.replace(batch, rows=rows)
    rows_path = save_rows(batch.rows, tmp / "rows.jsonl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_dp_worker, args=(2, port, str(tiny_model_dir), str(rows_path), str(tmp)), nprocs=2, join=True)
    return tmp, batch


@pytest.fixture(scope="module")
def single_run(dp_run, tiny_model_dir):
    """The 1-process update of each algorithm on the same batch (whole minibatch in one forward)."""
    from learners.trainer import TrainConfig, Trainer

    tmp, batch = dp_run
    out = {}
    for engine, algo, _, kwargs in RUNS:
        key = (algo, tuple(sorted(kwargs.items())))
        if key in out:
            continue
        cfg = _cfg(str(tiny_model_dir), str(tmp / f"single-{engine}-{algo}"), algo, **kwargs)
        single = Trainer(TrainConfig(**cfg), log=None)
        before = _params(single)
        stats = single.update(batch, 1)
        out[key] = (before, _params(single), stats["actor/grad_norm"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "algo", "reference"), [(e, a, r) for e, a, _, r in RUNS])
def test_two_rank_update_equals_single_process(dp_run, single_run, engine: str, algo: str, reference) -> None:
    import json

    tmp, _ = dp_run
    before, after, grad_norm = single_run[(algo, tuple(sorted(reference.items())))]
    dp = torch.load(tmp / f"{engine}-{algo}-dp-params.pt", weights_only=True)
    assert set(dp) == set(after)
    moved = 0.0
    for name, p in after.items():
        assert (p - dp[name]).abs().max().item() <= PARAM_TOL, name
        moved = max(moved, (p - before[name]).abs().max().item())
    assert moved > 1e-5  # the update did something (so equality is not trivially 0 == 0)
    ranks = [json.loads((tmp / f"{engine}-{algo}-lockstep-{r}.json").read_text()) for r in range(2)]
    # Adam's first step and the clip hide a wrongly scaled gradient (e.g. averaged instead of summed
    # over ranks); the pre-clip norm does not
    for r in ranks:
        assert r["grad_norm"] == pytest.approx(grad_norm, rel=1e-9)
    lockstep = [r["lockstep"] for r in ranks]
    if engine.startswith("fsdp2"):  # the shards differed, and a rank with fewer forwards padded them
        assert max(lockstep) > 0, lockstep
    else:
        assert lockstep == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_checkpoint_saved_by_two_ranks_resumes_on_one(dp_run, tiny_model_dir, engine: str) -> None:
    """Save 2-rank (replicated or sharded), resume 1-rank under the all-reduce engine (the
    engine is a layout field: any world size and engine resumes the full state)."""
    from learners.trainer import TrainConfig, Trainer

    tmp, _ = dp_run
    kwargs = {**ENGINE_KWARGS[engine], "dp_engine": "allreduce"}
    cfg = TrainConfig(**_cfg(str(tiny_model_dir), str(tmp / f"{engine}-srpo"), "srpo", **kwargs))
    resumed = Trainer(cfg, log=None)
    assert resumed.dist.world_size == 1
    resumed.load_checkpoint()
    assert resumed.iteration == 1
    dp = torch.load(tmp / f"{engine}-srpo-dp-params.pt", weights_only=True)
    for name, p in resumed.policies.policies[0].model.named_parameters():
        assert torch.equal(p.detach(), dp[f"model0.{name}"]), name
    state = resumed.optimizer.state_dict()["state"]
    steps = {int(s["step"]) for s in state.values()}  # Adam's moments and step counts came along
    assert state and len(steps) == 1 and steps.pop() >= 1
    params = list(resumed.policies.policies[0].model.parameters())
    assert all(state[i]["exp_avg"].shape == p.shape for i, p in enumerate(params))  # full, not a shard


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fsdp2", "fsdp2-per-role"])
def test_fsdp2_checkpoint_resumes_sharded(dp_run, engine: str) -> None:
    """An FSDP2 checkpoint loaded by 2 FSDP2 ranks: every rank's gathered weights and AdamW moments
    equal what was saved (the full tensors are cut into this rank's shards on load)."""
    import json

    tmp, _ = dp_run
    for rank in range(2):
        got = json.loads((tmp / f"{engine}-srpo-resume2-{rank}.json").read_text())
        assert got["iteration"] == 1 and got["n"] > 0
        assert got["max_diff"] == 0.0, got


def _timeout_worker(rank: int, port: int, out: str) -> None:
    """Rank 1 joins the group and then never joins a collective (a hung rank); rank 0's all-reduce must
    fail after the group's timeout instead of waiting for ever (torch's default: 10 min). Rank 1 leaves
    once rank 0 reported."""
    import os
    import time
    from pathlib import Path

    from learners.distributed import init_distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    done = Path(out)
    try:
        init_distributed("cpu", timeout_s=8.0)  # also the rendezvous's: room for a slow process start
    except Exception as exc:  # reported, so that a failed rendezvous is told apart from the timeout
        done.write_text(f"init-failed {type(exc).__name__}")
        return
    if rank == 1:
        for _ in range(600):
            if done.exists():
                return
            time.sleep(0.1)
        return
    start = time.monotonic()
    try:
        torch.distributed.all_reduce(torch.ones(1))
        done.write_text("no error")
    except RuntimeError as exc:
        done.write_text(f"{time.monotonic() - start:.1f} {type(exc).__name__}")
    # Leave without the interpreter's teardown: destroying a gloo group whose collective timed out can
    # std::terminate in its worker threads (seen once in CI as SIGABRT after the result was written).
    os._exit(0)


@pytest.mark.slow
def test_dist_timeout_fails_a_collective_that_a_hung_rank_never_joins(tmp_path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "result"
    context = mp.spawn(_timeout_worker, args=(port, str(out)), nprocs=2, join=False)
    try:
        while not context.join(timeout=120):
            pass
    except mp.ProcessExitedException:
        pass  # an abort in process teardown, after the result below was written, is not what is tested
    assert out.exists(), "rank 0 neither failed the collective nor finished it"
    seconds, kind = out.read_text().split()
    assert seconds != "init-failed", kind
    assert kind.endswith("Error") and 7 <= float(seconds) < 60  # the 8 s timeout, not torch's 10 min


def test_dist_timeout_must_be_positive(monkeypatch) -> None:
    from learners.distributed import init_distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(ValueError, match="timeout must be > 0"):
        init_distributed("cpu", timeout_s=0)
