#!/usr/bin/env bash
# CI stage: the numeric tests (marker `numeric`: floats from torch kernels) once more under the CPU kernel
# sets of the other machines of this kind, so that a tolerance or a code path tuned to this CPU fails here,
# not on the next clone.
#
# A kernel set is emulated faithfully only when every library that picks kernels by CPU is capped:
#   ATEN_CPU_CAPABILITY     torch's own vectorised kernels (default / avx2 / avx512)
#   ONEDNN_MAX_CPU_ISA      oneDNN (matmul, SDPA's bf16 packing, conv): without it oneDNN still sees AMX and
#                           AVX512-BF16, and ATen's flash-attention asks it whether bf16 can be VNNI-packed
#                           ("pack_vnni2 is only supported when avx512 is supported" under avx2 alone)
#   MKL_ENABLE_INSTRUCTIONS MKL's sgemm/dgemm code path
# The sets: an AVX-512 CPU without AMX or AVX512-BF16 (Skylake/Cascade Lake Xeons), an AVX2-only CPU, and
# the baseline (SSE4.x). The suite itself already ran under the machine's own set (AMX where present).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
sets=(
  "avx512-no-amx avx512 AVX512_CORE AVX512"
  "avx2 avx2 AVX2 AVX2"
  "default default SSE41 SSE4_2"
)
for spec in "${sets[@]}"; do
  read -r name aten onednn mkl <<<"$spec"
  nstart=$(date +%s)
  export ATEN_CPU_CAPABILITY=$aten ONEDNN_MAX_CPU_ISA=$onednn MKL_ENABLE_INSTRUCTIONS=$mkl
  "$PY" -c "import torch; print('kernel set $name: ATen', torch.backends.cpu.get_cpu_capability(), '| oneDNN <= $onednn | MKL <= $mkl')"
  "$PY" -m pytest -m numeric -q -p no:cacheprovider
  nrc=$?
  echo "numeric tests under kernel set $name: exit code $nrc after $(( $(date +%s) - nstart )) s"
  if [ "$nrc" != 0 ]; then exit 1; fi
done
