#!/usr/bin/env bash
# The test command of the README: install everything (project, test tools, SGLang for CPU) and
# run the whole suite, slow end-to-end tests included, and list the slowest steps (where CI time
# goes). Extra arguments go to one plain pytest run instead (a path, -k, -m, ...).
#
# The whole suite runs in two parts. The tests of the schedule core and the simulator are pure
# Python (no servers, no rank processes, no ports), so two pytest-xdist workers split them, one per
# core of a 2-core host. Everything else (rank processes, SGLang servers, comm groups) runs one
# test at a time, as each of those tests already uses the cores and binds ports of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
bash scripts/install.sh
PYTHON="$PY" bash scripts/install_sglang_cpu.sh
if [ "$#" -gt 0 ]; then
  exec "$PY" -m pytest -ra --durations=30 "$@"
fi
PURE=(tests/schedule tests/sim)
pure=0
"$PY" -m pytest -ra --durations=10 -n 2 "${PURE[@]}" || pure=$?
rest=0
"$PY" -m pytest -ra --durations=30 "${PURE[@]/#/--ignore=}" || rest=$?
echo "pure-Python part: exit ${pure}; the rest: exit ${rest}"
if [ "$pure" -ne 0 ]; then exit "$pure"; fi  # pytest's own code: 1 failed tests, 2-5 usage/internal
exit "$rest"
