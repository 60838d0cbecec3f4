"""``tree_attention`` over long spans: K / V read per call against the memory bandwidth, and launch plans side by side.

Shape: the 8 B target's attention (H 32, H_kv 8, D 128, bf16) reading the first ``n`` slots of a 40 960-slot static
cache (``lengths = n``, as the round passes them), ``n`` in {512, 32 k}, Q in {1, 32, 64} query rows under a tree
mask. Providers, all replayed from a CUDA graph: ``sdpa-stacked`` (PyTorch's SDPA over exactly ``n`` slots, the
query reshaped to ``[1, H_kv, rep * Q, D]``), ``triton`` (the default launch plan, the mask read at every slot),
``triton:flat`` (the committed prefix passed as flat, the mask read only over the tree: the round's call) and
``triton:flat+2waves`` (twice the plan's chunks, ~256 programs: two waves on an H200). The ``GB/s`` column is the
K / V bytes of ``n`` slots over the ``flat`` time.

    python benchmarks/kernels/bench_tree_attention_long.py [--out bench_out/kernels]
"""

from __future__ import annotations

import torch
from _common import cuda_bench_args, report, time_call  # benchmarks/kernels, beside this script
from bench_tree_attention import tree_mask

from specdec.kernels.tree_attention.triton import split_plan, tree_attention_triton

HEADS, KV_HEADS, DIM, CACHE = 32, 8, 128, 40960
SPANS = [512, 32768]
ROWS = [1, 32, 64]
DTYPE = torch.bfloat16
SCALE = DIM**-0.5
VARIANTS = {
    "flat": {"flat": 1},  # the round's call: the committed prefix flat
    "flat+2waves": {"flat": 1, "chunks": 0},  # the former plan: ~256 programs (chunks doubled)
}


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    key, value = (torch.randn(1, KV_HEADS, CACHE, DIM, generator=gen).to(device=device, dtype=DTYPE) for _ in "kv")
    out = []
    for span in SPANS:
        lengths = torch.tensor([span], device=device, dtype=torch.int32)
        for rows in ROWS:
            query = torch.randn(1, HEADS, rows, DIM, generator=gen).to(device=device, dtype=DTYPE)
            full = torch.ones(1, 1, rows, CACHE, dtype=torch.bool)
            full[..., :span] = tree_mask(gen, rows, span)
            mask = full.to(device)
            additive = torch.zeros(1, 1, rows, span, dtype=DTYPE, device=device).masked_fill(
                ~mask[..., :span], torch.finfo(DTYPE).min
            )
            stacked_mask = additive.repeat(1, 1, HEADS // KV_HEADS, 1)

            def sdpa(q=query, m=stacked_mask, n=span, rows=rows):
                q = q.reshape(1, KV_HEADS, -1, DIM)
                o = torch.nn.functional.scaled_dot_product_attention(q, key[:, :, :n], value[:, :, :n], attn_mask=m)
                return o.reshape(1, HEADS, rows, DIM).transpose(1, 2).contiguous()

            row = {"S": span, "Q": rows}
            row["sdpa-stacked"] = time_call(sdpa, device, graph=True)[0]
            calls = {"triton": None, **{f"triton:{k}": v for k, v in VARIANTS.items()}}
            for name, plan in calls.items():
                try:
                    p = dict(plan or {})
                    if p.get("chunks") == 0:
                        p["chunks"] = 2 * split_plan(HEADS // KV_HEADS * rows, KV_HEADS, DIM)["chunks"]
                    f = torch.tensor([span - rows], device=device, dtype=torch.int32) if p.pop("flat", 0) else None
                    call = lambda q=query, m=mask, p=p, n=lengths, f=f: (  # noqa: E731
                        tree_attention_triton(q, key, value, m, SCALE, n, plan=p, flat=f)
                    )
                    row[name] = time_call(call, device, graph=True)[0]
                except Exception as err:  # a plan that does not fit the device (shared memory): nan
                    row[name] = float("nan")
                    print(f"{name} S={span} Q={rows}: {type(err).__name__}: {str(err)[:120]}")
            row["GB/s"] = 2 * KV_HEADS * span * DIM * 2 / (row["triton:flat"] * 1e-3) / 1e9
            out.append(row)
    return out


def main() -> None:
    args, device, name = cuda_bench_args(__doc__.splitlines()[0])
    print(f"tree_attention over long spans, bf16, median ms per call (graph replay) on {name}; warm")
    columns = ["S", "Q", "sdpa-stacked", "triton", *[f"triton:{k}" for k in VARIANTS], "GB/s"]
    report(run(device), columns, args.out, "tree_attention_long.csv", device)


if __name__ == "__main__":
    main()
