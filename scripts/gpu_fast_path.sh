#!/usr/bin/env bash
# The fast-path tables of docs/performance.md and docs/hybrid.md on one zoo target, in one run (bf16, warm).
#   SPECDEC_ZOO=... bash scripts/gpu_fast_path.sh dense|hybrid OUT_DIR [STEP...]
# dense: the gpu tests, the fast-path table (HF rows, eager comparison of b15 / b63, memory) and the round profile.
# hybrid: the gpu tests, the bf16 prefill fidelity table, the sweep with both prefills (two passes), the round
# profile and the 8 B Qwen3.5 shape. Each step has its own time limit, so a slow step leaves the others' tables.
# STEP (default: tests fast profile, or tests fidelity sweep-model sweep-scan profile shape): tests, fast, profile,
# ratio (the rows timed pass by pass, --interleave --repeat 3, with budgets 31 / 63 whose 32 / 64 slots may tile
# better than 33 / 65), compiled (the same, compile=True), shape (Qwen3-8B shape, compiled too), compile-cache,
# kernels, attention (the 8B AR step with each attention kernel), autotune (the 8B AR step and b31 round with
# compile="max-autotune-no-cudagraphs"), verify-autotune (its 1/16/32/64-node verifies), verify-cublas and
# round-cublas (the verifies, and the AR step and b31 round, with max-autotune but cuBLAS products), linear (the split-K
# skinny kernel: its gpu tests, bench, and the uncompiled 8B rounds and verifies with it) (dense); tests, fidelity,
# sweep-model, sweep-scan, ratio, compiled, profile, shape, shape-compiled, verify-compiled (the 8 B verifies in
# inductor's default mode), verify-peaked (the verifies on deep trees, path schedule vs default), verify-autotune,
# verify-cublas, kernels, gdn-schedules (tree_gdn's path and matrix schedules, the matrix form's tiles), targets
# (every zoo-hybrid target in one pass-by-pass run), scan-fidelity (bf16 tokens with the tree scan's matrix form
# forced on 1-pass / 3-pass TF32 products, against HF greedy and the default) (hybrid). The whole default hybrid run takes
# about 20 minutes.
set -u
CUBLAS="max_autotune=True coordinate_descent_tuning=True max_autotune_gemm_backends=ATEN"  # compile={...} options
NAME=${1:?dense or hybrid}
OUT=${2:?output folder}
shift 2
if [ "$NAME" = dense ]; then DEFAULT="tests fast profile"; else DEFAULT="tests fidelity sweep-model sweep-scan profile shape"; fi
STEPS=" ${*:-$DEFAULT} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
export PYTHONPATH=${PYTHONPATH:-}:$(pwd) PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -c "import torch, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'transformers', transformers.__version__)"
tables() { grep -vE "^(WARNING|INFO|Loading)" "$1" | tail -"$2"; }
if [ "$NAME" = dense ]; then
    if want tests; then
        timeout 330 python3 -m pytest -m gpu tests/kernels tests/gpu -k "not hybrid and not gdn and not mamba2" -q \
            -p no:cacheprovider >"$OUT/gpu_tests.log" 2>&1; tail -1 "$OUT/gpu_tests.log"
    fi
    if want fast; then
        timeout 300 python3 benchmarks/e2e/fast_path.py --budgets 15 32 63 --eager-only ddtree-b15-k8 ddtree-b63-k8 \
            --out "$OUT/fast" >"$OUT/fast.log" 2>&1; tables "$OUT/fast.log" 40
    fi
    if want profile; then
        # the verify's heaviest kernels per budget (in prof.log): where a 33-slot verify pays more than a 16-slot one
        timeout 90 python3 benchmarks/e2e/round_profile.py --budgets 15 31 32 64 --top verify build \
            >"$OUT/prof.log" 2>&1
        grep -A10 "^# round" "$OUT/prof.log"
    fi
    if want ratio; then
        timeout 280 python3 benchmarks/e2e/fast_path.py --budgets 15 31 32 63 64 --no-hf --no-eager --memory-rounds 0 \
            --interleave --repeat 3 --out "$OUT/ratio" >"$OUT/ratio.log" 2>&1; tables "$OUT/ratio.log" 24
    fi
    if want compiled; then  # the same rows compiled under the graphs (cold compile + capture: about 4 minutes)
        timeout 420 python3 benchmarks/e2e/fast_path.py --compile --budgets 31 63 --no-hf --no-eager --memory-rounds 0 \
            --interleave --repeat 3 --out "$OUT/compiled" >"$OUT/compiled.log" 2>&1; tables "$OUT/compiled.log" 24
    fi
    if want shape; then  # the Qwen3-8B shape, compiled too (about 7 minutes)
        (cd benchmarks/e2e && timeout 560 python3 shape_8b.py --compile >"$OUT/shape.log" 2>&1); tail -16 "$OUT/shape.log"
    fi
    if want compile-cache; then
        timeout 400 python3 benchmarks/e2e/compile_cache.py --processes 2 >"$OUT/compile_cache.log" 2>&1
        tables "$OUT/compile_cache.log" 6
    fi
    if want kernels; then
        (cd benchmarks/kernels && timeout 90 python3 bench_device_tree.py --out "$OUT/kernels" >"$OUT/kernels.log" 2>&1)
        tail -18 "$OUT/kernels.log"
        (cd benchmarks/kernels && timeout 120 python3 bench_tree_attention.py --out "$OUT/kernels" \
            >"$OUT/attention_kernel.log" 2>&1); tail -20 "$OUT/attention_kernel.log"
    fi
    if want autotune; then  # about 5 minutes
        (cd benchmarks/e2e && timeout 420 python3 shape_8b.py --compile --compile-mode max-autotune-no-cudagraphs \
            --skip-verify >"$OUT/shape_autotune.log" 2>&1); grep "^|" "$OUT/shape_autotune.log"
    fi
    if want verify-autotune; then  # about 8 minutes (90-190 s of compilation per verify)
        (cd benchmarks/e2e && timeout 590 python3 shape_8b.py --compile --compile-mode max-autotune-no-cudagraphs \
            --verify-only >"$OUT/verify_autotune.log" 2>&1); grep "^|" "$OUT/verify_autotune.log"
    fi
    if want verify-cublas; then  # about 5 minutes
        (cd benchmarks/e2e && timeout 590 python3 shape_8b.py --compile --compile-options $CUBLAS --verify-only \
            >"$OUT/verify_cublas.log" 2>&1); grep "^|" "$OUT/verify_cublas.log"
    fi
    if want round-cublas; then  # about 4 minutes
        (cd benchmarks/e2e && timeout 420 python3 shape_8b.py --compile --compile-options $CUBLAS --skip-verify \
            >"$OUT/round_cublas.log" 2>&1); grep "^|" "$OUT/round_cublas.log"
    fi
    if want linear; then  # the split-K skinny kernel: gpu tests, kernel bench, the 8B rounds and verifies with it
        timeout 240 python3 -m pytest -m gpu tests/kernels/test_skinny_linear.py -q -p no:cacheprovider \
            >"$OUT/linear_tests.log" 2>&1; tail -1 "$OUT/linear_tests.log"
        (cd benchmarks/kernels && timeout 120 python3 bench_skinny_linear.py --out "$OUT/kernels" \
            >"$OUT/linear_kernel.log" 2>&1); tail -30 "$OUT/linear_kernel.log"
        (cd benchmarks/e2e && timeout 150 python3 shape_8b.py --linear-kernel triton >"$OUT/shape_linear.log" 2>&1)
        grep "^|" "$OUT/shape_linear.log"
    fi
    if want attention; then  # the 8B AR step with HF's, the grouped SDPA and the Triton split-K/V attention
        (cd benchmarks/e2e && timeout 420 python3 shape_8b.py --attention-ab >"$OUT/attn_ab.log" 2>&1)
        grep "^|" "$OUT/attn_ab.log"
    fi
