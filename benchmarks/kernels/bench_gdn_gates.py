"""Speed of ``gdn_gates``: the Gated DeltaNet adapter's former tensor ops (~25 launches) vs one Triton launch.

Shapes: a Qwen3.5-style 8 B layer (16 key heads, 32 value heads of 128) and the zoo hybrid target's, at 1, 16, 32
and 64 nodes (a decode step and verify trees), bf16. Providers: ``torch`` (the reference, eager launches),
``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and ``triton-graph``;
all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_gdn_gates.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.gdn_gates import gdn_gates

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
# (name, H, HV, K, V)
SHAPES = [("qwen3.5-8b", 16, 32, 128, 128), ("zoo hybrid", 4, 8, 64, 64)]
NODES = [1, 16, 32, 64]


def make_call(provider: str, args: tuple, shape: dict):
    """A no-argument callable running one ``gdn_gates``, or None when the provider does not apply."""
    if provider != "torch" and args[0].device.type != "cuda":
        return None
    impl = "torch" if provider.startswith("torch") else "triton"
    return lambda: gdn_gates(*args, impl=impl, **shape)


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, heads, vheads, kdim, vdim in SHAPES:
        shape = {"num_k_heads": heads, "head_k_dim": kdim, "num_v_heads": vheads}
        for nodes in NODES:
            x = torch.randn(nodes, 2 * heads * kdim + vheads * vdim, generator=gen)
            b, a = torch.randn(nodes, vheads, generator=gen), torch.randn(nodes, vheads, generator=gen)
            args = tuple(t.to(device=device, dtype=torch.bfloat16) for t in (x, b, a))
            args += (torch.randn(vheads, generator=gen).to(device), torch.randn(vheads, generator=gen).to(device))
            row = {"shape": name, "H": heads, "HV": vheads, "K": kdim, "N": nodes}
            time_providers(row, PROVIDERS, lambda p, a=args, s=shape: make_call(p, a, s), device)
            if row.get("triton-graph"):
                row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"gdn_gates, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "H", "HV", "K", "N", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "gdn_gates.csv", device)


if __name__ == "__main__":
    main()
