"""tau accounting against the DDTree / DFlash reference loops, and a drafter on the wrong target.

    python benchmarks/e2e/tau_accounting.py [--num-prompts 10]

Part 1: on the dense zoo pair (CPU, fp32, the last 256 tokens of each dev prompt, greedy, no EOS), specdec's tau
for ``max_new_tokens`` = 48 and 256 against a reference-style count: the rounds of a longer run up to the one that
crosses ``max_new_tokens``, counted whole (the reference loops draft the full block in their last round and count
every token it accepts). Part 2: the dense zoo drafter on the hybrid zoo target (a drafter trained for another
target) against plain decoding and the hybrid's own drafter, DDTree(15), 4 prompts x 64 tokens. Numbers of
``docs/api.md`` and ``docs/dflash.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.loading import load_prompts, load_tokenizer, resolve_model_path, zoo_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer(zoo_dir() / "tokenizer")
    prompts = [p["prompt"] for p in load_prompts(limit=args.num_prompts)]
    dense = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-dense", dtype=torch.float32).eval()
    dense_drafter = resolve_model_path("assets/drafters/zoo-dense")
    drafter = DFlashDrafter.from_pretrained(dense_drafter, target=dense)
    for tree in (specdec.Chain(15), specdec.DDTree(15)):
        for new in (48, 256):
            ours, ref = [], []
            for text in prompts:
                ids = tok(text, return_tensors="pt").input_ids[:, -256:]
                kw = dict(drafter=drafter, tree=tree, eos_token_id=[])
                short = specdec.generate(dense, ids, max_new_tokens=new, **kw)
                longer = specdec.generate(dense, ids, max_new_tokens=new + 16, **kw)
                done, lengths = 1, []
                for length in longer.stats.accept_lengths:
                    if done >= new:
                        break
                    lengths.append(length)
                    done += length
                ours.append(short.stats.tau)
                ref.append(sum(lengths) / len(lengths))
            gap = [r - o for r, o in zip(ref, ours, strict=True)]
            print(f"{tree} {new} tokens: specdec tau {statistics.mean(ours):.3f}, reference-style "
                  f"{statistics.mean(ref):.3f}, gap {statistics.mean(gap):.3f} (max {max(gap):.3f})")  # fmt: skip
    hybrid = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-hybrid", dtype=torch.float32).eval()
    drafters = {
        "plain decoding": None,
        "dense drafter": DFlashDrafter.from_pretrained(dense_drafter, target=hybrid),
        "hybrid drafter": DFlashDrafter.from_pretrained(
            resolve_model_path("assets/drafters/zoo-hybrid"), target=hybrid
        ),
    }
    for name, d in drafters.items():
        taus, tokens, seconds = [], 0, 0.0
        for text in prompts[:4]:
            ids = tok(text, return_tensors="pt").input_ids[:, -256:]
            start = time.perf_counter()
            out = specdec.generate(hybrid, ids, drafter=d, tree=specdec.DDTree(15), max_new_tokens=64, eos_token_id=[])
            seconds += time.perf_counter() - start
            tokens += out.stats.new_tokens
            taus.append(out.stats.tau)
        print(f"hybrid target, {name}: tau {statistics.mean(taus):.2f}, {tokens / seconds:.1f} tok/s")


if __name__ == "__main__":
    main()
