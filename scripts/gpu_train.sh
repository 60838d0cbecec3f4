#!/usr/bin/env bash
# Train the DFlash drafters of the zoo targets on one GPU: tokenize the corpus once (the Python source of
# this machine's site-packages and standard library, without the held-out networkx and sympy), then train
# the dense and the hybrid drafter side by side for a fixed wall-clock budget.
#
#   bash scripts/gpu_train.sh ZOO_DIR OUT_DIR [TRAIN_SECONDS]
#
# OUT_DIR/{dense,hybrid}/ receive config.json + model.safetensors (z-lab layout), train_log.jsonl and
# train_summary.json. Recipe and results: docs/dflash.md.
set -euo pipefail
ZOO=${1:?zoo folder}
OUT=${2:?output folder}
SECS=${3:-330}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/specdec_train}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT" "$WORK"

read -r -a SRC <<<"${CORPUS:-$($PY -c "import os, site, sysconfig; print(*sorted(p for p in {*site.getsitepackages(), sysconfig.get_paths()['stdlib']} if os.path.isdir(p)))")}"
echo "corpus roots: ${SRC[*]}"
$PY -m specdec.train tokenize --tokenizer "$ZOO/tokenizer" --corpus "${SRC[@]}" \
    --corpus-exclude networkx sympy --out "$WORK/tokens.pt"

COMMON=(--tokenizer "$ZOO/tokenizer" --corpus-cache "$WORK/tokens.pt" --eval-prompts "$ZOO/prompts_dev.jsonl"
        --num-layers 3 --intermediate-size 512 --target-layer-ids 1 3 4 6 --block-size 16
        --seq-len 1024 --num-anchors 64 --batch-size 32 --lr 1.5e-3 --warmup-ratio 0.04
        --max-steps 1000000 --max-time-s "$SECS" --eval-every 1000 --eval-num-prompts 12
        --eval-prompt-tokens 256 --eval-new-tokens 128 --save-every 1000 --log-every 50 --no-progress)
for name in dense hybrid; do
    $PY -m specdec.train --target "$ZOO/target-$name" --out-dir "$OUT/$name" "${COMMON[@]}" >"$WORK/$name.log" 2>&1 &
done
status=0
wait -n || status=$?
wait -n || status=$?
for name in dense hybrid; do
    echo "== $name"; grep -v -e "Loading weights" -e "falling back" "$WORK/$name.log" | tail -n 25
done
exit $status
