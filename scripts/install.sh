#!/usr/bin/env bash
# Install sglang-vpp (schedule core, simulator, comm, reference runtime, CLI) on a fresh machine.
# CPU torch 2.13.0 first so nothing pulls a multi-GB CUDA build. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install "torch==2.13.0"
fi
"$PY" -m pip install -e ".[test]"
