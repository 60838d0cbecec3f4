"""Train a DFlash drafter for a target, then decode with it (tiny settings by default: a minute on a CPU).

    python examples/train_drafter.py --max-steps 20 --out drafters/tiny
    # the same from the CLI:  python -m specdec train corpus=<folder> out_dir=drafters/tiny max_steps=20

The corpus defaults to this package's own source code; bring any folder of text or code for a real run
(docs/dflash.md has the recipe that trained assets/drafters/zoo-dense).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.loading import zoo_dir
from specdec.train import TrainConfig, train_dflash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(Path(specdec.__file__).parent), help="files, folder or glob")
    ap.add_argument("--out", default="drafters/tiny")
    ap.add_argument("--max-steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    target = zoo_dir() / "target-dense"
    cfg = TrainConfig(
        target=str(target), corpus=(args.corpus,), out_dir=args.out, tokenizer=str(zoo_dir() / "tokenizer"),
        num_layers=args.layers, block_size=8, seq_len=128, num_anchors=8, batch_size=4, max_steps=args.max_steps,
        lr=2e-3, eval_every=0, eval_num_prompts=2, eval_new_tokens=16, eval_prompt_tokens=64, max_corpus_tokens=40_000,
        save_every=0, progress=False, device="cpu",
    )  # fmt: skip
    summary = train_dflash(cfg)
    print("evaluations (teacher-forced tau):", [round(e["tau"], 3) for e in summary["evals"]])

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    drafter = specdec.DFlashDrafter.from_pretrained(args.out, target=model)
    ids = tok("import os\n\ndef main():\n    ", return_tensors="pt").input_ids
    out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=8), max_new_tokens=24)
    assert torch.equal(out.sequences, model.generate(ids, do_sample=False, max_new_tokens=24))
    print(f"decoded with the new drafter: tau {out.stats.tau:.2f} (lossless: equal to model.generate)")


if __name__ == "__main__":
    main()
