#!/usr/bin/env bash
# The GPU suite with both zoo targets, and the auto budget against plain decoding and fixed budgets at every batch
# size, on one GPU (bf16):
#   scripts/gpu_trust.sh OUT STEP [ZOO]
# ZOO (default $SPECDEC_ZOO) must hold both zoo targets. STEP:
#   suite        make test-gpu (every gpu-marked test) with that zoo
#   auto-dense   AR, DDTree b15 / b31 / b63 and DDTree(budget="auto") at B = 1, 2, 4, 8, 16, 32 on the zoo dense
#                pair: 32 dev prompts (the first 32, tuned on) and 32 held-out ones (dev prompts 49-80); one warm-up
#                and AUTO_REPEAT (default 3) timed passes, interleaved (pass p of every method and B before pass p + 1);
#                each sweep within SWEEP_TIMEOUT seconds (280)
#   auto-hybrid  the same on the zoo hybrid pair
#   rejection    the tree-rejection kernel's compiled GPU tests alone (the slowest of the suite)
# Logs and bench folders under OUT; the tables (scripts/auto_budget_table.py) at the end.
set -u
OUT=${1:?usage: scripts/gpu_trust.sh OUT STEP [ZOO]}
STEP=${2:?usage: scripts/gpu_trust.sh OUT STEP [ZOO]}
export SPECDEC_ZOO=${3:-${SPECDEC_ZOO:?set SPECDEC_ZOO or pass ZOO}}
mkdir -p "$OUT"
tail -n 32 "$SPECDEC_ZOO/prompts_dev.jsonl" > "$OUT/held32.jsonl"
# AUTO_ARGS: more fields of the auto tree, e.g. AUTO_ARGS='clock: [device, wall]' (one auto row per value);
# BATCH_SIZES (default [1,2,4,8,16,32])
METHODS="methods=[{name: ar},{name: ddtree, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [15, 31, 63], topk: 8}},{name: ddtree-auto, drafter: {kind: dflash}, tree: {kind: ddtree, budget: auto, topk: 8${AUTO_ARGS:+, $AUTO_ARGS}}}]"
sweep() {  # name target prompts-args...
  local name=$1 target=$2
  shift 2
  timeout ${SWEEP_TIMEOUT:-280} python -m specdec bench +experiment=batch target="$target" num_prompts=32 max_new_tokens=64 \
    "batch_sizes=${BATCH_SIZES:-[1,2,4,8,16,32]}" interleave=true repeat=${AUTO_REPEAT:-3} progress=false out_dir="$OUT/$name" "$METHODS" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
case "$STEP" in
  suite)
    make test-gpu GPU_PY=python3 2>&1 | tee "$OUT/suite.log" | tail -n 60
    ;;
  auto-dense)
    sweep dense_dev dense
    sweep dense_held dense prompts.path="$OUT/held32.jsonl"
    python scripts/auto_budget_table.py "$OUT/dense_dev" "$OUT/dense_held"
    ;;
  auto-hybrid)
    sweep hybrid_dev hybrid
    sweep hybrid_held hybrid prompts.path="$OUT/held32.jsonl"
    python scripts/auto_budget_table.py "$OUT/hybrid_dev" "$OUT/hybrid_held"
    ;;
  rejection)
    timeout 300 python3 -m pytest -q -m gpu -n 3 -p no:cacheprovider tests/kernels/test_tree_rejection.py \
      --test-budget=120 --durations=5 2>&1 | tee "$OUT/rejection.log" | tail -n 12
    ;;
  *)
    echo "unknown step $STEP (suite, auto-dense, auto-hybrid, rejection)" >&2
    exit 2
    ;;
esac
