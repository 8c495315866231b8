#!/usr/bin/env bash
# The whole loop on the built-in offline corpus: no network, no accelerator needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRNF_HOME="${TRNF_HOME:-$HOME/.cache/trnfrontier}"
.venv/bin/trnf prepare --source sample
