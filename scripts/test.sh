#!/usr/bin/env bash
# Set up .venv with the test tools, run ruff and mypy (configured in pyproject.toml), then the
# whole test suite (slow end-to-end tests included).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow" -x
#   --under-load[=N]   run the suite while N busy processes (default: one per core) load the
#                      CPU, as on a shared CI runner; no test may depend on the machine's speed.
#                      TRNF_TEST_LOAD=N does the same.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/timing.sh test.sh  # prints the time it took, the cores and the load, at the end
load="${TRNF_TEST_LOAD:-0}"
args=()
for arg in "$@"; do
    case "$arg" in
        --under-load) load="$(nproc)" ;;
        --under-load=*) load="${arg#*=}" ;;
        *) args+=("$arg") ;;
    esac
done
bash scripts/setup.sh dev
# Lint and types first: CI fails on them before spending minutes on the suite.
echo "test.sh: ruff check, mypy" >&2
.venv/bin/python -m ruff check trnfrontier tests prepare.py kernels benchmarks scripts
.venv/bin/python -m mypy
if [ "$load" -gt 0 ]; then
    .venv/bin/python scripts/cpu_load.py "$load" &
    load_pid=$!
    trap 'rc=$?; kill "$load_pid" 2>/dev/null || true; timing_report "$rc"' EXIT
    echo "test.sh: $load busy processes load the CPU while the tests run" >&2
fi
.venv/bin/python -m pytest ${args[@]+"${args[@]}"}
