"""HFPolicy and PolicyMap on tiny local models: exact behaviour log-probs, sampling, stops, routing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agents.hf import BASE_ADAPTER, HFPolicy, _sample, adapter_scope, response_logprobs
from agents.lora import lora_policy_map
from agents.policy import Generation, GenerationRequest, Policy, PolicyMap, SamplingParams
from agents.tiny import fallback_corpus, init_tiny

pytestmark = pytest.mark.numeric  # floats from torch kernels: rerun under other CPU kernel sets (.ci/kernel_sets.sh)

CORPUS = fallback_corpus(1500, seed=1)
PROMPTS: list = [
    "Problem: What is 12 + 7?\nSolution:",
    "hi",
    "The solver and the verifier agree that the answer is " * 3,
    [{"role": "system", "content": "You are the verifier."}, {"role": "user", "content": "Is 3*4 = 12?"}],
    "x",
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Shared 2-core CI boxes: one intra-op thread is faster and steadier for these tiny models."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for arch in ("llama", "qwen2"):
        for seed in (0, 1):
            d = tmp_path_factory.mktemp(f"{arch}{seed}")
            init_tiny(d, size="tiny", arch=arch, seed=seed, corpus=CORPUS, vocab_size=1024)
            out[f"{arch}{seed}"] = d
    return out


@pytest.fixture(scope="module")
def policy(dirs) -> HFPolicy:
    return HFPolicy(dirs["llama0"])


def _requests(sampling: SamplingParams, prompts=PROMPTS, role: str = "solver") -> list[GenerationRequest]:
    return [
        GenerationRequest(agent=f"a{i}", role=role, prompt=p, sampling=replace(sampling, seed=100 + i))
        for i, p in enumerate(prompts)
    ]


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(
        (abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True)), default=0.0
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    ("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.9), (0.0, 1.0)]
)
def test_behaviour_logprobs_match_a_separate_forward(
    dirs, arch: str, temperature: float, top_p: float
) -> None:
    pol = HFPolicy(dirs[f"{arch}0"], max_batch_size=4)  # 5 prompts: two batches, mixed prompt lengths
    reqs = _requests(SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=24))
    # uneven max_new_tokens: rows leave the batch early and the cache is pruned
    reqs[1] = replace(reqs[1], sampling=replace(reqs[1].sampling, max_new_tokens=3))
    reqs[4] = replace(reqs[4], sampling=replace(reqs[4].sampling, max_new_tokens=9))
    gens = pol.generate(reqs)
    assert [len(g.token_ids) for g in gens] == [24, 3, 24, 24, 9]
    assert all(len(g.logprobs) == len(g.token_ids) for g in gens)
    assert all(g.finish_reason == "length" for g in gens)
    assert all(lp <= 0.0 for g in gens for lp in g.logprobs)
    recomputed = pol.compute_logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens], temperature)
    assert _max_diff([g.logprobs for g in gens], recomputed) <= 1e-5
    # the learner-side function (one unbatched forward per row) agrees as well
    for g in gens[:2]:
        lp, mask = response_logprobs(pol.model, [g.prompt_ids], [g.token_ids], temperature, pol.pad_id)
        assert mask.all() and _max_diff([g.logprobs], lp.tolist()) <= 1e-5
    if temperature == 0.0:  # greedy: every token is the argmax of a full forward
        with torch.no_grad():
            for g in gens[:2]:
                ids = torch.tensor([g.prompt_ids + g.token_ids])
                logits = pol.model(ids).logits[0, len(g.prompt_ids) - 1 : -1]
                assert logits.argmax(-1).tolist() == g.token_ids


def test_top_p_samples_stay_inside_the_nucleus(policy: HFPolicy) -> None:
    top_p, temperature = 0.3, 1.5
    gens = policy.generate(_requests(SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12)))
    with torch.no_grad():
        for g in gens:
            ids = torch.tensor([g.prompt_ids + g.token_ids])
            probs = torch.softmax(policy.model(ids).logits[0, len(g.prompt_ids) - 1 : -1] / temperature, -1)
            for t, tok in enumerate(g.token_ids):
                mass_before = probs[t][probs[t] > probs[t, tok]].sum().item()
                assert mass_before < top_p + 1e-6


def test_sampler_distribution_and_nucleus_renormalisation() -> None:
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(20000, 1)
    n = logits.shape[0]
    ones, no = torch.ones(n), torch.zeros(n, dtype=torch.bool)
    tok, lp = _sample(logits, ones, ones, no, torch.rand(n))
    freq = torch.bincount(tok, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.015)
    assert torch.allclose(lp, probs.log()[tok], atol=1e-6)
    tok, lp = _sample(logits, ones, torch.full((n,), 0.7), no, torch.rand(n))
    freq = torch.bincount(tok, minlength=4).float() / n
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.015)
    assert torch.allclose(lp, probs.log()[tok], atol=1e-6)  # full-distribution log-prob, not renormalised
    tok, lp = _sample(logits * 2, torch.full((n,), 2.0), ones, no, torch.rand(n))  # T rescales the logits
    assert torch.allclose(torch.bincount(tok, minlength=4).float() / n, probs, atol=0.015)
    assert torch.allclose(lp, probs.log()[tok], atol=1e-5)
    tok, _ = _sample(logits[:3], ones[:3], ones[:3], torch.ones(3, dtype=torch.bool), torch.rand(3))
    assert tok.tolist() == [0, 0, 0]


def test_seeds_reproduce_whatever_the_batch(policy: HFPolicy) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)

    def mixed() -> list[GenerationRequest]:
        # row 0 finishes first but stays in the batch (1 of 5 done); the others run longer than row 2
        reqs = _requests(sp)
        lengths = [4, 24, 16, 20, 24]
        return [
            replace(r, sampling=replace(r.sampling, max_new_tokens=n))
            for r, n in zip(reqs, lengths, strict=True)
        ]

    batch = policy.generate(mixed())
    again = policy.generate(mixed())
    assert [g.token_ids for g in batch] == [g.token_ids for g in again]
    assert [len(g.token_ids) for g in batch] == [4, 24, 16, 20, 24]
    for i in (0, 2):
        alone = policy.generate(mixed()[i : i + 1])[0]
        assert alone.token_ids == batch[i].token_ids
        assert _max_diff([alone.logprobs], [batch[i].logprobs]) <= 1e-5
    other_seed = policy.generate([replace(r, sampling=replace(r.sampling, seed=7)) for r in _requests(sp)])
    assert [g.token_ids for g in other_seed] != [g.token_ids for g in batch]
    # unseeded requests follow torch's global RNG
    unseeded = [replace(r, sampling=replace(sp, seed=None)) for r in _requests(sp)]
    torch.manual_seed(5)
    a = policy.generate(unseeded)
    torch.manual_seed(5)
    b = policy.generate(unseeded)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_stop_strings_cut_ids_and_text_at_the_completing_token(policy: HFPolicy) -> None:
    tok = policy.tokenizer
    sp = SamplingParams(temperature=1.0, max_new_tokens=30)  # seeded by _requests: same draws both times
    full = policy.generate(_requests(sp, PROMPTS[:1]))[0]
    text = full.text
    start = next(i for i in range(len(text) // 2, len(text) - 3) if text[i : i + 3].isprintable())
    stop = text[start : start + 3]
    # the first token after which the decoded text contains the stop string
    k = next(i for i in range(len(full.token_ids)) if stop in tok.decode(full.token_ids[: i + 1]))
    cut = policy.generate(_requests(replace(sp, stop=("never-appears", stop)), PROMPTS[:1]))[0]
    assert cut.token_ids == full.token_ids[: k + 1]
    # the same request decoded twice in one process: the same kernels on the same inputs, so the steps
    # before the cut repeat bit for bit (1e-6 only spares a reader the ulps)
    assert cut.logprobs == pytest.approx(full.logprobs[: k + 1], abs=1e-6)
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text.endswith(stop) and cut.text.count(stop) == 1
    assert tok.decode(cut.token_ids).startswith(cut.text)


def test_eos_ends_a_sequence_unless_ignored(dirs) -> None:
    pol = HFPolicy(dirs["llama0"])
    sp = SamplingParams(temperature=1.0, max_new_tokens=20)
    full = pol.generate(_requests(sp, PROMPTS[:1]))[0]
    eos = full.token_ids[5]
    first = full.token_ids.index(eos)
    pol.eos_ids = [eos]  # pretend that token is EOS
    ended = pol.generate(_requests(sp, PROMPTS[:1]))[0]
    assert ended.token_ids == full.token_ids[: first + 1]  # EOS is kept in the ids (the learner trains on it)
    assert ended.finish_reason == "stop" and ended.stop_reason == eos
    ignored = pol.generate(_requests(replace(sp, ignore_eos=True), PROMPTS[:1]))[0]
    assert ignored.token_ids == full.token_ids and ignored.finish_reason == "length"


def test_prompts_chat_template_plain_fallback_and_explicit_ids(policy: HFPolicy, dirs) -> None:
    tok = policy.tokenizer
    messages = PROMPTS[3]
    gen = policy.generate(_requests(SamplingParams(max_new_tokens=0), [messages]))[0]
    assert gen.token_ids == [] and gen.finish_reason == "length"
    expected = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))["input_ids"]
    assert gen.prompt_ids == expected and gen.prompt_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    plain = HFPolicy(policy.model, AutoTokenizer.from_pretrained(dirs["llama0"]))
    plain.tokenizer.chat_template = None
    assert plain.render_chat(messages) == "system: You are the verifier.\nuser: Is 3*4 = 12?\nassistant:"
    ids = [5, 6, 7]
    req = GenerationRequest("a", "r", "ignored", SamplingParams(max_new_tokens=2, seed=0), prompt_ids=ids)
    assert policy.generate([req])[0].prompt_ids == ids
    with pytest.raises(ValueError):
        policy.generate([GenerationRequest("a", "r", "", SamplingParams(max_new_tokens=2))])


def test_policy_version_is_recorded(dirs) -> None:
    pol = HFPolicy(dirs["qwen20"])
    assert isinstance(pol, Policy)
    sp = SamplingParams(max_new_tokens=2, seed=0)
    assert pol.generate(_requests(sp, PROMPTS[:1]))[0].policy_version == 0
    assert pol.bump_version() == 1
    assert pol.generate(_requests(sp, PROMPTS[:1]))[0].policy_version == 1


class _Counting:
    """Wraps a policy and records each generate call (routing tests)."""

    def __init__(self, inner: HFPolicy) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def generate(self, requests):
        self.calls.append([r.role for r in requests])
        return self.inner.generate(requests)


def test_shared_policy_map_batches_all_roles_together(policy: HFPolicy) -> None:
    shared = _Counting(policy)
    pmap = PolicyMap.shared(shared, roles=["solver", "verifier"])
    sp = SamplingParams(max_new_tokens=6)
    reqs = _requests(sp, PROMPTS[:2], role="solver") + _requests(sp, PROMPTS[2:4], role="verifier")
    reqs.append(GenerationRequest("z", "aggregator", PROMPTS[4], replace(sp, seed=9)))  # unlisted -> default
    gens = pmap.generate(reqs)
    assert shared.calls == [["solver", "solver", "verifier", "verifier", "aggregator"]]
    direct = policy.generate(reqs)
    assert [g.token_ids for g in gens] == [g.token_ids for g in direct]
    assert all(isinstance(g, Generation) for g in gens)


def test_per_role_policy_map_routes_to_each_model(dirs) -> None:
    a, b = _Counting(HFPolicy(dirs["llama0"])), _Counting(HFPolicy(dirs["llama1"]))
    pmap = PolicyMap.per_role({"solver": a, "verifier": b})
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)  # same seed: only the weights differ
    reqs = [
        GenerationRequest("s0", "solver", PROMPTS[0], sp),
        GenerationRequest("v0", "verifier", PROMPTS[0], sp),
        GenerationRequest("s1", "solver", PROMPTS[1], sp),
    ]
    gens = pmap.generate(reqs)
    assert a.calls == [["solver", "solver"]] and b.calls == [["verifier"]]
    for g, pol, req in [(gens[0], a.inner, reqs[0]), (gens[1], b.inner, reqs[1])]:
        direct = pol.generate([req])[0]
        assert g.token_ids == direct.token_ids and _max_diff([g.logprobs], [direct.logprobs]) <= 1e-5
    assert gens[0].token_ids != gens[1].token_ids  # different weights, same prompt and seed
    assert pmap.policy_version("verifier") == 0
    with pytest.raises(KeyError):
        pmap.generate([GenerationRequest("x", "critic", "hi", sp)])


def test_lora_per_role_switches_adapters_per_group(dirs, tmp_path: Path) -> None:
    from peft import LoraConfig

    base = AutoModelForCausalLM.from_pretrained(dirs["qwen20"])
    tok = AutoTokenizer.from_pretrained(dirs["qwen20"])
    cfg = LoraConfig(
        r=4, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False
    )
    pmap = lora_policy_map(base, ["solver", "verifier"], lora_config=cfg, tokenizer=tok)
    peft_model = pmap["solver"].model
    assert pmap["verifier"].model is peft_model
    assert peft_model.active_adapter == "solver"
    grads = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    assert all(flag == ("lora_" in n) for n, flag in grads.items())  # every role's adapter trains

    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    prompt = PROMPTS[2]
    reqs = [GenerationRequest(f"a{i}", role, prompt, greedy) for i, role in enumerate(["solver", "verifier"])]
    gens = pmap.generate(reqs)
    assert gens[0].logprobs != gens[1].logprobs
    # each role's tokens are the greedy continuation under its own adapter
    plain_base = AutoModelForCausalLM.from_pretrained(dirs["qwen20"])
    for g, name in zip(gens, ["solver", "verifier"], strict=True):
        ids = torch.tensor([g.prompt_ids + g.token_ids])
        with torch.no_grad():
            peft_model.set_adapter(name)
            logits = peft_model(input_ids=ids).logits[0, len(g.prompt_ids) - 1 : -1]
        assert logits.argmax(-1).tolist() == g.token_ids
        lps = pmap[name].compute_logprobs([g.prompt_ids], [g.token_ids], 0.0)
        assert _max_diff([g.logprobs], lps) <= 1e-5
    peft_model.set_adapter("solver")  # peft's own switch also flips requires_grad: undo that
    for n, p in peft_model.named_parameters():
        p.requires_grad_(grads[n])
    # the learner's state is untouched: same active adapter, same trainable flags
    pmap.generate(reqs)
    assert peft_model.active_adapter == "solver"
    assert {n: p.requires_grad for n, p in peft_model.named_parameters()} == grads
    # learner pattern: each role's forward inside its adapter scope, one backward after leaving both
    peft_model.train()
    ids = torch.tensor([gens[0].prompt_ids])
    losses = []
    for name in ("verifier", "solver"):
        with adapter_scope(peft_model, name):
            losses.append(peft_model(input_ids=ids).logits.float().pow(2).mean())
    peft_model.zero_grad(set_to_none=True)
    sum(losses).backward()
    for name in ("solver", "verifier"):
        lora = [p for n, p in peft_model.named_parameters() if f".{name}." in n and "lora_" in n]
        assert lora and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora), name
    assert all(p.grad is None for n, p in peft_model.named_parameters() if "lora_" not in n)
    peft_model.zero_grad(set_to_none=True)
    peft_model.eval()
    # the base view runs the original weights
    base_view = pmap["solver"].view(BASE_ADAPTER)
    expected = HFPolicy(plain_base, tok).generate(reqs[:1])[0].token_ids
    assert base_view.generate(reqs[:1])[0].token_ids == expected
    # saved adapters load back into a fresh base, one per role
    peft_model.save_pretrained(tmp_path)
    adapters = {
        r: next(p for p in (tmp_path / r, tmp_path) if (p / "adapter_config.json").exists()) for r in pmap
    }
    reloaded = lora_policy_map(str(dirs["qwen20"]), list(pmap), adapters=adapters)
    again = reloaded.generate(reqs)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    assert _max_diff([g.logprobs for g in again], [g.logprobs for g in gens]) <= 1e-5


def test_response_logprobs_has_gradients_for_learners(policy: HFPolicy) -> None:
    gen = policy.generate(_requests(SamplingParams(max_new_tokens=5), PROMPTS[:2]))
    policy.model.zero_grad()
    lp, mask = response_logprobs(
        policy.model, [g.prompt_ids for g in gen], [g.token_ids for g in gen], 1.0, policy.pad_id
    )
    assert lp.requires_grad and mask.sum() == 10
    (-(lp * mask).sum()).backward()
    assert policy.model.get_input_embeddings().weight.grad.abs().sum() > 0
    policy.model.zero_grad(set_to_none=True)


def test_sampling_params_validation() -> None:
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=-1)
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(temperature=0).greedy


def test_rollout_rows_carry_exact_behaviour_logprobs(dirs) -> None:
    import srpo_envs
    from agents.rollout import RolloutCollector

    pol = HFPolicy(dirs["qwen20"])
    collector = RolloutCollector(
        lambda: srpo_envs.make("ProcArith-v0", workflow="solver-verifier"),
        PolicyMap.shared(pol),
        sampling=SamplingParams(temperature=0.9, max_new_tokens=12),
    )
    rows = collector.collect([0, 1], group_size=2, seed=0).rows
    assert rows and all(len(r.behaviour_logprobs) == len(r.response_ids) > 0 for r in rows)
    recomputed = pol.compute_logprobs([r.prompt_ids for r in rows], [r.response_ids for r in rows], 0.9)
    assert _max_diff([r.behaviour_logprobs for r in rows], recomputed) <= 1e-5
