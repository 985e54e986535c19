#!/usr/bin/env bash
# The test command: install (if needed) and run the whole pytest suite on the CPU.
# Multi30k comes from $COMETNMT_MULTI30K_DIR, default ../shared/data/multi30k beside the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export COMETNMT_MULTI30K_DIR=${COMETNMT_MULTI30K_DIR:-$(cd .. && pwd)/shared/data/multi30k}
exec python -m pytest -q "$@"
