"""Speed of ``traversal_round``: a round of traversal verification, torch reference vs two Triton launches.

The arguments are a random round of the shape traversal verification meets: trees of ``S`` slots built as ``S / 4``
sampled paths of depth 4 merged at the root (``SampledTrees``-like, siblings without replacement), float32 ``p``
and, per node, the draft ``q`` it was drawn from (its parent's ``p`` perturbed: some nodes accepted, many
rejected), each node's token drawn from its q. Shapes: B in {1, 8}, S in {16, 32, 64}, V in {8192,
151936}. Providers: ``torch`` (eager launches: the post-order's sorts, then ~25 per slot), ``torch-graph`` (the same
ops replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and ``triton-graph``; the graph and
Triton providers need CUDA. Without CUDA only the eager reference runs, and only at V = 8192 and B = 1.

    python benchmarks/kernels/bench_tree_traversal.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.tree_traversal import traversal_round

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
BATCHES = [1, 8]
SLOTS = [16, 32, 64]
VOCABS = [8192, 151936]
DEPTH = 4


def make_args(batch: int, slots: int, vocab: int, device: torch.device) -> list:
    """``traversal_round``'s arguments for a random round on ``device``: ``(slots - 1) // DEPTH`` paths of depth
    ``DEPTH`` from the root (the last one shorter), each node the next of its path."""
    parents = torch.full((slots,), -1, dtype=torch.long)
    depth = torch.zeros(slots, dtype=torch.long)
    for j in range(1, slots):
        first = (j - 1) % DEPTH == 0  # a path's first node hangs from the root
        parents[j] = 0 if first else j - 1
        depth[j] = depth[parents[j]] + 1
    parents, depth = parents.expand(batch, -1).to(device), depth.expand(batch, -1).to(device)
    gen = torch.Generator(device=device).manual_seed(batch * 1000 + slots)
    logits = torch.randn(batch, slots, vocab, generator=gen, device=device)
    p = torch.softmax(logits, -1)
    noisy = logits + torch.randn(logits.shape, generator=gen, device=device)
    q = torch.softmax(noisy, -1).gather(1, parents.clamp(min=0)[..., None].expand(-1, -1, vocab))
    tokens = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, slots)  # drawn from q
    valid = torch.ones(batch, slots, dtype=torch.bool, device=device)
    test = torch.rand(batch, slots, generator=gen, device=device, dtype=torch.float64)
    final = torch.rand(batch, slots, generator=gen, device=device, dtype=torch.float64)
    return [tokens, parents, depth, valid, p, q, test, final, DEPTH, False]


def make_call(provider: str, args: list):
    """A no-argument callable running the round once, or None when the provider does not apply to the device."""
    if provider != "torch" and args[4].device.type != "cuda":  # args[4]: p
        return None
    impl = "triton" if provider.startswith("triton") else "torch"
    return lambda: traversal_round(*args, impl=impl)


def run(device: torch.device) -> list[dict]:
    rows = []
    cuda = device.type == "cuda"
    for vocab in VOCABS if cuda else VOCABS[:1]:
        for batch in BATCHES if cuda else BATCHES[:1]:
            for slots in SLOTS:
                args = make_args(batch, slots, vocab, device)
                accepted = traversal_round(*args, impl="torch").num_path.float().mean().item() - 1
                row = {"B": batch, "S": slots, "V": vocab, "accepted": accepted}
                time_providers(row, PROVIDERS, lambda p, a=args: make_call(p, a), device)
                if cuda:
                    row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
                rows.append(row)
                del args
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"traversal_round, paths of depth {DEPTH}, float32, without replacement, median ms per call on {name} "
          f"(torch {torch.__version__}); warm")  # fmt: skip
    if device.type != "cuda":
        print(f"no CUDA device: the Triton kernel needs one; V = {VOCABS[0]}, B = 1 only")
    columns = ["B", "S", "V", "accepted", *PROVIDERS] + (["graph speedup"] if device.type == "cuda" else [])
    report(run(device), columns, args.out, "tree_traversal.csv", device)


if __name__ == "__main__":
    main()
