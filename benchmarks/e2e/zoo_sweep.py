"""The results sweep on a zoo target: AR, DFlash chain and DDTree over budgets x topk, at T=0 and T=1.

    python benchmarks/e2e/zoo_sweep.py --target target-dense --drafter assets/drafters/zoo-dense \
        --num-prompts 80 --max-new-tokens 256 --out bench_out/dense

Writes results.jsonl, results.md and plot.png under --out (see specdec.bench). Needs no hydra.
"""

from __future__ import annotations

import argparse
import logging

from specdec.bench import main_bench

BUDGETS = [4, 8, 15, 16, 32, 64, 128]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="target-dense")
    ap.add_argument("--drafter", default="assets/drafters/zoo-dense", help="DFlash checkpoint folder")
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--budgets", type=int, nargs="+", default=BUDGETS)
    ap.add_argument("--topk", type=int, nargs="+", default=[0, 8], help="0 = topk equal to the budget")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes over all prompts per method before timing")
    ap.add_argument("--out", default="bench_out/zoo")
    ap.add_argument("--no-hf-baseline", action="store_true", help="skip timing HF generate (eager and static cache)")
    ap.add_argument("--no-ar", action="store_true", help="skip the plain-decoding row (tau-only sweeps)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dflash = {"kind": "dflash", "path": args.drafter}
    methods = (
        []
        if args.no_hf_baseline
        else [{"name": "hf-generate", "hf": "generate"}, {"name": "hf-static", "hf": "static"}]
    )
    methods += [] if args.no_ar else [{"name": "ar"}]
    methods.append({"name": "dflash-chain", "drafter": dflash, "tree": {"kind": "chain", "k": args.block_size - 1}})
    for topk in args.topk:
        for budget in args.budgets:
            if topk and topk >= budget:
                continue  # the same tree as topk = budget
            methods.append(
                {
                    "name": f"ddtree-b{budget}-k{topk or budget}",
                    "drafter": dflash,
                    "tree": {"kind": "ddtree", "budget": budget, "topk": topk or None},
                }
            )
    main_bench(
        {
            "target": args.target,
            "device": args.device,
            "dtype": args.dtype,
            "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens,
            "temperatures": args.temperatures,
            "methods": methods,
            "warmup": args.warmup,
            "out_dir": args.out,
        }
    )


if __name__ == "__main__":
    main()
