"""Speed of ``silu_mul``: a gated MLP's activation and product, the reference's two launches vs one Triton launch.

Shapes: a Qwen3-8B MLP (intermediate 12288) and the zoo dense target's (384), at 1, 16, 32 and 64 rows, bf16.
Providers: ``torch`` (the reference, eager launches), ``torch-graph`` (replayed from a CUDA graph: GPU time
without launch overhead), ``triton`` and ``triton-graph``; all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_silu_mul.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.silu_mul import silu_mul

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
SHAPES = [("qwen3-8b", 12288), ("zoo dense", 384)]
ROWS = [1, 16, 32, 64]


def make_call(provider: str, args: tuple):
    """A no-argument callable running one ``silu_mul``, or None when the provider does not apply."""
    if provider != "torch" and args[0].device.type != "cuda":
        return None
    impl = "torch" if provider.startswith("torch") else "triton"
    return lambda: silu_mul(*args, impl=impl)


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, width in SHAPES:
        for n in ROWS:
            gate, up = (torch.randn(n, width, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in "gu")
            row = {"shape": name, "F": width, "N": n}
            time_providers(row, PROVIDERS, lambda p, a=(gate, up): make_call(p, a), device)
            if row.get("triton-graph"):
                row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"silu_mul, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "F", "N", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "silu_mul.csv", device)


if __name__ == "__main__":
    main()
