"""The documented GPU recipes, extracted from the docs and run on CPU with a tiny model of the same class.

Every ``srpo train`` / ``srpo bench`` command in ``README.md`` and ``docs/**/*.md`` (fenced ``bash``
blocks, continuation lines joined, ``torchrun`` / ``accelerate`` / ``VAR=value`` prefixes kept) whose
``--model`` names a hub model (``ORG/NAME``) or a served one (``openai:NAME``, the hub id then comes from the
block's ``vllm serve ID --served-model-name NAME``), or whose ``--config`` experiment file (a shipped
``learners/experiments/NAME.toml``) does, is a *recipe*. A new recipe in the docs is covered the
day it is written, with nobody remembering to add a test; one whose model family is unknown here fails
with a message instead of being skipped.

How a recipe becomes a CPU run (:func:`ci_argv`), and why each change is the smallest that makes it one:

* the model -> a tiny model built locally (:func:`tiny_like`) of the same architecture class: Qwen2.5
  -> ``Qwen2Config`` with GQA (4 query heads, 2 KV heads), a ChatML chat template, tied input/output
  embeddings where the real model ties them (0.5B-3B) and untied where it does not (7B and up: FSDP2
  shards a tied head differently);
* ``--device cuda`` -> ``cpu``; ``--backend vllm`` -> ``hf`` and the ``--vllm-*`` options dropped, unless
  vLLM is importable (the vLLM CPU env), where the engine stays and runs eagerly;
* ``torchrun --nproc_per_node N`` -> 2 ranks (gloo on CPU); ``accelerate launch --num_processes N`` -> 2;
* sizes -> 1 iteration of 2 tasks x 2 samples of 8 new tokens, no evaluation or checkpoint
  (``bench eval``: 2 problems, k = 1); everything else (algorithm, dtype, sharing, checkpointing,
  micro-batch budget, learning rate, temperature, data-parallel engine) runs as written;
* ``--base-url`` of a served recipe -> a stand-in vLLM server (:mod:`tests._hf_openai_server`) on this
  machine serving the tiny model under the recipe's served name.

``python -m tests._recipes`` runs them all and prints one line per recipe: where it is, the command as
written, the command run and its wall time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```(\w*)\s*$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_LOCAL = ("agents/", "runs/", "./", "../", "/", "~")
#: What a recipe must state instead of inheriting the tiny model's defaults (max_new_tokens=48, lr=3e-4, ...)
REAL_MODEL_SETTINGS = ("--max-new-tokens", "--lr", "--group-size", "--temperature")
#: CI sizes: the recipe's values of these are replaced (and the options added where it has none)
TRAIN_OVERRIDES = {
    "--iterations": "1", "--tasks-per-iter": "2", "--group-size": "2", "--max-new-tokens": "8",
    "--eval-every": "0", "--save-every": "0",
}  # fmt: skip
EVAL_OVERRIDES = {"--limit": "2", "--k": "1", "--max-new-tokens": "8"}
_VLLM_VALUE_OPTIONS = ("--vllm-gpu-memory-utilization",)
_VLLM_FLAGS = ("--vllm-sleep", "--no-vllm-sleep", "--vllm-enforce-eager", "--no-vllm-enforce-eager")


@dataclass(frozen=True)
class Recipe:
    """One documented command that names a GPU model."""

    source: str  #: ``path:line`` of its first line
    text: str  #: the command as written (continuations joined, comment dropped)
    argv: tuple[str, ...]  #: its tokens
    model: str  #: the hub id it trains or evaluates (a served recipe: the id the block serves)
    served: dict[str, str] = field(default_factory=dict)  #: served name -> hub id (the block's vllm serve)
    #: ``--config FILE|NAME`` recipes: the experiment file's flat fields (its model, backend, sizes)
    config: dict[str, object] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.source}:{self.argv[self.argv.index('srpo') + 1] if 'srpo' in self.argv else 'cmd'}"

    @property
    def command(self) -> str:
        """``train`` or ``bench``."""
        return self.argv[_srpo_index(self.argv) + 1]


def _srpo_index(argv: tuple[str, ...] | list[str]) -> int:
    for i, tok in enumerate(argv[:-1]):
        if tok in ("srpo", "srpo_cli") and argv[i + 1] in ("train", "bench"):
            return i
    return -1


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/ (sorted)."""
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    return files + sorted((root / "docs").rglob("*.md"))


