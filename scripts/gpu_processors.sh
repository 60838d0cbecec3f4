#!/usr/bin/env bash
# Processors under trees and the auto budget at large batches on one GPU (zoo dense pair, bf16):
#   scripts/gpu_processors.sh OUT
# 1. the GPU tests of processors and of the auto budget; 2. +experiment=processors on the first 20 dev prompts and
# on 20 held-out ones (dev prompts 61-80, never tuned on); 3. AR / DDTree b32 / DDTree auto at B = 1, 16, 32 on 32
# held-out prompts (dev prompts 49-80). Each step's log and results under OUT; a table of each at the end.
set -u
OUT=${1:?usage: scripts/gpu_processors.sh OUT}
mkdir -p "$OUT"
tail -n 20 assets/zoo/prompts_dev.jsonl > "$OUT/held20.jsonl"
tail -n 32 assets/zoo/prompts_dev.jsonl > "$OUT/held32.jsonl"
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_processors_cuda.py \
  tests/gpu/test_auto_budget_cuda.py -s > "$OUT/gpu_tests.log" 2>&1
tail -n 3 "$OUT/gpu_tests.log"
timeout 150 python -m specdec bench +experiment=processors num_prompts=20 progress=false out_dir="$OUT/proc_dev" \
  > "$OUT/proc_dev.log" 2>&1
timeout 150 python -m specdec bench +experiment=processors num_prompts=20 prompts.path="$OUT/held20.jsonl" \
  progress=false out_dir="$OUT/proc_held" > "$OUT/proc_held.log" 2>&1
timeout 200 python -m specdec bench +experiment=batch num_prompts=32 prompts.path="$OUT/held32.jsonl" \
  'batch_sizes=[1,16,32]' progress=false out_dir="$OUT/batch_held" \
  'methods=[{name: ar},{name: ddtree, drafter: {kind: dflash}, tree: {kind: ddtree, budget: 32, topk: 8}},{name: ddtree-auto, drafter: {kind: dflash}, tree: {kind: ddtree, budget: auto, topk: 8}}]' \
  > "$OUT/batch_held.log" 2>&1
for d in proc_dev proc_held batch_held; do echo "== $d"; tail -n 14 "$OUT/$d.log"; done
