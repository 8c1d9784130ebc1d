#!/usr/bin/env bash
# CI stage: the two doors between verifiers (Prime Intellect, 0.4.0) and srpo, tested with verifiers'
# own package and commands, in the venv install.sh builds for it (.venvs/verifiers: verifiers' own
# requirements, openai>=2.54 and mcp==2.0.0, on top of the main environment's packages, srpo included).
# - tests/srpo_verifiers: `vf-eval srpo-verifiers` over the three math workflows and the search team,
#   against a stand-in OpenAI-compatible server playing a shipped tiny model; every reward verifiers
#   reports equals srpo's env's for the same completions; `vf-validate` passes (gold and no-op checks).
# - tests/srpo_envs/test_verifiers_env.py: verifiers envs (examples/verifiers_envs, single- and
#   multi-turn) as srpo's Verifiers-v0 under the conformance checks, and `srpo train` on one.
# verifiers' harness program is a uv script: its first run fetches its packages from the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venvs/verifiers/bin/vf-eval ] || { echo "no .venvs/verifiers: run bash install.sh first"; exit 1; }
.venvs/verifiers/bin/python -c "import verifiers, openai; print(f'verifiers env: verifiers {verifiers.__version__}, openai {openai.__version__}')"
.venvs/verifiers/bin/python -m pytest -p no:cacheprovider -q tests/srpo_verifiers tests/srpo_envs/test_verifiers_env.py
