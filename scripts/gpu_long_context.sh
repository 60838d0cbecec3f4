#!/usr/bin/env bash
# The long-context tables on a CUDA machine (one call): the tree_attention GPU tests, the zoo dense pair with the
# default backends and with the former ones (SDPA attention, the RMSNorms' own forwards), and the 8 B dense shape's
# default path at 512 / 2 k / 8 k / 32 k (CONTEXTS=...), then the same with the former backends (OLD_CONTEXTS=...).
# Tables go to $1 (default ./long_context_out) and are printed last.
set -uo pipefail
out="${1:-long_context_out}"
mkdir -p "$out"
py="${PY:-python3}"
[ -n "${SKIP_TESTS:-}" ] || $py -m pytest -q -m gpu tests/kernels/test_tree_attention_lengths.py tests/kernels/test_tree_attention.py \
    -p no:cacheprovider > "$out/gpu_tests.log" 2>&1
[ -n "${SKIP_TESTS:-}" ] || tail -1 "$out/gpu_tests.log"
bench() { $py -m specdec bench progress=false "$@"; }
zoo_methods='methods=[{name: ar}, {name: ddtree, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [32], topk: [8]}}]'
old='backends={attention_kernel: sdpa, target_norm: torch}'
for which in new old; do
    backends='backends={}'
    [ "$which" = old ] && backends="$old"
    bench +experiment=dense num_prompts=10 repeat=2 warmup=1 eager_compare=false memory_rounds=0 "$zoo_methods" \
        "$backends" out_dir="/tmp/zoo-$which" > "$out/zoo_$which.log" 2>&1
    { echo "zoo dense, $backends"; grep -E "^\| (ar|ddtree)" "/tmp/zoo-$which/results.md" | head -2; } \
        > "$out/zoo_$which.md"
done
bench +experiment=long-context "${CONTEXTS:-contexts=[512,2048,8192,32768]}" out_dir=/tmp/lc > "$out/dense.log" 2>&1
cp /tmp/lc/long_context.md "$out/dense.md"
grep -h "graph floor" "$out/dense.log" >> "$out/dense.md"
bench +experiment=long-context "${OLD_CONTEXTS:-contexts=[512,32768]}" "$old" out_dir=/tmp/lc-old \
    > "$out/dense_old.log" 2>&1
cp /tmp/lc-old/long_context.md "$out/dense_old.md"
for f in "$out"/*.md; do echo "== $f"; cat "$f"; done
