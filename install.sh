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
