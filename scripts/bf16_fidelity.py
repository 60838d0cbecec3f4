"""How faithful is each bf16 decode to the exact answer? HF's bf16 greedy output and specdec's (plain loop, chain,
DDTree) against the fp32 HF greedy output of the same zoo target, on CUDA.

    python scripts/bf16_fidelity.py [--target hybrid|dense] [--prompts 10] [--new 48] [--device cuda]

Prints per decode: outputs equal to the fp32 greedy output, new tokens agreeing with it before the first difference
(summed over the prompts), outputs equal to HF's bf16 output. bf16 near-ties flip tokens between differently shaped
forwards and between HF's kernels and specdec's; this separates such flips from wrong tokens (which cost most of
the agreement).
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

import specdec
from specdec.loading import asset_path, load_prompts, load_tokenizer, zoo_path


def agreeing(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Leading tokens of ``out`` equal to ``ref``'s (``tests/gpu/test_generate_cuda.py`` uses it too)."""
    n = min(out.numel(), ref.numel())
    differ = (out[:n] != ref[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="hybrid", choices=["hybrid", "dense"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--device", default="cuda", help="cuda (the kernels' bf16), or cpu (the tensor-op path)")
    args = parser.parse_args()
    dev, new = torch.device(args.device), args.new
    tok = load_tokenizer(zoo_path("tokenizer"))
    prompts = [tok(row["prompt"], return_tensors="pt").input_ids[:, -384:].to(dev)
               for row in load_prompts(limit=args.prompts)]  # fmt: skip
    path = zoo_path(f"target-{args.target}")
    exact = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev).eval()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    drafter = specdec.DFlashDrafter.from_pretrained(asset_path(f"drafters/zoo-{args.target}"), target=model)

    def hf(m, ids):
        return m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)

    def sd(m, ids, **kw):
        return specdec.generate(m, ids, max_new_tokens=new, **kw).sequences

    runs = {
        "HF bf16": lambda ids: hf(model, ids),
        "specdec plain loop bf16": lambda ids: sd(model, ids),
        "specdec chain 15 bf16": lambda ids: sd(model, ids, drafter=drafter, tree=specdec.Chain(k=15)),
        "specdec DDTree b32 bf16": lambda ids: sd(model, ids, drafter=drafter, tree=specdec.DDTree(budget=32, topk=8)),
        "specdec plain loop fp32": lambda ids: sd(exact, ids),
    }
    refs = [hf(exact, ids)[0, ids.shape[1] :] for ids in prompts]
    outs = {name: [run(ids)[0, ids.shape[1] :] for ids in prompts] for name, run in runs.items()}
    n = len(prompts)
    print(f"| decode ({args.target}, {n} prompts x {new}) | outputs = fp32 greedy | tokens agreeing (of {n * new}) "
          "| outputs = HF bf16 |")  # fmt: skip
    print("|---|---|---|---|")
    for name, got in outs.items():
        agree = [agreeing(out, ref) for out, ref in zip(got, refs, strict=True)]
        same_hf = sum(torch.equal(out, ref) for out, ref in zip(got, outs["HF bf16"], strict=True))
        print(f"| {name} | {sum(a == new for a in agree)} / {n} | {sum(agree)} | {same_hf} / {n} |")


if __name__ == "__main__":
    main()
