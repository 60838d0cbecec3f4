"""Speed of ``round_tail``: the end of a round (output row, next roots, lengths), the reference's tensor ops vs one
Triton launch.

Shapes: tree rounds with paths of 16 and 33 tokens and plain decoding, at 1 and 32 sequences. Providers: ``torch``
(the reference, eager launches), ``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead),
``triton`` and ``triton-graph``; all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_round_tail.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import IMPL_PROVIDERS, bench_args, report, time_impls  # benchmarks/kernels, beside this script

from specdec.kernels.round_tail import round_tail

CASES = [("tree", 16), ("tree", 33), ("ar", 1)]  # (round, path length)


def run(device: torch.device) -> list[dict]:
    rows = []
    for kind, length in CASES:
        for batch in (1, 32):
            out = torch.zeros(batch, length + 3, dtype=torch.long, device=device)
            tokens = torch.randint(0, 1000, (batch, length), device=device)
            active = torch.ones(batch, dtype=torch.bool, device=device)
            root = torch.zeros(batch, dtype=torch.long, device=device)
            prefix = torch.zeros(batch, dtype=torch.long, device=device)
            num_path = torch.randint(1, length + 1, (batch,), device=device)
            num_nodes = torch.full((batch,), 32, dtype=torch.long, device=device)
            args = (out, tokens, active, root, prefix) + ((num_path, num_nodes) if kind == "tree" else ())
            rows.append(time_impls({"round": kind, "P": length, "B": batch}, round_tail, args, device))
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"round_tail, median ms per call on {name} (torch {torch.__version__}); warm")
    report(run(device), ["round", "P", "B", *IMPL_PROVIDERS, "graph speedup"], args.out, "round_tail.csv", device)


if __name__ == "__main__":
    main()
