#!/usr/bin/env bash
# The round-cost tables on a CUDA machine, in stages that each fit one call of a few minutes:
#   scripts/gpu_round_cost.sh dense OUT     the kernels' GPU tests, tree_attention over long spans, the 8 B dense
#                                           shape's default path at 512 / 8 k / 32 k (CONTEXTS=...), its rounds
#                                           stage by stage (scripts/round_stages.py over the profiled calls)
#   scripts/gpu_round_cost.sh hybrid OUT    the 8 B Qwen3.5-style hybrid shape's default path at 512 / 16 k / 32 k
#                                           and the zoo dense pair (AR, DDTree b32; 10 prompts, two passes)
#   scripts/gpu_round_cost.sh compiled OUT  the 8 B dense shape compiled at 512 / 32 k
# Extra bench overrides go in BENCH_ARGS (e.g. 'backends={target_rotary: auto}'). Tables go to OUT (default
# ./round_cost_out) and are printed last.
set -uo pipefail
stage="${1:?stage: dense, hybrid or compiled}"
out="${2:-round_cost_out}"
mkdir -p "$out"
py="${PY:-python3}"
extra=${BENCH_ARGS:-}
bench() { $py -m specdec bench progress=false ${extra:+"$extra"} "$@"; }
case "$stage" in
dense)
    $py -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_tree_attention_lengths.py \
        tests/kernels/test_tree_attention.py tests/kernels/test_rms_norm_unit_offset.py tests/kernels/test_rotary.py \
        > "$out/gpu_tests.log" 2>&1
    tail -1 "$out/gpu_tests.log"
    (cd benchmarks/kernels && $py bench_tree_attention_long.py --out "$out") > "$out/kernel.log" 2>&1
    grep -v "^CSV" "$out/kernel.log" > "$out/kernel.md"
    bench +experiment=long-context "${CONTEXTS:-contexts=[512,8192,32768]}" profile=true out_dir="$out/lc-dense" \
        > "$out/dense.log" 2>&1
    cp "$out/lc-dense/long_context.md" "$out/dense.md"
    # each replayed round's kernels by stage and kind (the profiled call of every method and context)
    $py scripts/round_stages.py "$out"/lc-dense/context-*/profile/*.trace.json --top 16 > "$out/dense_stages.md" 2>&1
    ;;
hybrid)
    bench +experiment=long-context random_target.preset=qwen3.5-hybrid-8b "${CONTEXTS:-contexts=[512,16384,32768]}" \
        out_dir="$out/lc-hybrid" > "$out/hybrid.log" 2>&1
    cp "$out/lc-hybrid/long_context.md" "$out/hybrid.md"
    zoo='methods=[{name: ar}, {name: ddtree, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [32], topk: [8]}}]'
    bench +experiment=dense num_prompts=10 repeat=2 warmup=1 eager_compare=false memory_rounds=0 "$zoo" \
        out_dir="$out/zoo" > "$out/zoo.log" 2>&1
    grep -E "^\| (method|---|ar|ddtree)" "$out/zoo/results.md" | head -4 > "$out/zoo.md"
    ;;
compiled)
    bench +experiment=long-context compile=true "${CONTEXTS:-contexts=[512,32768]}" out_dir="$out/lc-compiled" \
        > "$out/compiled.log" 2>&1
    cp "$out/lc-compiled/long_context.md" "$out/compiled.md"
    ;;
*)
    echo "unknown stage $stage: dense, hybrid or compiled" >&2
    exit 2
    ;;
esac
for f in "$out"/*.md; do echo "== $f"; cat "$f"; done
