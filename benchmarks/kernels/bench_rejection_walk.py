"""Speed of ``rejection_walk``: the walk after a round of recursive rejection sampling and its bonus draw, the
reference's ~20 launches (pointer doubling, gathers, a float64 cumulative sum, a search) vs one Triton launch.

Shapes: the zoo dense pair's rounds (V = 8192) and Qwen3-8B's vocabulary (151936), trees of 16 and 33 slots (a
chain of 15 and the DDTree b32), one and four sequences, ``r`` in float32 (the round's dtype). Providers: ``torch``
(the reference, eager launches), ``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead),
``triton`` and ``triton-graph``; all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_rejection_walk.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.tree_rejection import rejection_walk

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
VOCABS = [("zoo", 8192), ("qwen3", 151936)]
TREES = [(16, 15), (33, 8)]  # (slots, max depth)
BATCHES = [1, 4]


def make_args(batch: int, slots: int, depth: int, vocab: int, device: torch.device) -> tuple:
    """A chain-like walk (node i accepts i + 1 up to a random end) over random ``r`` rows."""
    gen = torch.Generator().manual_seed(0)
    nxt = torch.arange(slots).repeat(batch, 1)
    ends = torch.randint(0, depth + 1, (batch,), generator=gen)
    nxt = torch.where(nxt < ends[:, None], nxt + 1, nxt)
    node_depth = torch.arange(slots).clamp(max=depth).repeat(batch, 1)
    tokens = torch.randint(vocab, (batch, slots), generator=gen)
    r = torch.rand(batch, slots, vocab, generator=gen)
    r = r / r.sum(-1, keepdim=True)
    u = torch.rand(batch, slots, generator=gen, dtype=torch.float64)
    return (*(t.to(device) for t in (tokens, node_depth, nxt, r, u)), depth)


def make_call(provider: str, args: tuple):
    """A no-argument callable running one walk, or None when the provider does not apply."""
    if provider != "torch" and args[0].device.type != "cuda":
        return None
    impl = "torch" if provider.startswith("torch") else "triton"
    return lambda: rejection_walk(*args, impl=impl)


def run(device: torch.device) -> list[dict]:
    rows = []
    for name, vocab in VOCABS:
        for slots, depth in TREES:
            for batch in BATCHES:
                a = make_args(batch, slots, depth, vocab, device)
                row = {"vocab": name, "V": vocab, "S": slots, "B": batch}
                time_providers(row, PROVIDERS, lambda p, a=a: make_call(p, a), device)
                if row.get("triton-graph"):
                    row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
                rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"rejection_walk, r float32, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["vocab", "V", "S", "B", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "rejection_walk.csv", device)


if __name__ == "__main__":
    main()