else
    H="--target target-hybrid --drafter assets/drafters/zoo-hybrid"
    if want tests; then
        timeout 150 python3 -m pytest -m gpu tests/kernels tests/gpu -k "hybrid or gdn or mamba2" -q \
            -p no:cacheprovider >"$OUT/gpu_tests.log" 2>&1; tail -1 "$OUT/gpu_tests.log"
    fi
    if want fidelity; then
        timeout 200 python3 benchmarks/e2e/prefill_fidelity.py --out "$OUT/fidelity" >"$OUT/fidelity.log" 2>&1
        tables "$OUT/fidelity.log" 12
    fi
    for prefill in model scan; do
        want "sweep-$prefill" || continue
        SPECDEC_HYBRID_PREFILL=$prefill timeout 280 python3 benchmarks/e2e/fast_path.py $H --no-hf \
            --budgets 8 16 32 64 128 --repeat 2 --eager-only ddtree-b32-k8 ddtree-b64-k8 --memory-rounds 0 \
            --out "$OUT/sweep-$prefill" >"$OUT/sweep-$prefill.log" 2>&1; tables "$OUT/sweep-$prefill.log" 34
    done
    if want ratio; then
        timeout 280 python3 benchmarks/e2e/fast_path.py $H --no-hf --no-eager --budgets 16 31 32 63 64 --memory-rounds 0 \
            --interleave --repeat 3 --out "$OUT/ratio" >"$OUT/ratio.log" 2>&1; tables "$OUT/ratio.log" 24
    fi
    if want compiled; then  # the sweep compiled under the graphs (scan prefill), pass by pass
        SPECDEC_HYBRID_PREFILL=scan timeout 480 python3 benchmarks/e2e/fast_path.py $H --compile --no-hf \
            --budgets 16 32 64 --eager-only ddtree-b32-k8 ddtree-b64-k8 --memory-rounds 0 --interleave --repeat 2 \
            --out "$OUT/compiled" >"$OUT/compiled.log" 2>&1
        tables "$OUT/compiled.log" 24
    fi
    if want kernels; then
        (cd benchmarks/kernels && timeout 120 python3 bench_tree_mamba2.py --out "$OUT/kernels" >"$OUT/kernels.log" 2>&1)
        tail -30 "$OUT/kernels.log"
    fi
    if want profile; then
        SPECDEC_HYBRID_PREFILL=scan timeout 90 python3 benchmarks/e2e/round_profile.py $H --budgets 16 32 64 \
            >"$OUT/prof.log" 2>&1; grep -A9 "^# round" "$OUT/prof.log"
    fi
    if want shape; then
        timeout 150 python3 benchmarks/e2e/shape_8b.py --hybrid >"$OUT/shape.log" 2>&1; tail -22 "$OUT/shape.log"
    fi
    if want verify-compiled; then  # the 1/16/32/64-node verifies compiled in the default mode (about 5 minutes)
        (cd benchmarks/e2e && timeout 560 python3 shape_8b.py --hybrid --verify-only --compile \
            >"$OUT/verify_compiled.log" 2>&1)
        grep "^|" "$OUT/verify_compiled.log"
    fi
    if want gdn-schedules; then  # tree_gdn: path replay vs matrix form on the round's trees, and the chunk tiles
        (cd benchmarks/kernels && timeout 400 python3 bench_tree_gdn.py --providers paths-graph chunk-graph \
            --trees ddtree best-flat best-peaked --no-sweep --chunk-sweep --out "$OUT/kernels" \
            >"$OUT/gdn_schedules.log" 2>&1)
        grep -E "^ *(shape|zoo|qwen|tree|best)" "$OUT/gdn_schedules.log"
    fi
    if want verify-peaked; then  # the verifies on deep trees (as a trained drafter's), both schedules (about 5 min)
        for walk in paths auto; do
            (cd benchmarks/e2e && SPECDEC_TREE_GDN_WALK=$walk timeout 140 python3 shape_8b.py --hybrid --verify-only \
                --draft peaked >"$OUT/verify_peaked_$walk.log" 2>&1)
            echo "== $walk"; grep "^|" "$OUT/verify_peaked_$walk.log"
        done
    fi
    if want verify-autotune; then  # the 1/16/32/64-node verifies compiled with max-autotune (over 9 minutes)
        (cd benchmarks/e2e && timeout 590 python3 shape_8b.py --hybrid --verify-only --compile \
            --compile-mode max-autotune-no-cudagraphs >"$OUT/verify_autotune.log" 2>&1)
        grep "^|" "$OUT/verify_autotune.log"
    fi
    if want verify-cublas; then  # the same with cuBLAS products (compile={...} options)
        (cd benchmarks/e2e && timeout 590 python3 shape_8b.py --hybrid --verify-only --compile \
            --compile-options $CUBLAS >"$OUT/verify_cublas.log" 2>&1)
        grep "^|" "$OUT/verify_cublas.log"
    fi
    if want targets; then  # every zoo-hybrid target of the fast path in one run: pass by pass, eager identity, memory
        timeout 330 python3 benchmarks/e2e/fast_path.py $H --no-hf --budgets 16 32 64 --interleave --repeat 3 \
            --eager-only ddtree-b32-k8 ddtree-b64-k8 --memory-rounds 1000 --out "$OUT/targets" >"$OUT/targets.log" 2>&1
        tables "$OUT/targets.log" 42
    fi
    if want scan-fidelity; then  # bf16 tokens with the tree scan's matrix form forced, 1-pass and 3-pass TF32 products
        timeout 240 python3 benchmarks/e2e/fast_path.py $H --skip hf-static ar dflash-chain-k15 --budgets 16 32 63 \
            --no-eager --memory-rounds 0 --out "$OUT/scan-default" >"$OUT/scan-default.log" 2>&1
        grep "^| " "$OUT/scan-default.log"
        for p in tf32 tf32x3; do
            SPECDEC_TREE_GDN_WALK=chunk SPECDEC_TREE_GDN_PRECISION=$p timeout 100 python3 benchmarks/e2e/fast_path.py $H \
                --no-hf --skip ar dflash-chain-k15 --budgets 16 32 63 --no-eager --memory-rounds 0 \
                --out "$OUT/scan-$p" >"$OUT/scan-$p.log" 2>&1
            python3 benchmarks/e2e/compare_outputs.py "$OUT/scan-default" "$OUT/scan-$p" --against hf-generate
            python3 benchmarks/e2e/compare_outputs.py "$OUT/scan-default" "$OUT/scan-$p"
        done
    fi
    if want shape-compiled; then  # the 8 B hybrid with its AR step and b31 round compiled (several minutes)
        (cd benchmarks/e2e && timeout 540 python3 shape_8b.py --hybrid --compile >"$OUT/shape_compiled.log" 2>&1)
        tail -24 "$OUT/shape_compiled.log"
    fi
fi
