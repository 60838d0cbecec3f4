#!/usr/bin/env bash
# The long-context tables on a CUDA machine (one call): the tree_attention GPU tests, the 8 B dense shape's default
# path at 512 / 2 k / 8 k / 32 k, the same at 32 k with SDPA (the former default), and the zoo dense pair with the
# kernel and with SDPA. Tables go to $1 (default ./long_context_out) and are printed last.
set -uo pipefail
out="${1:-long_context_out}"
mkdir -p "$out"
py="${PY:-python3}"
$py -m pytest -q -m gpu tests/kernels/test_tree_attention_lengths.py tests/kernels/test_tree_attention.py \
    -p no:cacheprovider > "$out/gpu_tests.log" 2>&1
tail -1 "$out/gpu_tests.log"
bench() { $py -m specdec bench progress=false "$@"; }
zoo_methods='methods=[{name: ar}, {name: ddtree, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [32], topk: [8]}}]'
for kernel in auto sdpa; do
    bench +experiment=dense num_prompts=10 repeat=2 warmup=1 eager_compare=false memory_rounds=0 "$zoo_methods" \
        "backends={attention_kernel: $kernel}" out_dir="/tmp/zoo-$kernel" > "$out/zoo_$kernel.log" 2>&1
    { echo "zoo dense, attention_kernel=$kernel"; grep -E "^\| (ar|ddtree)" "/tmp/zoo-$kernel/results.md" | head -2; } \
        > "$out/zoo_$kernel.md"
done
bench +experiment=long-context graph_floor=false "${CONTEXTS:-contexts=[512,2048,8192,32768]}" out_dir=/tmp/lc \
    > "$out/dense.log" 2>&1
cp /tmp/lc/long_context.md "$out/dense.md"
for f in "$out"/*.md; do echo "== $f"; cat "$f"; done
