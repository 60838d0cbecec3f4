"""Speed of ``gated_rms_norm``: a Gated DeltaNet layer's own gated norm after the cast of the recurrence's output
(~13 launches) vs one Triton launch.

Shapes: a Qwen3.5-style 8 B layer (32 value heads of 128) and the zoo hybrid target's (8 of 64), at 1, 16, 32 and
64 nodes (a decode step and verify trees), the recurrence's fp32 output into a bf16 model. Providers: ``torch``
(the reference, eager launches), ``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead),
``triton`` and ``triton-graph``; all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_gated_rms_norm.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.gated_rms_norm import gated_rms_norm

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
# (name, HV, V)
SHAPES = [("qwen3.5-8b", 32, 128), ("zoo hybrid", 8, 64)]
NODES = [1, 16, 32, 64]


def make_call(provider: str, args: tuple):
    """A no-argument callable running one ``gated_rms_norm``, or None when the provider does not apply."""
    if provider != "torch" and args[0].device.type != "cuda":
        return None
    impl = "torch" if provider.startswith("torch") else "triton"
    return lambda: gated_rms_norm(*args, 1e-6, dtype=torch.bfloat16, impl=impl)


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, vheads, vdim in SHAPES:
        for nodes in NODES:
            x = torch.randn(nodes * vheads, vdim, generator=gen).to(device)  # fp32, as the recurrence returns it
            gate = torch.randn(nodes * vheads, vdim, generator=gen).to(device=device, dtype=torch.bfloat16)
            weight = torch.randn(vdim, generator=gen).to(device=device, dtype=torch.bfloat16)
            row = {"shape": name, "HV": vheads, "V": vdim, "N": nodes}
            time_providers(row, PROVIDERS, lambda p, a=(x, gate, weight): make_call(p, a), device)
            if row.get("triton-graph"):
                row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"gated_rms_norm, fp32 in, bf16 out, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "HV", "V", "N", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "gated_rms_norm.csv", device)


if __name__ == "__main__":
    main()
