#!/usr/bin/env bash
# One command installs everything that works on CPU: the package with its CPU extras (search, dev,
# tensorboard), Debian's headless Chromium for the leaderboard page test and wrk for benchmarks/bench_server.
# torch is pinned to 2.13.0 in pyproject.toml (a CPU wheel); nothing here may pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v chromium >/dev/null 2>&1 || ! command -v wrk >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium wrk >/dev/null
fi
python3 -m pip install --upgrade-strategy only-if-needed -e ".[all]"
python3 -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
# Other projects' own tools that test srpo's exports (tests/leaderboards/test_export.py), each in its own venv:
# Every Eval Ever's validator: its wheel declares Python >= 3.12 and huggingface-hub < 2, neither of which
# this machine's Python 3.11 environment can have (no 3.12 interpreter from the registries), so its code
# runs on 3.11 with the four packages the validator imports; lm-eval (no dependencies of its own needed to
# read results: its make_table over this environment's packages).
if [ ! -x .venvs/eee/bin/python ]; then
  python3 -m venv .venvs/eee
  .venvs/eee/bin/python -m pip install -q --ignore-requires-python --no-deps "every-eval-ever==0.3.0"
  .venvs/eee/bin/python -m pip install -q "pydantic>=2.12.5,<3" "jsonschema>=4.26,<5" "rich>=14,<15" "requests>=2.32.5,<3"
fi
if [ ! -x .venvs/lm-eval/bin/python ]; then
  python3 -m venv --system-site-packages .venvs/lm-eval
  .venvs/lm-eval/bin/python -m pip install -q --no-deps "lm-eval==0.4.13"
  .venvs/lm-eval/bin/python -m pip install -q "pytablewriter>=1.2"
fi
# verifiers (Prime Intellect's environment library) for the two doors between its envs and srpo's
# (docs/verifiers.md): its requirements (openai>=2.54, mcp==2.0.0) collide with the search extra's
# openai<=2.33 and openenv-core's mcp, so it gets its own venv that sees this environment's packages,
# srpo included; .ci/verifiers.sh runs its tests there.
if [ ! -x .venvs/verifiers/bin/vf-eval ]; then
  python3 -m venv --system-site-packages .venvs/verifiers
  .venvs/verifiers/bin/python -m pip install -q "verifiers==0.4.0"
fi
# srpo's own command in that venv (.venvs/verifiers/bin/srpo), on this checkout like the main one
.venvs/verifiers/bin/python -m pip install -q --no-deps -e .
