# Source this on a lent GPU machine that cannot reach a package index: installs wheels carried in
# .whl/ (spaCy, sacremoses and their needs) into /tmp/site and points Multi30k at a carried copy.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export COMETNMT_MULTI30K_DIR=${COMETNMT_MULTI30K_DIR:-$PWD/.gpu/data}
export PYTHONUNBUFFERED=1
