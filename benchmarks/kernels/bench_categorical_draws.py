"""Speed of ``categorical_draws``: ``k`` inverse-CDF draws per row, torch reference vs one Triton launch.

Rows of ``SampledTrees``' shapes: B in {1, 8} sequences x L in {5, 8} depths, k in {3, 4, 8} draws, V in {8192,
151936}, float32 softmax rows. Providers: ``torch`` (eager: the uniforms, a float64 cumulative sum, a product and a
``searchsorted``), ``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and
``triton-graph``; the graph and Triton providers need CUDA.

    python benchmarks/kernels/bench_categorical_draws.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import IMPL_PROVIDERS, bench_args, report, time_impls  # benchmarks/kernels, beside this script

from specdec.kernels.categorical_draws import categorical_draws

SHAPES = [(1, 5, 3), (1, 8, 4), (8, 8, 4), (8, 8, 8)]  # (B, L, k)
VOCABS = [8192, 151936]


def run(device: torch.device) -> list[dict]:
    rows = []
    for vocab in VOCABS:
        for batch, length, k in SHAPES:
            gen = torch.Generator(device=device).manual_seed(batch * 100 + k)
            probs = torch.softmax(torch.randn(batch, length, vocab, generator=gen, device=device) * 3, -1)
            noise = torch.rand(batch, length, 2 * k, generator=gen, device=device)
            row = {"B": batch, "L": length, "k": k, "V": vocab}
            time_impls(row, categorical_draws, (probs, noise, k), device)
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"categorical_draws, float32 rows, median ms per call on {name} (torch {torch.__version__}); warm")
    if device.type != "cuda":
        print("no CUDA device: the Triton kernel needs one; the reference only")
    columns = ["B", "L", "k", "V", *IMPL_PROVIDERS] + (["graph speedup"] if device.type == "cuda" else [])
    report(run(device), columns, args.out, "categorical_draws.csv", device)


if __name__ == "__main__":
    main()
