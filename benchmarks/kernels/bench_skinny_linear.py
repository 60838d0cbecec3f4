"""Speed of ``skinny_linear``: the 8 B target's linear layers on a decode step or a draft tree of M rows.

Shapes: Qwen3-8B's projections (hidden 4096, 32 heads x 128, 8 KV heads, intermediate 12288): ``qkv`` (N = 4096 +
2 x 1024 = 6144), ``o_proj`` (4096 x 4096; also ``q_proj``), ``k|v`` (``k_proj`` / ``v_proj`` alone, 1024 x 4096),
``gate_up`` (N = 2 x 12288), ``gate`` / ``up`` alone (12288 x 4096), ``down`` (4096 x 12288) and ``lm_head``
(151936 x 4096); bf16, no bias, M in {1, 16, 32, 64} rows. Providers:
``cublas`` (``torch.nn.functional.linear``) and ``triton`` (the split-K kernel); ``-graph`` variants replay the call
from a CUDA graph (GPU time without launch overhead). The ``TB/s`` columns are weight bytes / median time of the
graph-replayed call (the weight is what a skinny call reads; an H200's HBM gives ~4.8 TB/s). Without CUDA only the
eager ``cublas`` column (CPU ``F.linear``) runs, on the smaller shapes.

    python benchmarks/kernels/bench_skinny_linear.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.skinny_linear import skinny_linear

BASE = ["cublas", "triton"]
PROVIDERS = [p for base in BASE for p in (base, f"{base}-graph")]
CPU_PROVIDERS = ("cublas",)
ROWS = [1, 16, 32, 64]
# (name, N, K)
SHAPES = [
    ("qkv", 6144, 4096),
    ("o_proj", 4096, 4096),
    ("k|v", 1024, 4096),
    ("gate_up", 24576, 4096),
    ("gate|up", 12288, 4096),
    ("down", 4096, 12288),
    ("lm_head", 151936, 4096),
]
CPU_SHAPES = ("qkv", "o_proj")
DTYPE = torch.bfloat16


def make_call(provider: str, x: torch.Tensor, weight: torch.Tensor):
    """A no-argument callable running one linear, or None when the provider does not apply to the device."""
    base = provider.removesuffix("-graph")
    if x.device.type != "cuda" and (provider.endswith("-graph") or base not in CPU_PROVIDERS):
        return None
    if base == "cublas":
        return lambda: torch.nn.functional.linear(x, weight)
    return lambda: skinny_linear(x, weight, impl="triton")


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    for name, n, k in SHAPES:
        if device.type != "cuda" and name not in CPU_SHAPES:
            continue
        weight = (torch.randn(n, k, generator=gen) * k**-0.5).to(device=device, dtype=DTYPE)
        gbytes = weight.numel() * weight.element_size() / 1e9
        for rows in ROWS:
            x = torch.randn(1, rows, k, generator=gen).to(device=device, dtype=DTYPE)
            row = {"layer": name, "N": n, "K": k, "M": rows}
            if device.type == "cuda":
                from specdec.kernels.skinny_linear.triton import sm_count, split_plan

                plan = split_plan(rows, n, k, sm_count(device), itemsize=weight.element_size())
                row["split_k"], row["programs"] = plan["SPLIT_K"], plan["programs"]
            else:
                row["split_k"], row["programs"] = 0, 0
            time_providers(row, PROVIDERS, lambda p, a=(x, weight): make_call(p, *a), device)
            for base in BASE:
                row[f"{base} TB/s"] = gbytes / row[f"{base}-graph"] if device.type == "cuda" else float("nan")
            row["speedup (graph)"] = row["cublas-graph"] / row["triton-graph"]
            rows_out.append(row)
        del weight
    return rows_out


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"skinny_linear, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["layer", "N", "K", "M", "split_k", "programs", *PROVIDERS, "cublas TB/s", "triton TB/s",
               "speedup (graph)"]  # fmt: skip
    report(run(device), columns, args.out, "skinny_linear.csv", device)


if __name__ == "__main__":
    main()
