"""Speed of ``path_trie``: sampled paths merged into a trie, torch reference vs one Triton launch.

The paths are ``k`` draws of ``L`` tokens per row from a vocabulary of 4 (prefixes shared, as sampled paths of a
peaked draft share them) for the ``SampledTrees`` shapes (k, L) in {(3, 5), (4, 8), (8, 8), (16, 16)} and B in
{1, 8}. Providers: ``torch`` (eager launches: the pairwise prefix comparison, cumulative sums and scatters),
``torch-graph`` (the same ops replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and
``triton-graph``; the graph and Triton providers need CUDA.

    python benchmarks/kernels/bench_path_trie.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import IMPL_PROVIDERS, bench_args, report, time_impls  # benchmarks/kernels, beside this script

from specdec.kernels.path_trie import path_trie

BATCHES = [1, 8]
SHAPES = [(3, 5), (4, 8), (8, 8), (16, 16)]


def run(device: torch.device) -> list[dict]:
    rows = []
    for batch in BATCHES:
        for k, length in SHAPES:
            gen = torch.Generator().manual_seed(batch * 100 + k)
            paths = torch.randint(4, (batch, k, length), generator=gen).to(device)
            root = torch.zeros(batch, dtype=torch.long, device=device)
            args = (paths, root, k * length + 1)
            nodes = path_trie(*args, impl="torch")[4].float().mean().item()
            row = {"B": batch, "k": k, "L": length, "nodes": nodes}
            rows.append(time_impls(row, path_trie, args, device))
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"path_trie, paths over 4 tokens, median ms per call on {name} (torch {torch.__version__}); warm")
    if device.type != "cuda":
        print("no CUDA device: the Triton kernel needs one; the reference only")
    columns = ["B", "k", "L", "nodes", *IMPL_PROVIDERS] + (["graph speedup"] if device.type == "cuda" else [])
    report(run(device), columns, args.out, "path_trie.csv", device)


if __name__ == "__main__":
    main()
