"""Drop-in replacement of ``model.generate`` in an existing script: wrap the model once, keep every call as it was.

    python examples/drop_in.py --max-new-tokens 32

The "existing script" below is plain HF code. The only speculative lines are the two marked ``# specdec``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec  # specdec
from specdec.loading import zoo_dir

DRAFTER = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "zoo-dense"


def complete(model, tok, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The existing code: HF's generate, one prompt at a time, nothing specdec-specific."""
    outputs = []
    for prompt in prompts:
        inputs = tok(prompt, return_tensors="pt").to(model.device)
        ids = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        outputs.append(tok.decode(ids[0, inputs["input_ids"].shape[1] :]))
    return outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    prompts = ["def read_json(path):\n    ", "class Stack:\n    def push(self, item):\n        "]

    before = complete(model, tok, prompts, args.max_new_tokens)
    drafter = specdec.DFlashDrafter.from_pretrained(DRAFTER, target=model)  # specdec
    fast = specdec.SpeculativeModel(model, drafter=drafter, tree=specdec.DDTree(budget=15, topk=8))  # specdec
    after = complete(fast, tok, prompts, args.max_new_tokens)  # the same function, the wrapped model

    print("same completions:", before == after, "| tau of the last call:", round(fast.last_stats.tau, 2))
    for text in after:
        print("---\n" + text)
    if before != after:
        raise SystemExit("the wrapped model changed the output")


if __name__ == "__main__":
    main()
