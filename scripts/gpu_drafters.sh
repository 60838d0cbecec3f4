#!/usr/bin/env bash
# Drafters at equal node budgets and the verification rules' round cost, on one GPU (zoo dense pair unless said, bf16):
#   scripts/gpu_drafters.sh OUT STEP
# STEP:
#   eagle   greedy, 10 dev prompts x 128 tokens: AR; DFlash + DDTree b15 / b31 / b60; the shipped EAGLE-3 head
#           (assets/drafters/zoo-dense-eagle3) with Chain 4, DDTree b15 / b31 / b60 over its per-depth q, DDTree over
#           its candidate tree and DynamicTree at 15 / 31 / 60 drafted nodes (total_tokens 16 / 32 / 61); then T = 1:
#           sample-and-match over DynamicTree 32 against multi-draft rejection (RSD, SpecInfer) and traversal over
#           EAGLE-3 sampled trees of about 32 nodes (eagle-t1: that T = 1 part alone)
#   rules   T = 1, 10 dev prompts x 128 tokens, DFlash: sample-and-match over DDTree b15 / b32, RSD over the
#           stochastic DDTree b15 / b32, SpecInfer over unmerged sampled paths (32 nodes), speculative sampling over a
#           sampled chain of 15, block verification over it, traversal over sampled trees (4 x 8): tok/s, tau and ms per
#           round of each rule x policy
#   hybrid  greedy, zoo hybrid pair (SPECDEC_ZOO must hold target-hybrid): AR; DFlash + DDTree b15 / b31 / b60; the
#           shipped EAGLE-3 head (assets/drafters/zoo-hybrid-eagle3) with Chain 4, DDTree b15 / b31 / b60 and
#           DynamicTree at 16 / 32 / 61 tokens; the shipped MTP head (assets/drafters/zoo-hybrid-mtp, added to a copy
#           of the target's checkpoint in OUT/target-hybrid-mtp) with Chain 1 / 3 and DDTree b15 / b31; and, where
#           git has it, the former CPU-trained MTP head of commit 6a8501a with Chain 3
#   tests   the tree-rejection kernel's GPU tests (its float32 path)
# Logs and bench folders under OUT. NUM_PROMPTS (10) and NEW_TOKENS (128) set the prompts and new tokens per prompt.
set -u
OUT=${1:?usage: scripts/gpu_drafters.sh OUT STEP}
STEP=${2:?usage: scripts/gpu_drafters.sh OUT STEP}
mkdir -p "$OUT"
E3='{kind: eagle3, path: assets/drafters/zoo-dense-eagle3}'
bench() {  # name args...
  local name=$1
  shift
  set -- "${@//$'\n'/}"  # the methods lists below span lines: one line for hydra
  timeout 280 python -m specdec bench num_prompts="${NUM_PROMPTS:-10}" max_new_tokens="${NEW_TOKENS:-128}" warmup=1 \
    progress=false \
    out_dir="$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
  tail -n 40 "$OUT/$name.log" | grep -E '^[│|┃]' || true
}
eagle_t1() {
    bench eagle_t1 'temperatures=[1.0]' "methods=[{name: ar},
      {name: eagle3-dyn32-sm, drafter: $E3, tree: {kind: dynamic, depth: 6, topk: 8, total_tokens: 32}, verifier: {name: sample-match}},
      {name: eagle3-sdd32-rsd, drafter: $E3, tree: {kind: stochastic-ddtree, budget: 32, topk: 8}, verifier: {name: multi-draft, replacement: false}},
      {name: eagle3-trie-rsd, drafter: $E3, tree: {kind: sampled-trees, k: 4, depth: 8}, verifier: {name: multi-draft, replacement: false}},
      {name: eagle3-paths-specinfer, drafter: $E3, tree: {kind: sampled-trees, k: 4, depth: 8, merge: false}, verifier: {name: multi-draft, replacement: true}},
      {name: eagle3-dd32-sm, drafter: $E3, tree: {kind: ddtree, budget: 32, topk: 8}, verifier: {name: sample-match}},
      {name: eagle3-trie-trav, drafter: $E3, tree: {kind: sampled-trees, k: 4, depth: 8}, verifier: {name: traversal}}]"
}
case "$STEP" in
  eagle)
    bench eagle_greedy "methods=[{name: ar},
      {name: dflash, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [15, 31, 60], topk: [8]}},
      {name: eagle3-chain, drafter: $E3, tree: {kind: chain, k: 4}},
      {name: eagle3, drafter: $E3, tree: {kind: ddtree, budget: [15, 31, 60], topk: [8]}},
      {name: eagle3-cand, drafter: $E3, tree: {kind: ddtree, budget: [15, 31, 60], topk: [10], candidates: true}},
      {name: eagle3-dyn16, drafter: $E3, tree: {kind: dynamic, depth: 5, topk: 4, total_tokens: 16}},
      {name: eagle3-dyn32, drafter: $E3, tree: {kind: dynamic, depth: 6, topk: 8, total_tokens: 32}},
      {name: eagle3-dyn61, drafter: $E3, tree: {kind: dynamic, depth: 7, topk: 10, total_tokens: 61}}]"
    eagle_t1
    ;;
  eagle-t1)
    eagle_t1
    ;;
  rules)
    bench rules_t1 'temperatures=[1.0]' "methods=[{name: ar},
      {name: sm, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [15, 32], topk: [8]}, verifier: {name: sample-match}},
      {name: rsd, drafter: {kind: dflash}, tree: {kind: stochastic-ddtree, budget: [15, 32], topk: 8}, verifier: {name: multi-draft, replacement: false}},
      {name: specinfer, drafter: {kind: dflash}, tree: {kind: sampled-trees, k: 4, depth: 8, merge: false}, verifier: {name: multi-draft, replacement: true}},
      {name: spec-sampling, drafter: {kind: dflash}, tree: {kind: sampled-chain, k: 15}, verifier: {name: speculative-sampling}},
      {name: block, drafter: {kind: dflash}, tree: {kind: sampled-chain, k: 15}, verifier: {name: block}},
      {name: traversal, drafter: {kind: dflash}, tree: {kind: sampled-trees, k: 4, depth: 8}, verifier: {name: traversal}}]"
    ;;
  hybrid)
    python -c "import sys; from specdec.loading import zoo_dir; from specdec.drafters.mtp import with_mtp_head as w
