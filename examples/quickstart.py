"""Quickstart: a DFlash drafter with a DDTree on the zoo's dense target, checked against the target's own generate.

    python examples/quickstart.py                        # defaults: budget 32, topk 8, 128 new tokens
    python examples/quickstart.py --max-new-tokens 32 --budget 8 --threads 1

On CPU one torch thread is usually fastest for models this small (see docs/cli.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.loading import zoo_dir

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "drafters"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default="def fibonacci(n):\n    ")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=32, help="DDTree nodes verified per round (root excluded)")
    ap.add_argument("--topk", type=int, default=8, help="candidate tokens per depth")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32

    model = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-dense", dtype=dtype).to(args.device).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    drafter = specdec.DFlashDrafter.from_pretrained(ASSETS / "zoo-dense", target=model)
    ids = tok(args.prompt, return_tensors="pt").input_ids.to(args.device)

    for name, tree in [
        ("DFlash chain", specdec.Chain(k=15)),
        ("DFlash + DDTree", specdec.DDTree(budget=args.budget, topk=args.topk)),
    ]:
        start = time.perf_counter()
        out = specdec.generate(
            model, ids, drafter=drafter, tree=tree, max_new_tokens=args.max_new_tokens, do_sample=False
        )
        seconds = time.perf_counter() - start
        print(f"{name:16s} tau {out.stats.tau:.2f}  {out.stats.new_tokens / seconds:7.1f} tok/s  ({tree})")

    reference = model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens)
    print("identical to model.generate:", torch.equal(out.sequences, reference))
    print(tok.decode(out.sequences[0]))


if __name__ == "__main__":
    main()
