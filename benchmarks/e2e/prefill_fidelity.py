"""Hybrid targets in bf16: how often each way of decoding gives the same tokens (no timing).

    python benchmarks/e2e/prefill_fidelity.py --target target-hybrid --drafter assets/drafters/zoo-hybrid \
        --num-prompts 20 --max-new-tokens 128 --budget 32

Decodes the same prompts (first greedy token not EOS) with HF's own greedy ``generate``, specdec's eager path
(DDTree), and the fast path (AR and DDTree) with each hybrid prefill (``model``: the model's own forward copied
into static storage, the default; ``graph``: the captured chain-tree verify), and prints the share of outputs
equal to HF greedy and to the eager path. In fp32 all of them are token-identical (``tests/``); in bf16 two
exact computations that round in a different order can resolve a near-tie differently, and this table shows how
often that happens.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from _zoo import decodable_prompts, zoo_pair  # benchmarks/e2e, beside this script

import specdec
import specdec.fast.engine as fast_engine
from specdec.loading import resolve_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="target-hybrid")
    ap.add_argument("--drafter", default="assets/drafters/zoo-hybrid")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--out", default="bench_out/prefill_fidelity")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    device, dtype = resolve_device(args.device, args.dtype)
    model, tok, drafter = zoo_pair(args.target, args.drafter, device, dtype)
    prompts = [ids for _, ids in decodable_prompts(model, tok, args.num_prompts)]
    tree, new = specdec.DDTree(budget=args.budget, topk=args.topk), args.max_new_tokens

    def tail(seq, ids):
        return seq[0, ids.shape[1] :].tolist()

    outs = {"hf-generate": [tail(model.generate(ids, max_new_tokens=new, do_sample=False), ids) for ids in prompts]}
    outs["eager-ddtree"] = [
        tail(
            specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=new, cuda_graphs=False).sequences,
            ids,
        )
        for ids in prompts
    ]
    saved = fast_engine._HYBRID_PREFILL
    try:
        for mode in ("model", "graph"):
            fast_engine._HYBRID_PREFILL = mode
            for name, d, t in (("ar", None, None), ("ddtree", drafter, tree)):
                outs[f"fast-{name}-prefill-{mode}"] = [
                    tail(
                        specdec.generate(model, ids, drafter=d, tree=t, max_new_tokens=new, cuda_graphs=True).sequences,
                        ids,
                    )
                    for ids in prompts
                ]
    finally:
        fast_engine._HYBRID_PREFILL = saved
    lines = [
        f"# decoding fidelity, {args.target}, {device}, {dtype}, {len(prompts)} prompts x {new} new tokens, "
        f"DDTree b{args.budget} topk {args.topk}",
        "",
        "| run | = HF greedy | = eager path (DDTree) |",
        "|---|---|---|",
    ]
    for name, seqs in outs.items():
        hf = sum(a == b for a, b in zip(seqs, outs["hf-generate"], strict=True))
        eager = sum(a == b for a, b in zip(seqs, outs["eager-ddtree"], strict=True))
        lines.append(f"| {name} | {hf}/{len(seqs)} | {eager}/{len(seqs)} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "outputs.json").write_text(json.dumps(outs))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
