"""Speed of ``tree_rejection_round``: a round of recursive rejection (the setup and the sibling-rank loop), torch
reference vs one Triton launch.

The arguments are those ``recursive_rejection`` passes to ``tree_rejection_round`` for a random round: trees of
``S`` slots whose nodes have at most ``K = 8`` children (wide near the root), a float64 target ``p`` and, per node,
the draft ``q`` it was drawn from (its parent's ``p`` perturbed: some children accepted, many rejected). Shapes: B in
{1, 8}, S in {16, 32, 64}, V in {8192, 151936}. Providers: ``torch`` (eager launches: the setup, then ~18 per rank),
``torch-graph`` (the same ops replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and
``triton-graph``; the graph and Triton providers need CUDA. Without CUDA only the eager reference runs, and only at
V = 8192.

    python benchmarks/kernels/bench_tree_rejection.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

from unittest import mock

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

import specdec.verify.multidraft as multidraft
from specdec.kernels.tree_rejection import tree_rejection_round
from specdec.types import DeviceTree

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
BATCHES = [1, 8]
SLOTS = [16, 32, 64]
VOCABS = [8192, 151936]
WIDTH = 8  # K: the most children a node has
DEPTH = 6


def make_tree(gen: torch.Generator, batch: int, slots: int, vocab: int) -> DeviceTree:
    """Full trees of ``slots`` nodes, at most ``WIDTH`` children per node and ``DEPTH`` levels; half of the nodes
    attach to the first open node (wide near the root), the rest to a random one."""
    parents = torch.full((batch, slots), -1)
    depth = torch.zeros(batch, slots, dtype=torch.long)
    for b in range(batch):
        kids = [0] * slots
        for j in range(1, slots):
            open_ = [i for i in range(j) if kids[i] < WIDTH and depth[b, i] < DEPTH]
            first = float(torch.rand((), generator=gen)) < 0.5
            pick = open_[0 if first else int(torch.randint(len(open_), (1,), generator=gen))]
            parents[b, j], depth[b, j] = pick, depth[b, pick] + 1
            kids[pick] += 1
    tokens = torch.randint(vocab, (batch, slots), generator=gen)
    valid = torch.ones(batch, slots, dtype=torch.bool)
    return DeviceTree(tokens, parents, depth, valid, torch.full((batch,), slots), max_children=WIDTH)


def make_args(batch: int, slots: int, vocab: int, device: torch.device, replacement: bool = False) -> list:
    """The arguments ``recursive_rejection`` passes to ``tree_rejection_round`` for a random round on ``device``."""
    gen = torch.Generator().manual_seed(batch * 1000 + slots)
    tree = make_tree(gen, batch, slots, vocab)
    tree = DeviceTree(*(t.to(device) for t in tree[:5]), max_children=WIDTH)
    dev_gen = torch.Generator(device=device).manual_seed(slots)
    logits = torch.randn(batch, slots, vocab, generator=dev_gen, device=device, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    # the tokens drawn from q: its most likely tokens, so that the acceptance tests are not decided by q's tail
    noisy = logits + torch.randn(logits.shape, generator=dev_gen, device=device, dtype=torch.float64)
    q = torch.softmax(noisy, -1).gather(1, tree.parents.clamp(min=0)[..., None].expand(-1, -1, vocab))
    q = q * (tree.depth > 0)[..., None]
    drafted = q.topk(4, dim=-1).indices.gather(2, torch.randint(4, (batch, slots, 1), generator=dev_gen,
                                                                device=device))[..., 0]  # fmt: skip
    tree = tree._replace(tokens=torch.where(tree.depth > 0, drafted, tree.tokens))
    noise = torch.rand(batch, slots, 4, generator=dev_gen, device=device)
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return tree_rejection_round(*args, **kwargs)

    with (
        mock.patch.object(multidraft, "tree_rejection_round", spy),
        mock.patch.object(multidraft, "_REJECTION_IMPL", "torch"),
    ):
        multidraft.recursive_rejection(tree, p, q, noise, DEPTH, replacement)
    return list(calls[0])


def make_call(provider: str, args: list):
    """A no-argument callable running the round once, or None when the provider does not apply to the device."""
    if provider != "torch" and args[4].device.type != "cuda":  # args[4]: p
        return None
    impl = "triton" if provider.startswith("triton") else "torch"
    return lambda: tree_rejection_round(*args, impl=impl)


def run(device: torch.device) -> list[dict]:
    rows = []
    vocabs = VOCABS if device.type == "cuda" else VOCABS[:1]
    for vocab in vocabs:
        for batch in BATCHES:
            for slots in SLOTS:
                args = make_args(batch, slots, vocab, device)
                _, nxt = tree_rejection_round(*args, impl="torch")
                accepted = int((nxt != torch.arange(slots, device=device)).sum())
                row = {"B": batch, "S": slots, "K": WIDTH, "V": vocab, "accepts": accepted}
                time_providers(row, PROVIDERS, lambda p, a=args: make_call(p, a), device)
                row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
                rows.append(row)
                del args
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"tree_rejection_round, K {WIDTH}, float64, without replacement, median ms per call on {name} "
          f"(torch {torch.__version__}); warm")  # fmt: skip
    if device.type != "cuda":
        print(f"no CUDA device: the Triton kernel needs one; V = {VOCABS[0]} only")
    report(run(device), ["B", "S", "K", "V", "accepts", *PROVIDERS, "graph speedup"], args.out,
           "tree_rejection.csv", device)  # fmt: skip


if __name__ == "__main__":
    main()
