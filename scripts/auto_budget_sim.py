"""The auto budget's choices on real drafts, priced by a GPU's measured round costs, on the CPU.

The zoo dense pair decodes in fp32 on the CPU (real drafts, real accepts); each round the auto budget's controller
reads is priced by a table of device round costs per batch size and option (ms; -1 = the target's own plain round,
0 = a plain round that feeds the drafter, else the DDTree budget), measured on a GPU by the batch bench (the
``budget_costs`` of its auto rows, or the fixed rounds' ``round ms``), with +-3 % noise. Printed: simulated tokens
per ms of AR, DDTree at each size and the auto budget (its second pass over the prompts, the first being its
warm-up), and auto's ratios. ``--switch-ms``: what a round costs more after a round of another size (a
fixed budget never pays it). What it leaves out: the wall time a round adds beyond its device time (the host's
work per round), and the GPU's bf16 drafts.

    python scripts/auto_budget_sim.py --batch 1 --prompts dev
    python scripts/auto_budget_sim.py --batch 32 --prompts held --controller '{"finish": false}'
    python scripts/auto_budget_sim.py --batch 32 --prompts dev --trace

``--explain N`` prints the controller's last N choices of its own (the rows' smoothed expectations per size, the
calibration scales, and the committed tokens per ms it valued each option at). ``--trace`` prints each call of the
timed pass as one letter per round (``D`` detached, ``0`` plain decoding
that feeds the drafter, ``a``-``d`` the sizes 3 / 15 / 31 / 63), followed by the first letter of its reason in
capitals where the reason is not the model's own choice (``E``xplore, ``P``robe, ``C``heck, ``S``tart detached).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.budget import AutoBudget
from specdec.loading import zoo_dir

REPO_DRAFTER = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "zoo-dense"
# device ms per round on one H200, bf16, zoo dense pair (the fixed rounds' round ms and the auto rows' measured
# costs of scripts/gpu_trust.sh auto-dense, commits 5c9c669 / 9ccd35d, 2026-12-04)
H200_DENSE = {
    1: {-1: 0.385, 0: 0.43, 3: 0.69, 15: 0.697, 31: 0.706, 63: 0.779},
    2: {-1: 0.416, 0: 0.48, 3: 0.80, 15: 0.787, 31: 0.848, 63: 0.88},
    4: {-1: 0.449, 0: 0.50, 3: 0.84, 15: 0.849, 31: 0.89, 63: 0.935},
    8: {-1: 0.484, 0: 0.55, 3: 0.85, 15: 0.906, 31: 0.99, 63: 1.06},
    16: {-1: 0.526, 0: 0.58, 3: 0.92, 15: 1.04, 31: 1.18, 63: 1.31},
    32: {-1: 0.545, 0: 0.60, 3: 1.04, 15: 1.287, 31: 1.53, 63: 1.84},
}
SIZES = (3, 15, 31, 63)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1, choices=sorted(H200_DENSE))
    ap.add_argument("--prompts", choices=("dev", "held"), default="dev",
                    help="dev: the first 32 dev prompts; held: dev prompts 49-80")  # fmt: skip
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--costs", type=json.loads, default=None, help="JSON {option: ms} for --batch (default: H200)")
    ap.add_argument("--controller", type=json.loads, default={}, help="JSON keyword arguments of AutoBudget")
    ap.add_argument("--switch-ms", type=float, default=0.0,
                    help="ms a round costs more after a round of another size (default 0)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trace", action="store_true", help="print each timed call's choices, one letter per round")
    ap.add_argument("--explain", type=int, default=0, metavar="N",
                    help="print the last N model choices: expectations, scales, value per option")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    costs = {int(k): float(v) for k, v in (args.costs or H200_DENSE[args.batch]).items()}
    rng = random.Random(0)

    class Priced(AutoBudget):
        spent, last = 0.0, None

        def observe(self, size, expected, accepted, ms, rows=None):
            # a round after one of another size pays ``--switch-ms`` more (its graph's buffers are cold)
            cost = costs[size] + (args.switch_ms if self.last is not None and size != self.last else 0.0)
            self.spent, self.last = self.spent + cost, size
            super().observe(size, expected, accepted, cost * rng.uniform(0.97, 1.03), rows)

    @dataclass(frozen=True)
    class Tree(specdec.DDTree):
        made: list = field(default=None, compare=False)

        def controller(self, batch):
            ctrl = Priced(self.sizes, batch, **args.controller)
            self.made.append(ctrl)
            return ctrl

    model = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    tok.padding_side = "left"
    drafter = specdec.DFlashDrafter.from_pretrained(REPO_DRAFTER, target=model)
    with open(zoo_dir() / "prompts_dev.jsonl") as fh:
        lines = [json.loads(line)["prompt"] for line in fh]
    prompts = lines[:32] if args.prompts == "dev" else lines[48:80]

    traces: list[str] = []
    letters = {-1: "D", 0: "0", **{size: "abcd"[i] for i, size in enumerate(SIZES)}}

    def run(tree) -> tuple[int, int]:
        tokens = rounds = 0
        traces.clear()
        for i in range(0, len(prompts), args.batch):
            enc = tok(prompts[i : i + args.batch], return_tensors="pt", padding=True)
            out = specdec.generate(model, enc.input_ids, attention_mask=enc.attention_mask,
                                   drafter=drafter if tree is not None else None, tree=tree,
                                   max_new_tokens=args.max_new_tokens, do_sample=False)  # fmt: skip
            tokens += out.stats.new_tokens - enc.input_ids.shape[0]  # the prefill's token is not a round's
            rounds += out.stats.target_forwards - 1
            if tree is not None and getattr(tree, "made", None):
                traces.append("".join(letters[d["size"]] + ("" if d["reason"] in ("model", "detached", "detach")
                                                            else d["reason"][0].upper())
                                      for d in tree.made[0].decisions))  # fmt: skip
        return tokens, rounds

    value = {}
    tokens, rounds = run(None)
    value["ar"] = tokens / (rounds * costs[-1])
    for size in SIZES:
        tokens, rounds = run(specdec.DDTree(budget=size, topk=8))
        value[f"b{size}"] = tokens / (rounds * costs[size])
    made: list = []
    tree = Tree(budget="auto", topk=8, sizes=SIZES, made=made)
    run(tree)  # warm-up pass: the controller measures and calibrates
    (ctrl,) = made
    ctrl.spent = 0.0
    tokens, _ = run(tree)
    value["auto"] = tokens / ctrl.spent
    best = max(v for k, v in value.items() if k != "auto")
    shares = collections.Counter(d["size"] for d in ctrl.decisions)
    print(f"| B | prompts | controller | {' | '.join(value)} | auto / best | auto / AR |")
    print("|---|---|---|" + "---|" * (len(value) + 2))
    cells = " | ".join(f"{v:.2f}" for v in value.values())
    print(f"| {args.batch} | {args.prompts} | {args.controller or 'default'} | {cells} | "
          f"{value['auto'] / best:.3f} | {value['auto'] / value['ar']:.3f} |")  # fmt: skip
    print(f"tokens per ms (simulated); auto's last call: {dict(shares)}")
    for d in [d for d in ctrl.decisions if d["reason"] == "model"][-args.explain :] if args.explain else []:
        fmt = lambda xs: "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"  # noqa: E731
        print(f"chose {d['size']}: expected {fmt(d['expected'])}, scales {fmt(d['scales'])}, value "
              + ", ".join(f"{k}: {v:.3f}" for k, v in d["value"].items()))  # fmt: skip
    if args.trace:
        for i, trace in enumerate(traces):
            print(f"call {i}: {trace}")


if __name__ == "__main__":
    main()
