#!/usr/bin/env bash
# The GPU results of docs/results.md: the zoo sweep on one zoo target (bf16, eager), DFlash chain and DDTree.
#   SPECDEC_ZOO=... bash scripts/gpu_results.sh dense|hybrid OUT_DIR NUM_PROMPTS MAX_NEW_TOKENS [TOPK...]
set -u
NAME=${1:?dense or hybrid}
OUT=${2:?output folder}
NPROMPTS=${3:-12}
NEW=${4:-256}
shift 4 || true
TOPK=${*:-0 8}
export PYTHONPATH=${PYTHONPATH:-}:$(pwd)
mkdir -p "$OUT"
python3 -c "import torch, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'transformers', transformers.__version__)"
timeout 540 python3 benchmarks/e2e/zoo_sweep.py --target "target-$NAME" --drafter "assets/drafters/zoo-$NAME" \
    --num-prompts "$NPROMPTS" --max-new-tokens "$NEW" --topk $TOPK --out "$OUT/gpu-$NAME" >"$OUT/$NAME.log" 2>&1
echo "exit $?"
cat "$OUT/gpu-$NAME/results.md" 2>/dev/null || tail -5 "$OUT/$NAME.log"
