"""Speed of ``tree_accept``: the round's tree mask and acceptance walk, torch reference vs Triton.

Ops: ``mask`` (``tree_mask``: the reference is ``ancestor_matrix`` plus the mask's gather and fill, as the round
builds it), ``accept`` (``accept_path``: the reference is ``accept_device`` given the ancestor matrix, which the
round shares with the mask), ``round`` (both: ``ancestor_matrix`` + mask + ``accept_device`` against the two
Triton launches) and ``accept-b32`` (``accept_paths`` over a batch of 32 trees: the reference row by row and
stacked, Triton one launch). Providers: ``torch`` (eager launches), ``torch-graph`` (the same ops replayed from a
CUDA graph: GPU time without launch overhead), ``triton`` and ``triton-graph``; the graph and Triton providers need
CUDA.
Trees: DDTrees of ``ddtree_device`` (D = 15, topk 8, S = 16 / 48 / 80 slots) from random log-probabilities, the
target following the drafter's argmax (long accepted paths); capacity 1024 key slots, ``max_depth`` 15, bf16 mask.

    python benchmarks/kernels/bench_tree_accept.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.tree_accept import accept_path, accept_paths, tree_mask
from specdec.kernels.tree_accept.reference import accept_walk as accept_device
from specdec.trees.build import ancestor_matrix, ddtree_device
from specdec.types import TreeRow as DeviceTree

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
OPS = ["mask", "accept", "round", "accept-b32"]
BATCH = 32
SLOTS = [16, 48, 80]
CAPACITY = 1024
MAX_DEPTH = 15
VOCAB = 8192


def make_tree(slots: int, device: torch.device, seed: int = 0) -> tuple[DeviceTree, torch.Tensor]:
    """A DDTree in ``slots`` slots and the target's choices (the drafter's argmax at each node's next depth)."""
    gen = torch.Generator().manual_seed(seed)
    logq = torch.log_softmax(torch.randn(MAX_DEPTH, VOCAB, generator=gen), dim=-1).to(device)
    root = torch.tensor(3, device=device)
    tree = ddtree_device(logq, root, budget=slots - 1, topk=8, num_slots=slots)
    choices = logq.argmax(-1)[tree.depth.clamp(max=MAX_DEPTH - 1)]
    return tree, choices


def make_call(op: str, provider: str, tree: DeviceTree, choices: torch.Tensor, prefix: torch.Tensor, dtype):
    """A no-argument callable running ``op`` once, or None when the provider does not apply to the device."""
    if provider != "torch" and tree.tokens.device.type != "cuda":
        return None
    impl = "triton" if provider.startswith("triton") else "torch"

    def mask():
        return tree_mask(tree.parents, tree.valid, prefix, CAPACITY, MAX_DEPTH, dtype, impl=impl)

    def accept():
        return accept_path(tree.tokens, tree.parents, tree.depth, tree.valid, choices, MAX_DEPTH, impl=impl)

    if op == "accept-b32":
        rows = (tree.tokens, tree.parents, tree.depth, tree.valid, choices)
        fields = [t.expand(BATCH, -1).contiguous() for t in rows]
        return lambda: accept_paths(*fields, MAX_DEPTH, impl=impl)
    if impl == "triton":
        return {"mask": mask, "accept": accept, "round": lambda: (mask(), accept())}[op]
    ancestors = ancestor_matrix(tree, MAX_DEPTH)  # the round computes it once, for the mask and the acceptance

    def round_ops():
        return mask(), accept_device(tree, choices, ancestor_matrix(tree, MAX_DEPTH), max_depth=MAX_DEPTH)

    return {
        "mask": mask,
        "accept": lambda: accept_device(tree, choices, ancestors, max_depth=MAX_DEPTH),
        "round": round_ops,
    }[op]


def run(device: torch.device) -> list[dict]:
    dtype = torch.bfloat16
    prefix = torch.tensor(CAPACITY // 2, device=device)
    rows = []
    for slots in SLOTS:
        tree, choices = make_tree(slots, device)
        for op in OPS:
            row = {"op": op, "slots": slots, "capacity": CAPACITY, "max_depth": MAX_DEPTH}
            args = (tree, choices, prefix, dtype)
            time_providers(row, PROVIDERS, lambda p, op=op, a=args: make_call(op, p, *a), device)
            row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"tree_accept, capacity {CAPACITY}, max_depth {MAX_DEPTH}, bf16 mask, median ms per call on {name} "
          f"(torch {torch.__version__}); warm")  # fmt: skip
    report(run(device), ["op", "slots", *PROVIDERS, "graph speedup"], args.out, "tree_accept.csv", device)


if __name__ == "__main__":
    main()
