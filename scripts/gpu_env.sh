# Source this on a lent GPU machine that cannot reach a package index (build the carry first with
# scripts/gpu_bundle.sh and carry .gpu): unpacks spaCy, sacremoses and the English spaCy pipeline
# into /tmp/site (from .gpu/site.tar.xz, else installs the wheels of .whl/) and points Multi30k at
# the carried copy, and the tag cache at the carried one (.gpu/cache).
if [ -f .gpu/site.tar.xz ]; then
  mkdir -p /tmp && tar -C /tmp -xJf .gpu/site.tar.xz
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
export COMETNMT_MULTI30K_DIR=${COMETNMT_MULTI30K_DIR:-$PWD/.gpu/data}
[ -d .gpu/cache ] && export COMETNMT_CACHE=${COMETNMT_CACHE:-$PWD/.gpu/cache}  # Transformer++'s tag cache
export PYTHONUNBUFFERED=1
