"""Speed of ``kv_commit``: the accepted path's key / value rows moved to the committed slots of every layer, the
reference's gather and scatter (with their index arithmetic) vs one Triton launch.

Shapes: the Qwen3-8B target (36 layers, 8 K/V heads of 128) and the zoo dense target (8 layers, 2 of 64), paths of
4 and 16 steps, one and four sequences, bf16, 4096 slots. Providers: ``torch`` (the reference, eager launches),
``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and ``triton-graph``; all
but ``torch`` need CUDA.

    python benchmarks/kernels/bench_kv_commit.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import IMPL_PROVIDERS, bench_args, report, time_impls  # benchmarks/kernels, beside this script

from specdec.kernels.kv_commit import kv_commit

# (name, layers, K/V heads, head dim)
SHAPES = [("qwen3-8b", 36, 8, 128), ("zoo dense", 8, 2, 64)]
PATHS = [(1, 4), (1, 16), (4, 16)]  # (sequences, path length)
CAPACITY = 4096


def run(device: torch.device) -> list[dict]:
    rows = []
    for name, layers, heads, dim in SHAPES:
        for batch, length in PATHS:
            kv = torch.zeros(layers, 2, batch, heads, CAPACITY, dim, dtype=torch.bfloat16, device=device)
            prefix = torch.full((batch,), 1000, dtype=torch.long, device=device)
            path = (torch.arange(length, device=device) * 2)[None].expand(batch, -1).contiguous()  # a sparse path
            row = {"shape": name, "L": layers, "H_kv": heads, "D": dim, "B": batch, "P": length}
            rows.append(time_impls(row, kv_commit, (kv, prefix, path), device))
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"kv_commit, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "L", "H_kv", "D", "B", "P", *IMPL_PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "kv_commit.csv", device)


if __name__ == "__main__":
    main()
