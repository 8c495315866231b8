#!/usr/bin/env bash
# Create (or reuse) .venv and install trnf into it. Idempotent: a second run takes seconds.
#   scripts/setup.sh          runtime + tool
#   scripts/setup.sh dev      also the test tools
# Torch: an existing torch in the venv is kept (a Trainium DLAMI venv keeps its
# torch / torch-neuronx). Otherwise the CPU build is installed where no NVIDIA GPU is
# present, because plain `pip install torch` pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
PY="${PYTHON:-python3}"
VENV="${TRNF_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        "${PIP[@]}" install "torch>=2.9"
    else
        # The +cpu wheel from PyTorch's CPU index where it is reachable (asked once, with a
        # short timeout, so an unreachable index costs no pip retries); otherwise whatever
        # source pip is configured with (PyPI, a local wheel).
        cpu_index=https://download.pytorch.org/whl/cpu
        index_args=()
        if "$VENV/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/', timeout=5)" \
            "$cpu_index" 2>/dev/null; then
            index_args=(--extra-index-url "$cpu_index")
        else
            echo "setup: PyTorch's CPU index is unreachable; installing torch 2.13.0 from the configured index" >&2
        fi
        "${PIP[@]}" install "torch==2.13.0" "${index_args[@]}" \
            || { echo "setup: torch did not install; see the README's install notes" >&2; exit 1; }
    fi
fi
# bubblewrap: the sandbox `trnf verify` runs archive code in. Installed where this script
# can (root with apt-get); otherwise it says how, and verify refuses to run archive code
# without it unless given --allow-unsandboxed.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1; }; } \
            && echo "setup: installed bubblewrap (the sandbox for trnf verify)" >&2 \
            || echo "setup: could not install bubblewrap with apt-get; trnf verify will not run archive code without it (see docs/ci.md)" >&2
    else
        echo "setup: bubblewrap (bwrap) is not installed and this script cannot install it (not root, or no apt-get);" \
             "install it (sudo apt-get install bubblewrap, or dnf/pacman install bubblewrap): trnf verify runs archive code only inside it" >&2
    fi
fi
target="."
[ "$extra" = "dev" ] && target=".[dev]"
"${PIP[@]}" install -e "$target" || { echo "setup: installing trnf failed (see pip's message above)" >&2; exit 1; }
"$VENV/bin/trnf" --version >/dev/null || { echo "setup: trnf did not install" >&2; exit 1; }
