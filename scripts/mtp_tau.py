"""τ of an MTP head for the zoo's hybrid target against its DFlash drafter: mean tokens per round (accepted drafts
plus the target's token) on the first dev prompts, fp32 on the CPU, one thread, temperature 0.

The head (a folder of ``mtp.*`` tensors, e.g. ``assets/drafters/zoo-hybrid-mtp``) is added to a temporary copy of
the target's checkpoint with ``with_mtp_head`` and loaded from there as a Qwen3.5 checkpoint's own head. Prints one
Markdown row per drafter and tree (``docs/mtp.md``)::

    SPECDEC_ZOO=/path/to/zoo PYTHONPATH=. python scripts/mtp_tau.py assets/drafters/zoo-hybrid-mtp --new 64 --prompts 5
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.mtp import MTPDrafter, with_mtp_head

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("head", help="folder with the mtp.* tensors")
    parser.add_argument("--new", type=int, default=64, help="max_new_tokens")
    parser.add_argument("--prompts", type=int, default=5, help="first dev prompts, tokenized whole")
    parser.add_argument("--no-dflash", action="store_true", help="skip the DFlash rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    zoo = Path(os.environ.get("SPECDEC_ZOO", REPO.parent / "shared" / "zoo"))
    target = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = with_mtp_head(zoo / "target-hybrid", args.head, Path(tmp) / "ckpt")
        mtp = MTPDrafter.from_pretrained(folder, target=target)
    runs = [(f"mtp ({args.head})", mtp, f"Chain({k})", specdec.Chain(k=k)) for k in (1, 2, 3)]
    runs.append((f"mtp ({args.head})", mtp, "DDTree(8)", specdec.DDTree(budget=8)))
    if not args.no_dflash:
        dflash = DFlashDrafter.from_pretrained(REPO / "assets/drafters/zoo-hybrid", target=target, dtype=torch.float32)
        name = "dflash (assets/drafters/zoo-hybrid)"
        runs += [(name, dflash, "Chain(3)", specdec.Chain(k=3)), (name, dflash, "DDTree(8)", specdec.DDTree(budget=8))]
    refs = []
    for row in rows[: args.prompts]:
        ids = tok(row["prompt"], return_tensors="pt")["input_ids"]
        refs.append((ids, target.generate(ids, max_new_tokens=args.new, do_sample=False)))
    print("| drafter | tree | τ | rounds | equal to `generate` | s |\n|---|---|---|---|---|---|", flush=True)
    for drafter_name, drafter, tree_name, tree in runs:
        lengths, same, start = [], True, time.perf_counter()
        for ids, want in refs:
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=args.new, do_sample=False)
            same &= torch.equal(out.sequences, want)
            lengths += list(out.stats.accept_lengths)
        tau = sum(lengths) / len(lengths)
        secs = time.perf_counter() - start
        print(f"| {drafter_name} | {tree_name} | {tau:.3f} | {len(lengths)} | {same} | {secs:.1f} |", flush=True)


if __name__ == "__main__":
    main()
