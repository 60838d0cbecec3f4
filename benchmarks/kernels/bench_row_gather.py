"""Speed of ``row_gather``: rows of a table by index, ``index_select`` vs one Triton launch.

Tables: the zoo target's embedding (8192 x 384, bf16), an 8 B target's (151936 x 4096, bf16) and rotary tables by
position ([4096, 2, 64] and [32768, 2, 128], fp32 / bf16), each with 1, 16, 32 and 64 rows looked up (a step, trees
of 16 / 32 nodes, a 64-row block). Providers: ``torch`` (``index_select``, eager), ``torch-graph`` (replayed from a
CUDA graph: GPU time without launch overhead), ``triton`` and ``triton-graph``; the graph and Triton providers need
CUDA.

    python benchmarks/kernels/bench_row_gather.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import IMPL_PROVIDERS, bench_args, report, time_impls  # benchmarks/kernels, beside this script

from specdec.kernels.row_gather import row_gather

TABLES = [
    ("embedding zoo", (8192, 384), torch.bfloat16),
    ("embedding 8B", (151936, 4096), torch.bfloat16),
    ("rotary zoo", (4096, 2, 64), torch.float32),
    ("rotary 8B", (32768, 2, 128), torch.bfloat16),
]
ROWS = [1, 16, 32, 64]


def run(device: torch.device) -> list[dict]:
    rows = []
    for name, shape, dtype in TABLES:
        table = torch.randn(shape, device=device).to(dtype)
        for count in ROWS:
            index = torch.randint(shape[0], (1, count), device=device)
            row = {"table": name, "rows": count}
            time_impls(row, row_gather, (table, index), device)
            rows.append(row)
        del table
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"row_gather, median ms per call on {name} (torch {torch.__version__}); warm")
    if device.type != "cuda":
        print("no CUDA device: the Triton kernel needs one; the reference only")
    columns = ["table", "rows", *IMPL_PROVIDERS] + (["graph speedup"] if device.type == "cuda" else [])
    report(run(device), columns, args.out, "row_gather.csv", device)


if __name__ == "__main__":
    main()
