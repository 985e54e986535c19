#!/usr/bin/env bash
# The main job: install (if needed), then rerun the COMET paper's central comparison (COMET vs the
# baseline Transformer on Multi30k De->En, trained to the paper's stopping rule, greedy decoding)
# and write the report to reports/main/. Extra arguments go to `cometnmt reproduce`
# (e.g. --rows comet transformer temporal_conv --seeds 1 2 3). Multi30k comes from
# $COMETNMT_MULTI30K_DIR if set, else ../shared/data/multi30k if present, else it is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
if [ -z "${COMETNMT_MULTI30K_DIR:-}" ] && [ -d ../shared/data/multi30k ]; then
  export COMETNMT_MULTI30K_DIR=$(cd ../shared/data/multi30k && pwd)
fi
if [ "$#" -eq 0 ]; then
  set -- --rows comet transformer --seeds 1
fi
exec cometnmt reproduce --out reports/main "$@"
