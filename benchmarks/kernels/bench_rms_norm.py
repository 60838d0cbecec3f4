"""Speed of ``rms_norm``: the DFlash drafter's RMSNorm, torch reference (``_RMSNorm``'s ops) vs one Triton launch.

Shapes: the drafter's norms over a 16-row block in bf16 with bf16 weights: the hidden norms (``[16, 384]``, the
zoo drafter, and ``[16, 4096]``, the 8 B shape), the per-head query / key norms ``[16, H, D]`` for H in {6, 32}
and D in {64, 128}, and the stacked key norm of ``DFlashStatic.ingest`` (``[16, L, H_kv, D]`` with per-layer
weights ``[L, D]``, ``period = H_kv``; L = 5, H_kv = 8, D = 128, the 8 B drafter), and ``add_rms_norm`` (the
residual add and the norm after it, ``add+hidden`` rows: reference = two ops, Triton = one launch). Providers:
``torch`` (eager launches), ``torch-graph`` (the same ops replayed from a CUDA graph: GPU time without launch
overhead), ``triton`` and ``triton-graph``; the graph and Triton providers need CUDA.

    python benchmarks/kernels/bench_rms_norm.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.rms_norm import add_rms_norm, rms_norm

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
ROWS = 16
EPS = 1e-6
# (name, x's shape, weight rows G, period)
SHAPES = [
    ("hidden", (ROWS, 384), 1, 1),
    ("hidden", (ROWS, 4096), 1, 1),
    ("heads", (ROWS, 6, 64), 1, 1),
    ("heads", (ROWS, 6, 128), 1, 1),
    ("heads", (ROWS, 32, 64), 1, 1),
    ("heads", (ROWS, 32, 128), 1, 1),
    ("stacked", (ROWS, 5, 8, 128), 5, 8),
    ("add+hidden", (ROWS, 384), 1, 1),
    ("add+hidden", (1, 4096), 1, 1),
    ("add+hidden", (ROWS, 4096), 1, 1),
]


def make_call(provider: str, x: torch.Tensor, weight: torch.Tensor, period: int):
    """A no-argument callable running one norm, or None when the provider does not apply to the device."""
    if provider != "torch" and x.device.type != "cuda":
        return None
    impl = "triton" if provider.startswith("triton") else "torch"
    if period == 0:  # the residual add too: x is the residual, x rolled by one column the new rows
        other = x.roll(1, -1)
        return lambda: add_rms_norm(other, x, weight, EPS, impl=impl)
    return lambda: rms_norm(x, weight, EPS, period=period, impl=impl)


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, shape, groups, period in SHAPES:
        x = torch.randn(shape, generator=gen).to(device=device, dtype=torch.bfloat16)
        weight = (1 + 0.1 * torch.randn(groups, shape[-1], generator=gen)).to(device=device, dtype=torch.bfloat16)
        weight = weight[0] if groups == 1 else weight
        row = {"norm": name, "shape": "x".join(map(str, shape)), "G": groups, "period": period}
        n = 0 if name.startswith("add") else period
        time_providers(row, PROVIDERS, lambda p, x=x, w=weight, n=n: make_call(p, x, w, n), device)
        row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
        rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"rms_norm, bf16 x and weights, eps {EPS}, median ms per call on {name} (torch {torch.__version__}); warm")
    report(run(device), ["norm", "shape", "G", "period", *PROVIDERS, "graph speedup"], args.out, "rms_norm.csv", device)


if __name__ == "__main__":
    main()
