"""Hybrid targets in bf16: how often each way of decoding gives the same tokens (no timing).

    python benchmarks/e2e/prefill_fidelity.py --target target-hybrid --drafter assets/drafters/zoo-hybrid \
        --num-prompts 20 --max-new-tokens 128 --budget 32

Decodes the same prompts (first greedy token not EOS) with HF's own greedy ``generate`` and, under each hybrid
prefill (``SPECDEC_HYBRID_PREFILL``: ``model``, the model's own forward, the default; ``scan``, the prompt as a
chain tree through specdec's tree scans, captured on the fast path), specdec's eager path (DDTree) and the fast
path (AR and DDTree). Prints the share of outputs equal to HF greedy, to the eager path with the model's prefill,
and to the eager path with the same prefill as the row. In fp32 all of them are token-identical (``tests/``); in
bf16 two exact computations that round in a different order can resolve a near-tie differently, and this table
shows how often that happens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from _zoo import add_pair_args, decodable_prompts, zoo_pair  # benchmarks/e2e, beside this script

import specdec
from specdec.loading import resolve_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap, kind="hybrid")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--out", default="bench_out/prefill_fidelity")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    device, dtype = resolve_device(args.device, args.dtype)
    model, tok, drafter = zoo_pair(args.target, args.drafter, device, dtype)
    prompts = [ids for _, ids in decodable_prompts(model, tok, args.num_prompts)]
    tree, new = specdec.DDTree(budget=args.budget, topk=args.topk), args.max_new_tokens

    def tail(seq, ids):
        return seq[0, ids.shape[1] :].tolist()

    lines = [
        f"# decoding fidelity, {args.target}, {device}, {dtype}, {len(prompts)} prompts x {new} new tokens, "
        f"DDTree b{args.budget} topk {args.topk}",
        "",
        "| run | = HF greedy | = eager path (DDTree, model's prefill) | = eager path (DDTree, same prefill) | s |",
        "|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)

    def same(a: list, b: list) -> str:
        return f"{sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}"

    outs: dict[str, list] = {}

    def row(name: str, mode: str, decode) -> None:
        start = time.perf_counter()
        outs[name] = [tail(decode(ids), ids) for ids in prompts]
        hf = outs.get("hf-generate", outs[name])
        eager_model = outs.get("eager-ddtree-prefill-model", outs[name])
        eager_same = outs.get(f"eager-ddtree-prefill-{mode}", outs[name])
        lines.append(f"| {name} | {same(outs[name], hf)} | {same(outs[name], eager_model)} | "
                     f"{same(outs[name], eager_same)} | {time.perf_counter() - start:.1f} |")  # fmt: skip
        print(lines[-1], flush=True)

    # the eager path of each prefill runs before the fast path with it, so every row prints when it is done
    row("hf-generate", "model", lambda ids: model.generate(ids, max_new_tokens=new, do_sample=False))
    saved = os.environ.get("SPECDEC_HYBRID_PREFILL")
    try:
        for mode in ("model", "scan"):
            os.environ["SPECDEC_HYBRID_PREFILL"] = mode
            for name, d, t, graphs in (("eager-ddtree", drafter, tree, False), ("fast-ar", None, None, True),
                                       ("fast-ddtree", drafter, tree, True)):  # fmt: skip
                row(
                    f"{name}-prefill-{mode}",
                    mode,
                    lambda ids, d=d, t=t, graphs=graphs: (
                        specdec.generate(
                            model, ids, drafter=d, tree=t, max_new_tokens=new, cuda_graphs=graphs
                        ).sequences
                    ),
                )
    finally:
        if saved is None:
            os.environ.pop("SPECDEC_HYBRID_PREFILL", None)
        else:
            os.environ["SPECDEC_HYBRID_PREFILL"] = saved
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "outputs.json").write_text(json.dumps(outs))
    (out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
