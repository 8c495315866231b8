#!/usr/bin/env bash
# The whole loop on the built-in offline corpus: no network, no accelerator needed.
#   prepare -> train (cpu_smoke, ~2 min) -> eval -> package -> verify
# Each run gets its own directory under runs/, so the demo can be repeated.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/timing.sh demo.sh  # prints the time it took, the cores and the load, at the end
bash scripts/setup.sh
trnf=.venv/bin/trnf
run="runs/demo-$(date +%Y%m%d-%H%M%S)"

echo "== trnf prepare --source sample"
$trnf prepare --source sample
echo "== trnf train cpu_smoke --out $run"
$trnf train cpu_smoke --out "$run"
echo "== trnf eval $run"
$trnf eval "$run"
echo "== trnf package $run -o $run/submission.tar"
$trnf package "$run" -o "$run/submission.tar"
echo "== trnf verify $run/submission.tar"
$trnf verify "$run/submission.tar"
