"""A hybrid target (Gated-DeltaNet + attention layers): exact tree verification with its own DFlash drafter.

    python examples/hybrid_target.py --max-new-tokens 32

Recurrent layers cannot be rolled back by cropping a cache; specdec runs their tree step through per-layer
adapters and commits the accepted path by replaying it from the stashed per-node inputs. A chain and a DDTree of
any budget both give the target's own greedy output (docs/hybrid.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.loading import zoo_dir

DRAFTER = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "zoo-hybrid"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default="def merge_sorted(a, b):\n    ")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    ids = tok(args.prompt, return_tensors="pt").input_ids
    reference = model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens)

    drafter = specdec.DFlashDrafter.from_pretrained(DRAFTER, target=model)
    for tree in (specdec.Chain(k=drafter.config.block_size - 1), specdec.DDTree(budget=args.budget, topk=8)):
        spec = specdec.SpeculativeModel(model, drafter=drafter, tree=tree)
        out = spec.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        same = torch.equal(out, reference)
        print(f"{tree!r:36s} tau {spec.last_stats.tau:.2f}  identical to model.generate: {same}")
        if not same:
            raise SystemExit(f"{tree!r} differs from model.generate")
    print(tok.decode(out[0]))


if __name__ == "__main__":
    main()
