#!/usr/bin/env bash
# Recipe check on a GPU (choose on val): COMET and Transformer, seed 1, under three training
# settings, all side by side on one GPU. Usage: bash scripts/gpu_sweep.sh OUTDIR
# Every arm names its learning rate, schedule and batch size: the presets carry the recipe this
# check chose (inverse-sqrt, 5e-4, 2,048 tokens), so an arm that left them to the presets would
# train that recipe whatever its folder says.
set -u
out=${1:-/tmp/sweep}
mkdir -p "$out"
common=(--rows comet transformer --seeds 1 --jobs 2 --set train.precision=bf16 --set train.max_epochs=40)
python -m cometnmt reproduce "${common[@]}" --out "$out/paper_lr1e-4_tok4096" --set train.batch_tokens=4096 \
  --set train.lr=1e-4 --set train.schedule=constant > "$out/a.log" 2>&1 &
python -m cometnmt reproduce "${common[@]}" --out "$out/lr1e-4_tok1024" --set train.batch_tokens=1024 \
  --set train.lr=1e-4 --set train.schedule=constant > "$out/b.log" 2>&1 &
python -m cometnmt reproduce "${common[@]}" --out "$out/invsqrt5e-4_tok2048" --set train.batch_tokens=2048 \
  --set train.lr=5e-4 --set train.schedule=inverse_sqrt --set train.warmup_steps=1000 > "$out/c.log" 2>&1 &
wait
