#!/usr/bin/env bash
# Create .venv (if missing) and install cometnmt with its test and tagging extras. Idempotent.
# PyTorch is pinned to 2.13.0 first: on our CPU machines its wheel is on disk, and asking for it
# by version keeps pip from pulling a multi-GB CUDA build. GPU machines keep their own torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[test,tagging]"
