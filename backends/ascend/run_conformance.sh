#!/usr/bin/env bash
# Run the communication conformance suite on an Ascend machine (910B/910C), in one command.
#
#   backends/ascend/run_conformance.sh [extra pytest args]
#
# Needs torch and the matching torch_npu already installed (Ascend's instructions; pip must not
# swap torch), CANN installed, 2 NPUs for the P=2 cases and 4 for the P=4 cases. Sources the CANN
# environment if it is at the default place. Results: $OUT_DIR (default ./out/conformance-hccl).
# INSTALL=0 skips the editable installs. HCCL_BUFFSIZE (MB per communicator, default 200, each
# communicator reserves twice that) is passed through; the doctor prints the value in use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python}"
OUT_DIR="${OUT_DIR:-$ROOT/out/conformance-hccl}"
CANN_ENV="${CANN_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}"
mkdir -p "$OUT_DIR"
if [[ -f "$CANN_ENV" ]]; then
  # shellcheck disable=SC1090
  set +u; source "$CANN_ENV"; set -u
fi
if [[ "${INSTALL:-1}" == "1" ]]; then
  "$PYTHON" -m pip install -q -e ".[test]" -e backends/ascend
fi
"$PYTHON" -c "import torch, torch_npu; assert torch.npu.is_available(), 'no NPU visible'; print('NPUs:', torch.npu.device_count())"
npu-smi info || true
# Backend table, then a 2-rank self-test on real HCCL (fails loudly if HCCL cannot run).
"$PYTHON" -m sglang_vpp.cli.app doctor --backend hccl | tee "$OUT_DIR/doctor.txt"
# The whole suite: gloo, the device doubles and real hccl (tests/comm), plus the NPU-only cases.
"$PYTHON" -m pytest tests/comm tests/device -rs -v --durations=20 \
  --junitxml="$OUT_DIR/junit.xml" "$@" 2>&1 | tee "$OUT_DIR/pytest.txt"
