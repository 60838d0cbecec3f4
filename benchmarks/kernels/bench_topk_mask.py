"""Speed of ``topk_mask``: HF's top-k warper (``torch.topk``, a compare, a ``masked_fill``) vs one Triton launch.

Shapes: ``[N, V]`` fp32 scores at N = 16, 32, 64 tree nodes, for the zoo's vocabulary (8192), Llama-2's (32000) and
the largest the kernel takes (32768), with HF's default ``top_k=50``. Providers: ``torch`` (the reference, HF's
formula, eager launches), ``torch-graph`` (replayed from a CUDA graph: GPU time without launch overhead),
``triton`` and ``triton-graph``; all but ``torch`` need CUDA. ``--plans`` also times, replayed, the kernel's plans
(interpolated or bisecting search, warps) on logit-like rows and on the same rounded to bf16 (many ties), at the
shapes' vocabularies and 16 rows, to pick the defaults in ``specdec/kernels/topk_mask/triton.py``.

    python benchmarks/kernels/bench_topk_mask.py [--device cuda] [--out bench_out/kernels] [--plans]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import sys

import torch
from _common import IMPL_PROVIDERS, bench_args, report, time_call, time_impls  # beside this script

from specdec.kernels.topk_mask import topk_mask

TOP_K = 50
SHAPES = [("zoo", 8192), ("llama-2", 32000), ("max", 32768)]
ROWS = [16, 32, 64]
PLANS = [(search, warps) for search in ("interp", "bisect") for warps in (2, 4, 8, 16)]


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, vocab in SHAPES:
        for n in ROWS:
            scores = (torch.randn(n, vocab, generator=gen) * 3).to(device)
            row = {"shape": name, "V": vocab, "N": n, "k": TOP_K}
            rows.append(time_impls(row, topk_mask, (scores, TOP_K), device))
    return rows


def run_plans(device: torch.device) -> list[dict]:
    """The kernel replayed under each launch plan (CUDA only)."""
    from specdec.kernels.topk_mask.triton import topk_mask_triton

    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, vocab in SHAPES:
        for kind in ("fp32", "bf16"):
            scores = (torch.randn(16, vocab, generator=gen) * 3).to(device)
            scores = scores.bfloat16().float() if kind == "bf16" else scores
            row = {"shape": name, "V": vocab, "N": 16, "values": kind}
            for search, warps in PLANS:
                plan = dict(interpolate=search == "interp", num_warps=warps)
                call = lambda x=scores, p=plan: topk_mask_triton(x, TOP_K, **p)  # noqa: E731
                row[f"{search}-w{warps}"] = time_call(call, device, graph=True, rep=20)[0]
            rows.append(row)
    return rows


def main() -> None:
    plans = "--plans" in sys.argv
    if plans:
        sys.argv.remove("--plans")
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"topk_mask, fp32, top_k={TOP_K}, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "V", "N", *IMPL_PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "topk_mask.csv", device)
    if plans and device.type == "cuda":
        print("\nsearch plans at N = 16, replayed, median ms")
        rows = run_plans(device)
        for row in rows:
            print(", ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in row.items()))  # fmt: skip


if __name__ == "__main__":
    main()
