"""Speed of ``grouped_linear`` / ``gated_linear``: a Qwen3-8B layer's input projections on M rows, against the
layer's own products one by one.

Groups (bf16, no bias, hidden 4096): ``qkv`` (``q_proj`` 4096 x 4096, ``k_proj`` / ``v_proj`` 1024 x 4096: three
products against one ``grouped_linear``), ``gate_up`` (``gate_proj`` / ``up_proj`` 12288 x 4096 and the
activation: ``F.linear`` twice and ``silu_mul`` against one ``gated_linear``), and the single products ``o_proj``
(4096 x 4096) and ``down`` (4096 x 12288) through a one-weight ``grouped_linear``; M in {1, 16, 32, 64} rows.
``--sweep`` also times ``qkv`` and ``down`` at 1 and 32 rows under other plans (the SM count the split is planned
for, the ``K`` tile), graph-replayed.
Providers: ``cublas`` (the layers' own products, cuBLAS) and ``triton`` (the grouped kernels); ``-graph`` variants
replay the calls from a CUDA graph (GPU time without launch overhead, as in a captured round). ``TB/s``: weight
bytes / median time of the graph-replayed call. Without CUDA only the eager ``cublas`` column runs (CPU products).

    python benchmarks/kernels/bench_grouped_linear.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.grouped_linear import gated_linear, grouped_linear
from specdec.kernels.silu_mul import silu_mul

BASE = ["cublas", "triton"]
PROVIDERS = [p for base in BASE for p in (base, f"{base}-graph")]
ROWS = [1, 16, 32, 64]
HIDDEN = 4096
# name -> (the weights' N, K)
GROUPS = {"qkv": ((4096, 1024, 1024), 4096), "gate_up": ((12288, 12288), 4096), "o_proj": ((4096,), 4096),
          "down": ((4096,), 12288)}  # fmt: skip
SWEEP = [(sms, block_k) for sms in (33, 66, 132, 264) for block_k in (64, 128, 256)]
DTYPE = torch.bfloat16


def make_call(provider: str, name: str, x: torch.Tensor, weights: list[torch.Tensor]):
    """A no-argument callable running the group once, or None when the provider does not apply to the device."""
    base = provider.removesuffix("-graph")
    if x.device.type != "cuda" and (provider.endswith("-graph") or base != "cublas"):
        return None
    if name == "gate_up":
        if base == "cublas":
            return lambda: silu_mul(F.linear(x, weights[0]), F.linear(x, weights[1]))
        return lambda: gated_linear(x, *weights, impl="triton")
    if base == "cublas":
        return lambda: [F.linear(x, w) for w in weights]
    return lambda: grouped_linear(x, weights, impl="triton")


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for name, (widths, k) in GROUPS.items():
        if device.type != "cuda" and name != "qkv":
            continue
        weights = [(torch.randn(n, k, generator=gen) * k**-0.5).to(device=device, dtype=DTYPE) for n in widths]
        gbytes = sum(w.numel() for w in weights) * 2 / 1e9
        for rows in ROWS:
            x = torch.randn(1, rows, k, generator=gen).to(device=device, dtype=DTYPE)
            row = {"group": name, "N": "+".join(map(str, widths)), "M": rows}
            time_providers(row, PROVIDERS, lambda p, a=(name, x, weights): make_call(p, *a), device)
            for base in BASE:
                row[f"{base} TB/s"] = gbytes / row[f"{base}-graph"] if device.type == "cuda" else float("nan")
            cuda = device.type == "cuda"
            row["speedup (graph)"] = row["cublas-graph"] / row["triton-graph"] if cuda else float("nan")
            out.append(row)
        del weights
    return out


def sweep(device: torch.device) -> list[dict]:
    """``qkv`` and ``down`` at 1 and 32 rows, graph-replayed, under each (SM count, K tile) plan of ``SWEEP``."""
    from _common import time_call

    from specdec.kernels.grouped_linear.triton import group_plan, grouped_linear_triton

    gen = torch.Generator().manual_seed(1)
    out = []
    for name in ("qkv", "down"):
        widths, k = GROUPS[name]
        weights = [(torch.randn(n, k, generator=gen) * k**-0.5).to(device=device, dtype=DTYPE) for n in widths]
        gbytes = sum(w.numel() for w in weights) * 2 / 1e9
        for rows in (1, 32):
            x = torch.randn(rows, k, generator=gen).to(device=device, dtype=DTYPE)
            for sms, block_k in SWEEP:
                plan = group_plan(rows, list(widths), k, sms, block_k=block_k)

                def call(x=x, weights=weights, sms=sms, block_k=block_k):
                    return grouped_linear_triton(x, weights, sms=sms, block_k=block_k)

                ms = time_call(call, device, graph=True)[0]
                out.append({"group": name, "M": rows, "sms": sms, "block_k": block_k, "split_k": plan["SPLIT_K"],
                            "programs": plan["programs"], "ms": ms, "TB/s": gbytes / ms})  # fmt: skip
    return out


def main() -> None:
    import sys

    do_sweep = "--sweep" in sys.argv
    if do_sweep:
        sys.argv.remove("--sweep")
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"grouped_linear / gated_linear, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["group", "N", "M", *PROVIDERS, "cublas TB/s", "triton TB/s", "speedup (graph)"]
    report(run(device), columns, args.out, "grouped_linear.csv", device)
    if do_sweep and device.type == "cuda":
        print("plans (graph-replayed ms per call)")
        report(sweep(device), ["group", "M", "sms", "block_k", "split_k", "programs", "ms", "TB/s"], args.out,
               "grouped_linear_plans.csv", device)  # fmt: skip


if __name__ == "__main__":
    main()
