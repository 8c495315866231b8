#!/usr/bin/env bash
# Set up .venv with the test tools and run the whole test suite (slow end-to-end tests included).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest "$@"