w(zoo_dir() / 'target-hybrid', 'assets/drafters/zoo-hybrid-mtp', sys.argv[1])" "$OUT/target-hybrid-mtp" || exit 1
    H3='{kind: eagle3, path: assets/drafters/zoo-hybrid-eagle3}'
    MTP="{kind: mtp, path: $OUT/target-hybrid-mtp}"
    OLD=""  # the former head, from the commit before it was replaced, as a row of its own
    if git show 6a8501a:assets/drafters/zoo-hybrid-mtp/model-mtp.safetensors > "$OUT/model-mtp-old.safetensors" \
        2> /dev/null; then
      mkdir -p "$OUT/mtp-old-head" && mv "$OUT/model-mtp-old.safetensors" "$OUT/mtp-old-head/model-mtp.safetensors"
      python -c "import sys; from specdec.loading import zoo_dir; from specdec.drafters.mtp import with_mtp_head as w
w(zoo_dir() / 'target-hybrid', sys.argv[1], sys.argv[2])" "$OUT/mtp-old-head" "$OUT/target-hybrid-mtp-old" || exit 1
      OLD=", {name: mtp-old-chain, drafter: {kind: mtp, path: $OUT/target-hybrid-mtp-old}, tree: {kind: chain, k: 3}}"
    fi
    bench hybrid_greedy target=hybrid "methods=[{name: ar},
      {name: dflash, drafter: {kind: dflash}, tree: {kind: ddtree, budget: [15, 31, 60], topk: [8]}},
      {name: e3-chain, drafter: $H3, tree: {kind: chain, k: 4}},
      {name: e3-dd, drafter: $H3, tree: {kind: ddtree, budget: [15, 31, 60], topk: [8]}},
      {name: e3-dyn16, drafter: $H3, tree: {kind: dynamic, depth: 5, topk: 4, total_tokens: 16}},
      {name: e3-dyn32, drafter: $H3, tree: {kind: dynamic, depth: 6, topk: 8, total_tokens: 32}},
      {name: e3-dyn61, drafter: $H3, tree: {kind: dynamic, depth: 7, topk: 10, total_tokens: 61}},
      {name: mtp-chain, drafter: $MTP, tree: {kind: chain, k: [1, 3]}},
      {name: mtp-dd, drafter: $MTP, tree: {kind: ddtree, budget: [15, 31], topk: [8]}}$OLD]"
    ;;
  tests)
    timeout 300 python3 -m pytest -q -m gpu -n 3 -p no:cacheprovider tests/kernels/test_tree_rejection.py \
      --test-budget=150 --durations=5 2>&1 | tee "$OUT/tests.log" | tail -n 12
    ;;
  *)
    echo "unknown step $STEP (eagle, rules, hybrid, tests)" >&2
    exit 2
    ;;
esac
