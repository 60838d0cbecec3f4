"""Speed of ``kv_write``: an attention layer's new keys and values into the static storage, the reference's two
``index_copy_`` (``index_put_`` for several sequences) vs one Triton launch.

Shapes: a Qwen3-8B layer (8 K/V heads of 128) and the zoo dense target's (2 of 64), 1 and 32 new rows, one and
four sequences, bf16, 4096 slots. Providers: ``torch`` (the reference, eager launches), ``torch-graph`` (replayed
from a CUDA graph: GPU time without launch overhead), ``triton`` and ``triton-graph``; all but ``torch`` need CUDA.

    python benchmarks/kernels/bench_kv_write.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.kv_write import kv_write

PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
# (name, K/V heads, head dim)
SHAPES = [("qwen3-8b", 8, 128), ("zoo dense", 2, 64)]
ROWS = [(1, 1), (1, 32), (4, 1), (4, 32)]  # (sequences, new rows)
CAPACITY = 4096


def make_call(provider: str, args: tuple):
    """A no-argument callable running one ``kv_write``, or None when the provider does not apply."""
    if provider != "torch" and args[0].device.type != "cuda":
        return None
    impl = "torch" if provider.startswith("torch") else "triton"
    return lambda: kv_write(*args, impl=impl)


def run(device: torch.device) -> list[dict]:
    rows = []
    for name, heads, dim in SHAPES:
        for batch, n in ROWS:
            storage = torch.zeros(2, batch, heads, CAPACITY, dim, dtype=torch.bfloat16, device=device)
            index = (torch.arange(n, device=device) + 100)[None].expand(batch, -1).contiguous()
            k = torch.randn(batch, n, heads, dim, device=device).to(torch.bfloat16).transpose(1, 2)
            v = torch.randn(batch, n, heads, dim, device=device).to(torch.bfloat16).transpose(1, 2)
            row = {"shape": name, "H_kv": heads, "D": dim, "B": batch, "N": n}
            args = (storage[0], storage[1], index, k, v)
            time_providers(row, PROVIDERS, lambda p, a=args: make_call(p, a), device)
            if row.get("triton-graph"):
                row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"kv_write, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "H_kv", "D", "B", "N", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "kv_write.csv", device)


if __name__ == "__main__":
    main()
