"""Speed of the DDTree builders: the device-side ``ddtree_device`` against the host heap ``build_ddtree``.

Providers: ``heap`` (``build_ddtree``: top-k on the device, one copy to the host, a Python heap), ``device``
(``ddtree_device(impl="torch")``, eager launches), ``device-graph`` (the same ops replayed from a CUDA graph: GPU
time without launch overhead; CUDA only) and ``triton-graph`` (``impl="triton"``: top-k plus the one-launch
selection of ``specdec.kernels.ddtree_build``, replayed from a graph; where the rank key fits one int64) and
``triton-topk-graph`` (the same with the one-launch Triton top-k, ``topk_impl="triton"``). Shapes:
depth D = 15 (a block of 16), budgets 15 / 32 / 64 / 128, topk 8 and topk = budget, vocabularies 8192 (the zoo) and
151936 (Qwen). Inputs are log-softmaxed random logits.

    python benchmarks/kernels/bench_device_tree.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch
from _common import bench_args, time_call  # benchmarks/kernels, beside this script
from oracles.ddtree_heap import build_ddtree

from specdec.kernels.ddtree_build import triton_fits
from specdec.trees.build import ddtree_device

PROVIDERS = ["heap", "device", "device-graph", "triton-graph", "triton-topk-graph"]
DEPTH = 15
BUDGETS = [15, 32, 64, 128]
VOCABS = [8192, 151936]


def make_call(provider: str, logq: torch.Tensor, budget: int, topk: int):
    """A no-argument callable running one build, or None when the provider does not apply to the device."""
    root = torch.tensor(3, device=logq.device)
    if provider == "heap":
        return lambda: build_ddtree(logq, 3, budget=budget, topk=topk)
    if provider.endswith("-graph") and logq.device.type != "cuda":
        return None
    if provider in ("triton-graph", "triton-topk-graph"):
        if not triton_fits(logq, min(topk, budget)):
            return None
        topk_impl = "triton" if provider == "triton-topk-graph" else "torch"
        return lambda: ddtree_device(
            logq, root, budget=budget, topk=topk, num_slots=budget + 1, impl="triton", topk_impl=topk_impl
        )
    return lambda: ddtree_device(logq, root, budget=budget, topk=topk, num_slots=budget + 1, impl="torch")


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for vocab in VOCABS:
        logq = torch.log_softmax(torch.randn(DEPTH, vocab, generator=gen), dim=-1).to(device)
        for budget in BUDGETS:
            for topk in sorted({8, budget}):
                row = {"vocab": vocab, "budget": budget, "topk": topk}
                for provider in PROVIDERS:
                    fn = make_call(provider, logq, budget, topk)
                    ms = (
                        (math.nan,) * 3
                        if fn is None
                        else time_call(fn, device, graph=provider.endswith("-graph"), rep=100)
                    )
                    row[provider], row[f"{provider}_p20"], row[f"{provider}_p80"] = ms
                rows.append(row)
                print(_format_row(row), flush=True)
    return rows


def _format_row(row: dict) -> str:
    cells = [f"{row['vocab']:>7}", f"{row['budget']:>6}", f"{row['topk']:>4}"]
    cells += [f"{row[p]:>12.3f}" for p in PROVIDERS]
    speedup = row["heap"] / min(row[p] for p in PROVIDERS[1:] if not math.isnan(row[p]))
    return " | ".join([*cells, f"{speedup:>7.1f}x"])


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"DDTree build, D = {DEPTH}, median ms per call on {name} (torch {torch.__version__}); warm")
    header = ["vocab", "budget", "topk", *PROVIDERS, "heap/best"]
    print(" | ".join(f"{h:>7}" if i < 3 else f"{h:>12}" for i, h in enumerate(header)))
    rows = run(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "device_tree.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"CSV: {out / 'device_tree.csv'}")


if __name__ == "__main__":
    main()
