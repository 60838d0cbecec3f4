"""Speed of ``tree_conv``: a recurrent layer's conv over each node's path, the reference's ~8 launches vs one
Triton launch.

Shapes: a Qwen3.5-style 8 B Gated DeltaNet layer (8192 conv channels, kernel 4) and the zoo hybrid target's, at 1,
16, 32 and 64 nodes (a decode step and verify trees: chains here, which read as much as any tree), bf16.
Providers: ``torch`` (the reference, eager launches), ``torch-graph`` (replayed from a CUDA graph: GPU time without
launch overhead), ``triton`` and ``triton-graph``; all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_tree_conv.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.tree_conv import tree_conv

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
# (name, conv channels, kernel width)
SHAPES = [("qwen3.5-8b", 8192, 4), ("zoo hybrid", 1536, 4)]
NODES = [1, 16, 32, 64]


def make_call(provider: str, args: tuple):
    """A no-argument callable running one ``tree_conv``, or None when the provider does not apply."""
    if provider != "torch" and args[0].device.type != "cuda":
        return None
    impl = "torch" if provider.startswith("torch") else "triton"
    return lambda: tree_conv(*args, torch.nn.SiLU(), impl=impl)


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, channels, width in SHAPES:
        for nodes in NODES:
            stored = width - 1
            inputs = torch.randn(1, nodes, channels, generator=gen).to(device=device, dtype=torch.bfloat16)
            window = torch.randn(1, channels, stored, generator=gen).to(device=device, dtype=torch.bfloat16)
            weight = torch.randn(channels, width, generator=gen).to(device=device, dtype=torch.bfloat16)
            # a chain: node i's taps are nodes i - 3 .. i, continuing into the window's newest columns (cat(window,
            # inputs) columns stored + i - 3 .. stored + i)
            taps = torch.arange(nodes)[:, None] + torch.arange(-width + 1, 1)[None]
            index = (stored + taps).clamp(min=0)[None].to(device)
            row = {"shape": name, "C": channels, "W": width, "N": nodes}
            args = (inputs, window, weight, None, index)
            time_providers(row, PROVIDERS, lambda p, a=args: make_call(p, a), device)
            if row.get("triton-graph"):
                row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"tree_conv, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "C", "W", "N", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "tree_conv.csv", device)


if __name__ == "__main__":
    main()
