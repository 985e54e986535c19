#!/usr/bin/env bash
# The GPU work still open, cut into parts that each fit one 10-minute call of a lent device machine.
# Such a machine keeps no files once it goes idle, so every part finishes its runs inside the call
# (--deadline) and copies what the reports need (run records, hypotheses, metrics, logs; no
# checkpoints) under $OUT. Back here, copy them into the repository and rebuild the reports:
#   cp -r FILES_AT/reports/. reports/ && cometnmt reproduce --report-only ... (same --rows/--seeds/--set)
#
# Usage on the device machine (from the repository root, carrying .gpu built by scripts/gpu_bundle.sh):
#   source scripts/gpu_env.sh && bash scripts/gpu_session.sh PART
# PART, in order of priority:
#   grid     Table 1: the 14 runs the report misses, side by side: seeds 2 and 3 of conv4, dff1024,
#            n4, dropout03; seed 3 of ffn1, ffn2, src_sos_eos, n2, dm512; temporal_conv seed 2.
#            Runs the deadline stops resume from last.pt when the next call comes while the
#            machine is still warm (its ignored files survive between calls), so call it again.
#   bench    python bench/bench.py --gpu (bf16 and fp32) and bench/bench_transformer_pp.py on CUDA
#   tpp      Transformer++ against its same-size Transformer, Multi30k en->de, seeds 1-3 (6 runs),
#            the paper's recipe (average of the last 10 checkpoints, beam 5, length penalty 0.5);
#            8,192-token micro-batches instead of 1,024 x 8 accumulated (the same tokens per
#            update, 8x fewer steps)
# DEADLINE (seconds, default 480) bounds the training of a part; runs not finished by then are
# reported as missing and must be rerun in a later call.
set -euo pipefail
part=${1:?usage: bash scripts/gpu_session.sh grid|bench|tpp}
deadline=${DEADLINE:-480}
out=${OUT:?set OUT to the folder whose files come back}
export COMETNMT_COMMIT=${COMETNMT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

grid=(--set train.precision=bf16 --set train.batch_tokens=2048 --set train.lr=5e-4
      --set train.schedule=inverse_sqrt --set train.warmup_steps=1000 --set train.max_epochs=30
      --set train.valid_bleu_max_sentences=500)

keep() {  # copy run records and reports (no checkpoints) of folder $1 under $OUT
  [ -d "$1" ] || return 0
  mkdir -p "$out/$1"
  (cd "$1" && find . -type f ! -name '*.pt' -print0 | xargs -0 -I{} cp --parents {} "$out/$1/")
}

case "$part" in
  grid)  # three reproduce calls side by side (rows x seeds of each is exactly the missing runs)
    python -m cometnmt reproduce --rows conv4 dff1024 n4 dropout03 --seeds 2 3 --jobs 8 --deadline "$deadline" "${grid[@]}" \
      --out reports/gpu_grid_a > "$out/grid_a.log" 2>&1 &
    python -m cometnmt reproduce --rows ffn1 ffn2 src_sos_eos n2 dm512 --seeds 3 --jobs 5 --deadline "$deadline" "${grid[@]}" \
      --out reports/gpu_grid_b > "$out/grid_b.log" 2>&1 &
    python -m cometnmt reproduce --rows temporal_conv --seeds 2 --jobs 1 --deadline "$deadline" "${grid[@]}" \
      --out reports/gpu_grid_c > "$out/grid_c.log" 2>&1 &
    wait || true
    for g in a b c; do keep reports/gpu_grid_$g; done ;;
  bench)
    python bench/bench.py --gpu --precision bf16 --out "$out/gpu_bf16.json" --data-cache /tmp/bench_data.json.gz
    python bench/bench.py --gpu --precision fp32 --no-decode --out "$out/gpu_fp32.json" --data-cache /tmp/bench_data.json.gz
    python bench/bench_transformer_pp.py --device cuda --precision bf16 --out "$out/gpu_transformer_pp.json" ;;
  tpp)
    python -m cometnmt compare configs/multi30k/transformer_pp_en_de.yaml configs/multi30k/transformer_pp_baseline_en_de.yaml \
      --seeds 1 2 3 --jobs 6 --average-last 10 --deadline "$deadline" --out reports/transformer_pp_en_de \
      --set train.precision=bf16 --set train.batch_tokens=8192 --set train.accum_steps=1 \
      --set train.valid_bleu_max_sentences=500 || true
    keep reports/transformer_pp_en_de ;;
  *) echo "unknown part '$part'; use grid, bench or tpp" >&2; exit 2 ;;
esac
