"""Extending specdec from outside the package: a tree policy and a verification rule, each one class.

    python examples/custom_policy.py                  # the zoo dense pair, 48 new tokens, 2 prompts
    python examples/custom_policy.py --max-new-tokens 96

``TopKTree`` is the fixed-shape tree of Medusa / EAGLE-1: at depth d every node of depth d-1 gets the drafter's
``widths[d-1]`` most likely depth-d tokens as children. ``ScratchGreedy`` is greedy verification written from
scratch with tensor ops. Both implement the protocols of ``docs/extending.md``, are registered by name, and run
through ``specdec.generate`` eagerly (``cuda_graphs=False``) and replayed from CUDA graphs (``cuda_graphs=True``;
on a CPU the same round is called). The script checks the output against the target's own greedy ``generate``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.loading import asset_path, zoo_path
from specdec.types import Accept, DeviceTree, Proposal


@dataclass(frozen=True)
class TopKTree:
    """A fixed tree over the drafter's per-depth top-k: ``widths=(4, 2, 2, 1)`` gives 4 + 8 + 16 + 16 nodes."""

    widths: tuple[int, ...] = (4, 2, 2, 1)
    reads = ("logq",)
    branching = True
    stochastic = False

    @property
    def max_depth(self) -> int:
        return len(self.widths)

    @property
    def budget(self) -> int:
        total, level = 0, 1
        for w in self.widths:
            level *= w
            total += level
        return total

    def _shape(self, device):
        """(depth, rank at its own depth, parent) of every non-root node, in breadth-first order."""
        depth, rank, parent, level = [], [], [], [0]
        for d, w in enumerate(self.widths):
            nxt = []
            for p in level:
                for r in range(w):
                    nxt.append(len(depth) + 1)
                    depth.append(d)
                    rank.append(r)
                    parent.append(p)
            level = nxt
        return (torch.tensor(x, dtype=torch.long, device=device) for x in (depth, rank, parent))

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        logq = proposal.logq  # [B, D, V]
        batch, device = logq.shape[0], logq.device
        node_depth, node_rank, node_parent = self._shape(device)  # Python ints only: fixed shapes
        deep = node_depth < depth  # a drafter may draft less deep than the policy asks
        top = logq.topk(max(self.widths), dim=-1).indices  # [B, D, k]
        tokens = top[:, node_depth.clamp(max=depth - 1), node_rank]  # [B, N]
        tokens = torch.where(deep, tokens, root[:, None])
        ones = torch.ones(batch, 1, dtype=torch.bool, device=device)
        return DeviceTree(
            tokens=torch.cat([root[:, None], tokens], 1),
            parents=torch.cat([-ones.long(), torch.where(deep, node_parent, -1).expand(batch, -1)], 1),
            depth=torch.cat([0 * ones.long(), torch.where(deep, node_depth + 1, 0).expand(batch, -1)], 1),
            valid=torch.cat([ones, deep.expand(batch, -1)], 1),
            num_nodes=1 + deep.sum().expand(batch),
        )


@dataclass(frozen=True)
class ScratchGreedy:
    """Greedy verification: from the root, follow the first real child carrying the target's argmax."""

    name = "scratch-greedy"

    def check(self, sampling, tree) -> None:
        if sampling.do_sample:
            raise ValueError("ScratchGreedy is exact only for do_sample=False.")

    def uses_noise(self, sampling) -> bool:
        return False

    def accept(self, tree: DeviceTree, logits, sampling, noise, max_depth: int, proposal=None) -> Accept:
        choice = logits.argmax(-1)  # [B, S]
        batch, slots = choice.shape
        rows = torch.arange(batch, device=choice.device)
        index = torch.arange(slots, device=choice.device)
        current = torch.zeros(batch, dtype=torch.long, device=choice.device)
        alive = torch.ones(batch, dtype=torch.bool, device=choice.device)
        path = [current]
        for _ in range(max_depth):  # a fixed number of steps: no host read
            want = choice[rows, current]  # [B]
            child = tree.valid & (tree.parents == current[:, None]) & (tree.tokens == want[:, None])
            found = child.any(-1) & alive
            first = torch.where(child, index, slots).min(-1).values.clamp(max=slots - 1)
            current = torch.where(found, first, current)
            alive = found
            path.append(current)
        path = torch.stack(path, 1)  # [B, P], the last accepted node repeated past the end
        num_path = 1 + (path[:, 1:] != path[:, :-1]).sum(-1)
        steps = torch.arange(max_depth + 1, device=choice.device)
        drafts = tree.tokens.gather(1, path[:, (steps + 1).clamp(max=max_depth)])
        bonus = choice.gather(1, path[:, -1:])
        last = num_path[:, None] - 1
        tokens = torch.where(steps < last, drafts, torch.where(steps == last, bonus, 0))
        return Accept(path=path, num_path=num_path, tokens=tokens)


specdec.register_tree("topk-tree", TopKTree)
specdec.register_rule("scratch-greedy", ScratchGreedy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(zoo_path("target-dense"), dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(zoo_path("tokenizer"))
    drafter = specdec.DFlashDrafter.from_pretrained(asset_path("drafters/zoo-dense"), target=model)
    texts = ["def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        "][: args.prompts]
    for text in texts:
        ids = tok(text, return_tensors="pt").input_ids.to(device)
        ref = model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens)
        for graphs in (False, True):
            out = specdec.generate(model, ids, drafter=drafter, tree=TopKTree(), verifier=ScratchGreedy(),
                                   max_new_tokens=args.max_new_tokens, cuda_graphs=graphs)  # fmt: skip
            same = torch.equal(out.sequences, ref)
            print(f"cuda_graphs={graphs!s:5} tau {out.stats.tau:.2f}  identical to model.generate: {same}")
            if not same and device.type == "cpu":  # in bf16 a near-tie may flip a token (docs/round.md)
                raise SystemExit("the custom policy and rule changed the output")


if __name__ == "__main__":
    main()
