#!/usr/bin/env bash
# Train the EAGLE-3 heads of the zoo targets on one GPU, side by side, with the settings of the shipped dense head
# (assets/drafters/zoo-dense-eagle3/TRAINING.md): this machine's Python standard library as the corpus (without the
# held-out networkx and sympy), 8192 prompts of 64 tokens continued by the target to 256, draft vocabulary 2048.
# The name hybrid-mtp trains the hybrid target's MTP head (Qwen3.5 layout, init random) with the same data settings
# (assets/drafters/zoo-hybrid-mtp/TRAINING.md).
#
#   bash scripts/gpu_train_eagle3.sh ZOO_DIR OUT_DIR [TRAIN_SECONDS] [TARGETS]
#
# TARGETS: "dense hybrid" (default), or any of dense, hybrid, hybrid-mtp (the shipped hybrid heads: "hybrid
# hybrid-mtp"). Env: DEVICE (cuda), NUM_SEQUENCES (8192), SEQ_LEN (256), PYTHON.
# OUT_DIR/<target>/ receives config.json + model.safetensors (official layout; hybrid-mtp: model-mtp.safetensors,
# the mtp.* tensors), train_log.jsonl, train_summary.json and TRAINING.md; OUT_DIR/<target>.log the run's log.
set -uo pipefail
ZOO=${1:?zoo folder (holding target-dense / target-hybrid, tokenizer, prompts_dev.jsonl)}
OUT=${2:?output folder}
SECS=${3:-180}
TARGETS=${4:-dense hybrid}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 SPECDEC_ZOO="$ZOO"
mkdir -p "$OUT"
for name in $TARGETS; do
    case "$name" in
        dense | hybrid | hybrid-mtp) ;;
        *) echo "unknown target $name (dense, hybrid, hybrid-mtp)" >&2; exit 2 ;;
    esac
done
STDLIB=$($PY -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
for name in $TARGETS; do
    case "$name" in
        dense | hybrid) head=(drafter=eagle3 target="$name" eagle3.draft_vocab_size=2048) key=eagle3 ;;
        hybrid-mtp) head=(drafter=mtp target=hybrid mtp.init=random) key=mtp ;;
    esac
    $PY -m specdec train "${head[@]}" corpus="$STDLIB" 'corpus_exclude=[networkx,sympy]' \
        max_corpus_tokens=4000000 prompts.limit=8 eval_new_tokens=64 $key.out_dir="$OUT/$name" \
        $key.prompt_tokens=64 $key.seq_len="${SEQ_LEN:-256}" $key.num_sequences="${NUM_SEQUENCES:-8192}" \
        $key.gen_batch_size=512 $key.batch_size=64 $key.lr=0.002 warmup_ratio=0.03 max_steps=1000000 \
        max_time_s="$SECS" eval_every=0 save_every=0 progress=false device="${DEVICE:-cuda}" \
        hydra.run.dir="$OUT/hydra-$name" > "$OUT/$name.log" 2>&1 &
done
status=0
for _ in $TARGETS; do
    wait -n || status=$?
done
for name in $TARGETS; do
    echo "== $name"
    grep -E "INFO" "$OUT/$name.log" | grep -v "Loading weights" | tail -n 6
done
exit $status
