"""Device time per kernel of a decode round on CUDA: where a round's time goes, kernel by kernel.

The zoo dense pair (bf16, batch 1) decodes the first ``--prompts`` dev prompts (``--new-tokens`` each) once per
method to warm up (graphs captured), then once more under ``torch.profiler`` (CUDA activity: the kernels replayed
from the round's graphs included). Per method: the rounds, the device µs per round (every kernel's own time summed)
and the kernels per round, then the ``--top`` kernels by µs per round with their launches per round.

    python scripts/kernel_profile.py [--methods ar,b15,b31,e3-dyn31] [--prompts 6] [--new-tokens 128] [--top 22]

Methods: ``ar`` (plain decoding), ``b15`` / ``b31`` (the zoo DFlash drafter with ``DDTree(budget, topk=8)``),
``e3-dyn31`` / ``e3-b31`` (the shipped EAGLE-3 head with ``DynamicTree(total_tokens=31)`` / ``DDTree(31, 8)``),
``auto`` (``DDTree(budget="auto", topk=8)``: its rounds mix sizes and compute their expectations), ``sm-b15`` /
``rsd-b15`` (T = 1, seeded: sample-and-match over ``DDTree(15, 8)``, RSD,
``MultiDraftRejection(replacement=False)``, over ``StochasticDDTree(15, 8)``); the other rules at about 15 nodes:
``specinfer-p15``, ``trav-p15``, ``rsd-p15`` (over three sampled paths of 5), ``ss-c15``, ``block-c15`` and
``trav-c15`` (over a sampled chain of 15).
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

import specdec
from specdec.loading import asset_path, load_prompts, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="ar,b15,b31,e3-dyn31")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--top", type=int, default=22)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernel_profile.py times CUDA kernels: run it on a machine with a GPU.")
    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(asset_path("zoo/target-dense"), dtype=torch.bfloat16)
    model = model.to(device).eval()
    tok = load_tokenizer(asset_path("zoo/tokenizer"))
    prompts = [tok(row["prompt"], return_tensors="pt").input_ids[:, -384:].to(device)
               for row in load_prompts(limit=args.prompts)]  # fmt: skip
    dflash = specdec.DFlashDrafter.from_pretrained(asset_path("drafters/zoo-dense"), target=model)
    eagle = specdec.Eagle3Drafter.from_pretrained(asset_path("drafters/zoo-dense-eagle3"), target=model)
    methods = {
        "ar": (None, None),
        "b15": (dflash, specdec.DDTree(budget=15, topk=8)),
        "b31": (dflash, specdec.DDTree(budget=31, topk=8)),
        "auto": (dflash, specdec.DDTree(budget="auto", topk=8)),
        "e3-dyn31": (eagle, specdec.DynamicTree(total_tokens=31)),
        "e3-b31": (eagle, specdec.DDTree(budget=31, topk=8)),
        # T = 1: sample-and-match over DDTree b15, RSD over the stochastic DDTree b15 (seeded)
        "sm-b15": (dflash, specdec.DDTree(budget=15, topk=8), None),
        "rsd-b15": (dflash, specdec.StochasticDDTree(budget=15, topk=8), specdec.MultiDraftRejection(replacement=False)),
        # the other rules at about 15 nodes: SpecInfer over 3 unmerged sampled paths of 5, traversal and RSD over
        # 3 merged ones, speculative sampling and block verification over a sampled chain of 15
        "specinfer-p15": (dflash, specdec.SampledTrees(k=3, depth=5, merge=False),
                          specdec.MultiDraftRejection(replacement=True)),
        "trav-p15": (dflash, specdec.SampledTrees(k=3, depth=5), specdec.TraversalVerification(replacement=False)),
        "rsd-p15": (dflash, specdec.SampledTrees(k=3, depth=5), specdec.MultiDraftRejection(replacement=False)),
        "ss-c15": (dflash, specdec.SampledChain(k=15), specdec.SpeculativeSampling()),
        "block-c15": (dflash, specdec.SampledChain(k=15), specdec.BlockVerification()),
        # traversal over the same chain (there it is block verification, token for token)
        "trav-c15": (dflash, specdec.SampledChain(k=15), specdec.TraversalVerification(replacement=True)),
    }
    for name in args.methods.split(","):
        drafter, tree, *rule = methods[name]
        sampled = bool(rule)
        kwargs = dict(drafter=drafter, tree=tree, max_new_tokens=args.new_tokens)
        if sampled:
            kwargs.update(verifier=rule[0], do_sample=True, temperature=1.0)
        for ids in prompts:  # warm: the round's graphs captured, kernels compiled
            specdec.generate(model, ids, **kwargs, generator=torch.Generator(device).manual_seed(0) if sampled else None)
        torch.cuda.synchronize(device)
        rounds, budgets = 0, Counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i, ids in enumerate(prompts):
                gen = torch.Generator(device).manual_seed(i) if sampled else None
                out = specdec.generate(model, ids, **kwargs, generator=gen)
                rounds += out.stats.rounds
                budgets.update(out.stats.budgets or ())
            torch.cuda.synchronize(device)
        kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        total = sum(e.self_device_time_total for e in kernels)
        launches = sum(e.count for e in kernels)
        print(f"\n## {name}: {rounds} rounds, {total / rounds:.1f} µs of kernels per round, "
              f"{launches / rounds:.1f} kernels per round"
              + (f"; sizes run: {dict(sorted(budgets.items()))}" if budgets else "") + "\n")  # fmt: skip
        print("| µs / round | launches / round | kernel |\n|---|---|---|")
        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[: args.top]:
            print(f"| {e.self_device_time_total / rounds:.1f} | {e.count / rounds:.2f} | `{e.key[:100]}` |")


if __name__ == "__main__":
    main()
