"""Every GPU recipe in README.md and docs/ runs on CPU with a tiny model of its class (tests/_recipes.py).

The recipes are extracted from the docs at collection time, so a recipe added to the docs is a new test
case here without an edit; one whose model family is unknown fails :func:`test_every_recipe_is_complete`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests._recipes import (
    REAL_MODEL_SETTINGS,
    Recipe,
    architecture,
    ci_argv,
    extract,
    run,
    vllm_available,
)

RECIPES = extract()


def test_the_docs_recipes_are_found() -> None:
    # the one-GPU LoRA recipe and the 8-GPU FSDP2 one are in the docs today: extraction must see them
    texts = [r.text for r in RECIPES]
    assert any("Qwen2.5-3B" in t and "--sharing lora" in t and "--gradient-checkpointing" in t for t in texts)
    assert any(t.startswith("torchrun ") and "--dp-engine fsdp2" in t for t in texts)
    assert any("openai:" in t for t in texts)  # a served recipe (its model from the block's vllm serve)
    assert any(r.config and r.model.startswith("Qwen/") for r in RECIPES)  # srpo train --config 3b


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.source for r in RECIPES])
def test_every_recipe_is_complete(recipe: Recipe) -> None:
    """A recipe states its real-model settings (the tiny model's defaults are max_new_tokens=48, lr=3e-4)
    and names a model family the CPU run knows."""
    architecture(recipe.model)
    assert "..." not in recipe.text, f"{recipe.source}: an incomplete recipe cannot run: {recipe.text}"
    needed = REAL_MODEL_SETTINGS if recipe.command == "train" else ("--max-new-tokens", "--temperature")
    if recipe.config:  # an experiment file states what differs from the defaults (temperature 1.0 is one)
        needed = tuple(o for o in needed if o != "--temperature")
    stated = {*recipe.argv, *(f"--{k.replace('_', '-')}" for k in recipe.config)}
    missing = [o for o in needed if o not in stated]
    assert not missing, f"{recipe.source} inherits the tiny model's defaults of {missing}: {recipe.text}"


def test_ci_argv_makes_a_gpu_command_a_cpu_one(tmp_path: Path) -> None:
    text = (
        "torchrun --standalone --nproc_per_node 8 --no-python srpo train --model Qwen/Qwen2.5-7B-Instruct "
        "--device cuda --backend vllm --vllm-gpu-memory-utilization 0.15 --no-vllm-sleep --group-size 16 "
        "--max-new-tokens 1024 --lr 1e-6 --out runs/7b"
    )
    recipe = Recipe("x.md:1", text, tuple(shlex.split(text)), "Qwen/Qwen2.5-7B-Instruct")
    argv = ci_argv(recipe, tmp_path / "m", tmp_path / "o")
    assert argv[:4] == ["torchrun", "--standalone", "--nproc_per_node", "2"]
    cmd = " ".join(argv)
    assert f"--model {tmp_path / 'm'} --device cpu" in cmd and f"--out {tmp_path / 'o'}" in cmd
    assert "--group-size 2" in cmd and "--max-new-tokens 8" in cmd and "--lr 1e-6" in cmd
    assert "--iterations 1" in cmd and "--eval-every 0" in cmd
    if not vllm_available():
        assert "--backend hf" in cmd and "vllm" not in cmd.split("--backend hf")[1]
    assert architecture("Qwen/Qwen2.5-3B-Instruct") == ("qwen2", True)
    assert architecture("Qwen/Qwen2.5-7B-Instruct") == ("qwen2", False)
    with pytest.raises(ValueError, match="add its family"):
        architecture("mistralai/Mistral-7B-v0.1")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recipes")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.source for r in RECIPES])
def test_recipe_runs_on_cpu(recipe: Recipe, work: Path) -> None:
    argv, wall, proc = run(recipe, work)
    print(f"\nrecipe {recipe.source}: {recipe.text}\n  ran   {shlex.join(argv)}\n  ok in {wall:.1f} s wall")
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    out = Path(argv[argv.index("--out") + 1])
    if recipe.command == "train":
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert any(m.get("iteration") == 1 for m in lines)  # one update happened, with finite numbers
        assert all(v == v for m in lines for v in m.values() if isinstance(v, float))
    else:
        assert any(out.rglob("*.json")), f"no results under {out}"