def _commands(path: Path) -> Iterator[tuple[int, str, list[tuple[int, str]]]]:
    """``(line, command, block)`` for each command line of the file's bash/sh fenced blocks."""
    lang: str | None = None
    block: list[tuple[int, str]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = _FENCE.match(line.strip())
        if m and lang is None:
            lang, block = m.group(1), []
            continue
        if m and lang is not None:
            if lang in ("bash", "sh", "shell", "console"):
                yield from _join(block)
            lang = None
            continue
        if lang is not None:
            block.append((n, line))


def _join(block: list[tuple[int, str]]) -> Iterator[tuple[int, str, list[tuple[int, str]]]]:
    joined: list[tuple[int, str]] = []
    start, parts = 0, []
    for n, line in block:
        if not parts:
            start = n
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        joined.append((start, " ".join(p.strip() for p in parts)))
        parts = []
    if parts:
        joined.append((start, " ".join(p.strip() for p in parts)))
    for n, cmd in joined:
        yield n, cmd, joined


def _tokens(cmd: str) -> list[str]:
    try:
        return shlex.split(cmd, comments=True)
    except ValueError:
        return []


def _option(argv: list[str] | tuple[str, ...], name: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return None


def _served_names(block: list[tuple[int, str]]) -> dict[str, str]:
    """``vllm serve ID --served-model-name NAME`` lines of a block: NAME (and ID itself) -> ID."""
    out: dict[str, str] = {}
    for _, cmd in block:
        toks = _tokens(cmd)
        for i, tok in enumerate(toks[:-2]):
            if tok == "vllm" and toks[i + 1] == "serve":
                hub = toks[i + 2]
                out[hub] = hub
                name = _option(toks, "--served-model-name")
                if name:
                    out[name] = hub
    return out


def _experiment(name: str) -> dict[str, object]:
    """The flat fields of a ``--config`` experiment file (a path or a shipped name); {} when there is none."""
    import tomllib

    from learners.config import ConfigFileError, experiment_path

    try:
        path = experiment_path(name)
    except ConfigFileError:
        return {}  # a name the docs use for the reader's own file (exp.toml, RUN/config.toml): no recipe
    sections = tomllib.loads(path.read_text(encoding="utf-8"))
    return {k: v for table in sections.values() if isinstance(table, dict) for k, v in table.items()}


def is_hub_id(model: str) -> bool:
    """``ORG/NAME`` that is no local path."""
    return bool(_HUB_ID.match(model)) and not model.startswith(_LOCAL) and not (ROOT / model).exists()


def extract(files: list[Path] | None = None) -> list[Recipe]:
    """Every recipe of the docs (see the module docstring), in file and line order."""
    recipes: list[Recipe] = []
    for path in files if files is not None else doc_files():
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for line, cmd, block in _commands(path):
            argv = _tokens(cmd)
            i = _srpo_index(argv)
            if i < 0:
                continue
            model = _option(argv, "--model")
            config: dict[str, object] = {}
            if model is None and _option(argv, "--config") is not None:
                config = _experiment(str(_option(argv, "--config")))
                model = str(config.get("model")) if config.get("model") else None
            if model is None:
                continue
            served = _served_names(block)
            if model.startswith("openai:"):
                name = model[len("openai:") :]
                if name not in served:
                    continue  # a served model the block does not start: nothing names its weights
                hub = served[name]
            elif is_hub_id(model):
                hub = model
            else:
                continue
            text = cmd.split(" #", 1)[0].strip() if " #" in cmd else cmd.strip()
            recipes.append(Recipe(f"{rel}:{line}", text, tuple(argv), hub, served, config))
    return recipes


# ---------------------------------------------------------------------------------------------- tiny models
def architecture(model: str) -> tuple[str, bool]:
    """``(arch, tied embeddings)`` of the tiny stand-in for a hub model; unknown families raise."""
    m = re.match(r"^Qwen/Qwen2(?:\.5)?(?:-Math|-Coder)?-(\d+(?:\.\d+)?)B", model)
    if m:  # Qwen2/2.5: GQA, ChatML; the 0.5B-3B models tie the head to the embeddings, 7B and up do not
        return "qwen2", float(m.group(1)) <= 3.0
    m = re.match(r"^(?:meta-llama/)?(?:Meta-)?Llama-3(?:\.\d)?-(\d+)B", model)
    if m:  # Llama 3.x: GQA; 1B/3B tie their embeddings, 8B and up do not
        return "llama", float(m.group(1)) <= 3.0
    raise ValueError(
        f"a documented recipe names {model!r}, whose architecture tests/_recipes.py does not know: add its "
        "family to architecture() so the recipe runs on a tiny model of the same class"
    )


def tiny_like(model: str, cache: Path) -> Path:
    """A tiny model of ``model``'s class under ``cache`` (built once per class)."""
    arch, tied = architecture(model)
    out = cache / f"tiny-{arch}-{'tied' if tied else 'untied'}"
    if (out / "config.json").is_file():
        return out
    from agents.corpus import math_corpus
    from agents.tiny import init_tiny

    init_tiny(out, size="tiny", arch=arch, seed=0, corpus=math_corpus(600), vocab_size=1024)  # type: ignore[arg-type]
    if not tied:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(out)
        config.tie_word_embeddings = False
        src = AutoModelForCausalLM.from_pretrained(out)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            model_untied = AutoModelForCausalLM.from_config(config)
        state = {k: v for k, v in src.state_dict().items() if not k.startswith("lm_head.")}
        model_untied.load_state_dict(state, strict=False)  # a head of its own, freshly initialised
        model_untied.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------------------- CPU argv
def _set(argv: list[str], name: str, value: str) -> None:
    for i, tok in enumerate(argv):
        if tok == name:
            argv[i + 1] = value
            return
        if tok.startswith(name + "="):
            argv[i] = f"{name}={value}"
            return
    argv += [name, value]


def _drop(argv: list[str], name: str, has_value: bool) -> None:
    while name in argv:
        i = argv.index(name)
        del argv[i : i + (2 if has_value else 1)]


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def ci_argv(recipe: Recipe, model_dir: Path, out_dir: Path, base_url: str | None = None) -> list[str]:
    """The recipe's command as a CPU run on ``model_dir`` (the module docstring lists every change)."""
    argv = list(recipe.argv)
    i = _srpo_index(argv)
    prefix, cmd = argv[:i], argv[i:]
    if prefix and prefix[0] == "torchrun":
        for j, tok in enumerate(prefix):
            if tok in ("--nproc_per_node", "--nproc-per-node"):
                prefix[j + 1] = "2"
            elif tok.startswith(("--nproc_per_node=", "--nproc-per-node=")):
                prefix[j] = "--nproc_per_node=2"
    if prefix[:2] == ["accelerate", "launch"]:
        _drop(prefix, "--multi_gpu", has_value=False)
        _set(prefix, "--num_processes", "2")
    model = _option(cmd, "--model")
    _set(cmd, "--model", f"openai:{model[len('openai:'):]}" if model and model.startswith("openai:") else str(model_dir))
    _set(cmd, "--device", "cpu")
    if _option(cmd, "--backend") is None and recipe.config.get("backend"):  # the command line beats the file
        cmd += ["--backend", str(recipe.config["backend"])]
    if _option(cmd, "--backend") == "vllm" and not vllm_available():
        _set(cmd, "--backend", "hf")
        for name in _VLLM_VALUE_OPTIONS:
            _drop(cmd, name, has_value=True)
        for name in _VLLM_FLAGS:
            _drop(cmd, name, has_value=False)
    elif _option(cmd, "--backend") == "vllm":
        cmd.append("--vllm-enforce-eager")
    if _option(cmd, "--base-url") is not None:
        if base_url is None:
            raise ValueError(f"{recipe.source}: a served recipe needs a stand-in server's base_url")
        for j, tok in enumerate(cmd[:-1]):
            if tok == "--base-url":
                role, sep, _ = cmd[j + 1].partition("=")
                cmd[j + 1] = f"{role}={base_url}" if sep and not role.startswith("http") else base_url
    _set(cmd, "--out", str(out_dir))
    overrides = TRAIN_OVERRIDES if cmd[1] == "train" else EVAL_OVERRIDES if cmd[2:3] == ["eval"] else {}
    for name, value in overrides.items():
        _set(cmd, name, value)
    if cmd[1] == "bench":
        cmd.append("--no-progress")
    return prefix + cmd


def run(recipe: Recipe, work: Path, timeout_s: float = 600.0) -> tuple[list[str], float, subprocess.CompletedProcess]:
    """Run one recipe on CPU under ``work``: ``(argv run, wall seconds, the finished process)``."""
    model_dir = tiny_like(recipe.model, work / "models")
    out_dir = work / re.sub(r"[^\w.-]+", "_", recipe.source)
    server = None
    base_url = None
    if _option(recipe.argv, "--base-url") is not None:
        from srpo_envs.env_server import serve_in_thread
        from tests._hf_openai_server import create_app

        model = _option(recipe.argv, "--model") or ""
        name = model[len("openai:") :] if model.startswith("openai:") else "base"
        server = serve_in_thread(create_app(model_dir, served_name=name or "base"))
        base_url = f"{server.url}/v1"
    argv = ci_argv(recipe, model_dir, out_dir, base_url)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if argv[0] in ("srpo", "srpo_cli"):
        argv = [sys.executable, "-m", "srpo_cli", *argv[1:]]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    finally:
        if server is not None:
            server.stop()
    return argv, time.perf_counter() - start, proc


def main() -> int:
    import tempfile

    failed = 0
    with tempfile.TemporaryDirectory(prefix="srpo-recipes-") as tmp:
        for recipe in extract():
            argv, wall, proc = run(recipe, Path(tmp))
            status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
            failed += proc.returncode != 0
            print(f"recipe {recipe.source}: {recipe.text}")
            print(f"  ran   {shlex.join(argv)}")
            print(f"  {status} in {wall:.1f} s wall")
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
