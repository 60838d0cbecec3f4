"""What a captured graph of many small dependent kernels costs per kernel: the floor under a launch-bound round.

A round of the zoo pair replays ~150-230 kernels of a few microseconds each from one CUDA graph. This benchmark
captures chains of ``N`` dependent kernels (each reads the previous one's output) of a fixed size and replays
them: elementwise adds over ``E`` elements (1 k to 1 M) and small products (``[M, K] @ [K, K]``, M in 1 / 32),
``N`` in 50 / 100 / 200 / 400. The table gives µs per replay and per kernel; a per-kernel time that stays flat
while the kernels grow is the graph's own floor per node, which shorter kernels cannot go below.

    python benchmarks/kernels/bench_graph_nodes.py [--out bench_out/kernels]
"""

from __future__ import annotations

import torch
from _common import cuda_bench_args, report, time_call  # benchmarks/kernels, beside this script

COUNTS = [50, 100, 200, 400]
ADDS = [1 << 10, 1 << 14, 1 << 18, 1 << 20]
PRODUCTS = [(1, 384), (32, 384), (1, 4096), (32, 4096)]
DTYPE = torch.bfloat16


def _chain(step, start: torch.Tensor, count: int):
    """A callable running ``count`` dependent ``step``s from ``start``."""

    def run():
        x = start
        for _ in range(count):
            x = step(x)
        return x

    return run


def run(device: torch.device) -> list[dict]:
    rows = []
    for elements in ADDS:
        start = torch.randn(elements, device=device, dtype=DTYPE)
        for count in COUNTS:
            ms = time_call(_chain(lambda x: x + 1, start, count), device, graph=True)[0]
            rows.append({"kernel": f"add {elements}", "N": count, "us per replay": ms * 1e3,
                         "us per kernel": ms * 1e3 / count})  # fmt: skip
    for m, k in PRODUCTS:
        start = torch.randn(m, k, device=device, dtype=DTYPE)
        weight = torch.randn(k, k, device=device, dtype=DTYPE) / k**0.5
        for count in COUNTS:
            ms = time_call(_chain(lambda x, w=weight: x @ w, start, count), device, graph=True)[0]
            rows.append({"kernel": f"matmul {m}x{k}x{k}", "N": count, "us per replay": ms * 1e3,
                         "us per kernel": ms * 1e3 / count})  # fmt: skip
    return rows


def main() -> None:
    args, device, name = cuda_bench_args(__doc__.splitlines()[0])
    print(f"chains of dependent kernels replayed from one CUDA graph, bf16, on {name}; warm")
    report(run(device), ["kernel", "N", "us per replay", "us per kernel"], args.out, "graph_nodes.csv", device)


if __name__ == "__main__":
    main()
