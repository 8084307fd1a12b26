#!/usr/bin/env bash
# Run the communication conformance suite on an NVIDIA machine, in one command.
#
#   backends/cuda/run_conformance.sh [extra pytest args]
#
# Needs a CUDA build of torch already installed (pip keeps it: sglang-vpp accepts torch>=2.6,<2.15),
# 2 GPUs for the P=2 cases and 4 for the P=4 cases (NCCL refuses two ranks on one GPU; the suite
# skips what the machine cannot run and says why). Results: $OUT_DIR (default ./out/conformance-nccl).
# INSTALL=0 skips the editable installs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python}"
OUT_DIR="${OUT_DIR:-$ROOT/out/conformance-nccl}"
mkdir -p "$OUT_DIR"
if [[ "${INSTALL:-1}" == "1" ]]; then
  "$PYTHON" -m pip install -q -e ".[test]" -e backends/cuda
fi
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print('GPUs:', torch.cuda.device_count())"
nvidia-smi -L || true
# Backend table, then a 2-rank self-test on real NCCL (fails loudly if NCCL cannot run).
"$PYTHON" -m sglang_vpp.cli.app doctor --backend nccl | tee "$OUT_DIR/doctor.txt"
# The whole suite: gloo, the device doubles and real nccl (tests/comm), plus the GPU-only cases.
"$PYTHON" -m pytest tests/comm tests/device -rs -v --durations=20 \
  --junitxml="$OUT_DIR/junit.xml" "$@" 2>&1 | tee "$OUT_DIR/pytest.txt"
