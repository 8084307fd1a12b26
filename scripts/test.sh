#!/usr/bin/env bash
# The test command of the README: install everything (project, test tools, SGLang for CPU) and
# run the whole suite, slow end-to-end tests included, and list the 30 slowest steps (where CI
# time goes). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh
PYTHON="$PY" bash scripts/install_sglang_cpu.sh
exec "$PY" -m pytest -ra --durations=30 "$@"
