#!/usr/bin/env bash
# Install SGLang 0.5.23 for CPU-only serving, plus this project (editable) and its test extra.
#
# Why not `pip install sglang`: sglang 0.5.23 pins torch==2.14.1 and CUDA-only kernels
# (flashinfer, sglang-kernel, ...). On CPU we keep the CPU torch wheel (2.13.0), install sglang
# and xgrammar with --no-deps, and install what SGLang's generic serving path really imports.
# Details: docs/sglang-cpu.md. Idempotent; about 1 minute with the wheels cached.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"

# CPU torch first, so nothing below can pull a CUDA build (2.13.0 is what the project tests on).
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.') else 1)" 2>/dev/null; then
  # On the project's machines this resolves to the local CPU wheel (see docs/sglang-cpu.md).
  "$PY" -m pip install "torch==2.13.0"
fi

"$PY" -m pip install -r requirements/sglang-cpu.txt
"$PY" -m pip install --no-deps -r requirements/sglang-cpu-nodeps.txt
# Mooncake's transfer engine (prefill-decode KV transfer) links libibverbs even over TCP.
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    if ! (apt-get install -y libibverbs1 || { apt-get update && apt-get install -y libibverbs1; }); then
      echo "WARNING: apt-get could not install libibverbs1 (offline mirror?): prefill-decode" \
        "disaggregation over Mooncake will not start until it is installed." >&2
    fi
  else
    echo "WARNING: libibverbs.so.1 is missing and apt-get is not usable here (not root or" \
      "no apt): install libibverbs1 (Debian/Ubuntu) or rdma-core (RPM) before running" \
      "prefill-decode disaggregation; everything else works without it." >&2
  fi
fi
# The project itself registers the SGLang plugin through its entry points.
"$PY" -m pip install -e ".[test]"

"$PY" -c "import sglang, sglang.version as v; assert v.__version__ == '0.5.23', v.__version__; print('sglang', v.__version__, 'OK')"
"$PY" -c "import mooncake.engine, sglang_router, prometheus_client; print('PD (mooncake, sglang-router) OK')" \
  || echo "WARNING: the prefill-decode packages do not import (see above); docs/pd.md" >&2
