"""A stand-in *vLLM* server for the main suite: the OpenAI-compatible routes over an in-process HFPolicy.

The adapter routes answer as vLLM 0.32 does: 200 with a plain-text sentence (not JSON).

It answers ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` in vLLM's layout
(``token_ids``, ``prompt_token_ids``, log-prob tokens spelled ``token_id:N``) and vLLM's runtime LoRA
routes ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (peft adapters loaded from a directory),
so ``srpo train --backend openai`` runs end to end without vLLM. Its log-probs follow
:mod:`agents.policy`'s convention exactly (HFPolicy), so a learner's ``pi_old`` recompute must match
the server's behaviour log-probs to float32 round-off: the check that ids, prompt ids and log-probs
travel over HTTP unchanged. (The real server is tested in ``tests/agents/test_openai_vllm.py``.)

``default_top_k`` plays a stock ``vllm serve`` of a model whose ``generation_config.json`` sets ``top_k``
(Qwen2.5-Instruct: 20): a request that names no ``top_k`` is sampled from the top-k tokens, with the
processed (renormalised) log-probs; ``force_top_k`` samples so whatever the request says (a server that
ignores the field). ``top_k`` <= 0 in a request turns it off, as in vLLM.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse


def _sample_top_k(pol: Any, req: Any, k: int) -> Any:
    """One response sampled from the top-``k`` tokens of ``softmax(logits / T)`` (a full forward per token:
    tiny models, short answers), with vLLM's processed log-probs (the renormalised top-k distribution)."""
    import torch

    from agents.hf import adapter_scope, eos_token_ids, eval_mode
    from agents.policy import Generation

    sp = req.sampling
    prompt = list(req.prompt_ids) if req.prompt_ids is not None else pol.encode_prompt(req)
    gen = torch.Generator().manual_seed(int(sp.seed or 0))
    eos = set(eos_token_ids(pol.tokenizer, pol.model))
    ids, out, lps = list(prompt), [], []
    finish, stop_reason, text = "length", None, ""
    with torch.inference_mode(), eval_mode(pol.model), adapter_scope(pol.model, pol.adapter_name):
        for _ in range(sp.max_new_tokens):
            z = pol.model(input_ids=torch.tensor([ids])).logits[0, -1].float() / max(sp.temperature, 1e-6)
            kth = torch.topk(z, min(k, z.numel())).values[-1]
            logp = torch.log_softmax(z.masked_fill(z < kth, float("-inf")), -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            out.append(tok)
            lps.append(float(logp[tok]))
            text = pol.tokenizer.decode(out, skip_special_tokens=True)
            if tok in eos:
                finish, stop_reason = "stop", tok
                break
            hit = next((st for st in sp.stop if st in text), None)
            if hit is not None:
                finish, stop_reason, text = "stop", hit, text[: text.index(hit) + len(hit)]
                break
    return Generation(text, out, lps, prompt, pol.policy_version, finish, stop_reason)


def _sse(answer: dict[str, Any]) -> Iterator[str]:
    """A finished chat completion as OpenAI's server-sent chunks: the message, the finish reason, the usage."""
    choice = answer["choices"][0]
    head = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": answer["model"]}
    delta = {"role": "assistant", "content": choice["message"]["content"]}
    n_out, n_in = len(choice["token_ids"]), len(answer["prompt_token_ids"])
    for chunk in (
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        {**head, "choices": [], "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                           "total_tokens": n_in + n_out}},
    ):
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def create_app(
    model_dir: str | Path, served_name: str = "base", *, default_top_k: int = 0, force_top_k: int = 0
) -> FastAPI:
    from agents.hf import BASE_ADAPTER, HFPolicy
    from agents.policy import GenerationRequest, SamplingParams

    base = HFPolicy(str(model_dir), device="cpu", dtype="float32")
    state: dict[str, Any] = {"model": base.model, "adapters": {}, "calls": []}
    lock = threading.Lock()
    app = FastAPI()
    app.state.standin = state
    state["bodies"] = []  # every completion request body, as sent
    state["force_top_k"] = force_top_k  # a test may change it mid-run (a server restarted with other settings)

    def policy_for(name: str) -> HFPolicy:
        if name == served_name:
            adapter = BASE_ADAPTER if state["adapters"] else None
        elif name in state["adapters"]:
            adapter = name
        else:
            raise HTTPException(404, f"The model `{name}` does not exist.")
        return HFPolicy(state["model"], base.tokenizer, adapter_name=adapter)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [{"id": served_name, "object": "model", "parent": None}]
        cards += [{"id": n, "object": "model", "parent": served_name} for n in state["adapters"]]
        return {"object": "list", "data": cards}

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> PlainTextResponse:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        if name in state["adapters"]:
            raise HTTPException(400, f"The lora adapter '{name}' has already been loaded.")

        def do() -> None:
            from peft import PeftModel

            with lock:
                if state["adapters"]:
                    state["model"].load_adapter(path, adapter_name=name)
                else:
                    state["model"] = PeftModel.from_pretrained(state["model"], path, adapter_name=name)
                state["adapters"][name] = path

        await run_in_threadpool(do)
        state["calls"].append(("load", name))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request) -> PlainTextResponse:
        name = (await request.json())["lora_name"]
        if name not in state["adapters"]:
            raise HTTPException(404, f"The lora adapter '{name}' cannot be found.")
        with lock:
            state["model"].delete_adapter(name)
            del state["adapters"][name]
        state["calls"].append(("unload", name))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def complete(request: Request, chat: bool) -> dict[str, Any]:
        body = await request.json()
        state["bodies"].append(body)
        pol = policy_for(body["model"])
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_new_tokens=int(body.get("max_tokens", 16)),
            stop=tuple(body.get("stop") or ()),
            seed=body.get("seed"),
        )
        if chat:
            req = GenerationRequest("a", "r", body["messages"], sampling)
        elif isinstance(body["prompt"], list):
            req = GenerationRequest("a", "r", "", sampling, prompt_ids=body["prompt"])
        else:
            req = GenerationRequest("a", "r", body["prompt"], sampling)

        top_k = state["force_top_k"] or int(body.get("top_k", default_top_k))

        def gen() -> Any:
            with lock:
                return _sample_top_k(pol, req, top_k) if top_k > 0 else pol.generate([req])[0]

        g = await run_in_threadpool(gen)
        state["calls"].append(("generate", body["model"]))
        stop_reason = g.stop_reason if isinstance(g.stop_reason, str) else None
        finish = "length" if g.finish_reason == "length" else "stop"
        tokens = [f"token_id:{t}" for t in g.token_ids]
        if chat:
            content = [{"token": t, "logprob": lp, "top_logprobs": []} for t, lp in zip(tokens, g.logprobs, strict=True)]
            choice = {"index": 0, "message": {"role": "assistant", "content": g.text},
                      "logprobs": {"content": content}, "finish_reason": finish, "stop_reason": stop_reason,
                      "token_ids": g.token_ids}
            return {"object": "chat.completion", "model": body["model"], "choices": [choice],
                    "prompt_token_ids": g.prompt_ids}
        choice = {"index": 0, "text": g.text, "finish_reason": finish, "stop_reason": stop_reason,
                  "logprobs": {"tokens": tokens, "token_logprobs": g.logprobs}, "token_ids": g.token_ids,
                  "prompt_token_ids": g.prompt_ids}
        return {"object": "text_completion", "model": body["model"], "choices": [choice]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        answer = await complete(request, chat=True)
        if (await request.json()).get("stream"):  # verifiers' chat harness streams, as OpenAI's SDK may
            return StreamingResponse(_sse(answer), media_type="text/event-stream")
        return answer

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        return await complete(request, chat=False)

    return app
