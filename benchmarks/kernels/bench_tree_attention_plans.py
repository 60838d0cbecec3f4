"""``tree_attention`` launch plans side by side at the round's own shapes: which rows per program, tile and warps
serve short spans (the zoo pair's few hundred slots) and long ones.

Shapes: the zoo target's attention (H 6, H_kv 2, D 64) over ``n`` in {256, 512} committed slots, the 8 B target's (H
32, H_kv 8, D 128) over {512, 8 k, 32 k} and the 8 B hybrid's (H 16, H_kv 4, D 256) over {512, 16 k}; bf16, Q in {1,
16, 32} query rows under a tree mask with the committed prefix passed flat (the round's call), each call replayed
from a CUDA graph. Columns: ``default`` (``split_plan``), then one column per override of ``BLOCK_M`` (rows per
program), ``BLOCK_N`` (slots per tile), ``num_warps``, ``chunks`` (``c*``: the programs a length is split over),
``COMBINE_ROWS`` (``r*``: rows per combine program), ``STAGES`` (``s*``) and ``FULL_TILES`` (``ft0``: the flat
prefix's whole tiles with the length checks of a partial tile, the plan before it); ``best`` names the fastest.
``--plans`` / ``--shapes`` pick columns and shapes (by name, e.g. ``--plans c4 c8 --shapes 8b hyb``); each row is
printed as it completes.

    python benchmarks/kernels/bench_tree_attention_plans.py [--plans ...] [--shapes ...] [--out bench_out/kernels]
"""

from __future__ import annotations

import torch
from _common import cuda_bench_args, report, time_call  # benchmarks/kernels, beside this script
from bench_tree_attention import tree_mask

from specdec.kernels.tree_attention.triton import tree_attention_triton

# (name, H, H_kv, D, committed slots)
SHAPES = [("zoo", 6, 2, 64, 256), ("zoo", 6, 2, 64, 512), ("8b", 32, 8, 128, 512), ("8b", 32, 8, 128, 8192),
          ("8b", 32, 8, 128, 32768), ("hyb", 16, 4, 256, 512), ("hyb", 16, 4, 256, 16384)]  # fmt: skip
ROWS = [1, 16, 32]
DTYPE = torch.bfloat16
PLANS = {
    "m16": {"BLOCK_M": 16},
    "m32": {"BLOCK_M": 32},
    "m64": {"BLOCK_M": 64},
    "n32": {"BLOCK_N": 32},
    "m32n32": {"BLOCK_M": 32, "BLOCK_N": 32},
    "m16n32": {"BLOCK_M": 16, "BLOCK_N": 32},
    "w4": {"num_warps": 4},
    "m32w2": {"BLOCK_M": 32, "num_warps": 2},
    "m16w2": {"BLOCK_M": 16, "num_warps": 2},
    "c4": {"chunks": 4},
    "c8": {"chunks": 8},
    "c32": {"chunks": 32},
    "r2": {"COMBINE_ROWS": 2},
    "r4": {"COMBINE_ROWS": 4},
    "r8": {"COMBINE_ROWS": 8},
    "ft0": {"FULL_TILES": 0},
    "s2": {"STAGES": 2},
    "s4": {"STAGES": 4},
}


def run(device: torch.device, plans: dict, shapes: list) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for name, heads, kv_heads, dim, span in shapes:
        cache = span + 128
        key, value = (torch.randn(1, kv_heads, cache, dim, generator=gen).to(device=device, dtype=DTYPE) for _ in "kv")
        for rows in ROWS:
            total = span + rows
            lengths = torch.tensor([total], device=device, dtype=torch.int64)
            flat = torch.tensor([span], device=device, dtype=torch.int64)
            query = torch.randn(1, heads, rows, dim, generator=gen).to(device=device, dtype=DTYPE)
            full = torch.zeros(1, 1, rows, cache, dtype=torch.bool)
            full[..., :total] = tree_mask(gen, rows, total)
            mask = full.to(device)
            scale = dim**-0.5
            row = {"shape": name, "S": span, "Q": rows}
            expected = None
            for label, plan in {"default": None, **plans}.items():
                call = lambda q=query, k=key, v=value, m=mask, s=scale, p=plan, n=lengths, f=flat: (  # noqa: E731
                    tree_attention_triton(q, k, v, m, s, n, plan=p, flat=f)
                )
                try:
                    got = call()
                    if expected is None:
                        expected = got
                    elif not torch.allclose(got.float(), expected.float(), atol=2e-2, rtol=2e-2):
                        raise AssertionError("output differs from the default plan's")
                    row[label] = time_call(call, device, graph=True)[0]
                except Exception as err:  # a plan the device cannot run (shared memory) or whose output differs: nan
                    row[label] = float("nan")
                    print(f"{label} {name} S={span} Q={rows}: {type(err).__name__}: {str(err)[:120]}")
            timed = {k: v for k, v in row.items() if k in plans or k == "default"}
            row["best"] = min((v, k) for k, v in timed.items() if v == v)[1]
            out.append(row)
            print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return out


def _options(parser) -> None:
    parser.add_argument("--plans", nargs="*", default=list(PLANS), choices=list(PLANS), help="columns to time")
    parser.add_argument("--shapes", nargs="*", default=["zoo", "8b", "hyb"], choices=["zoo", "8b", "hyb"])


def main() -> None:
    args, device, name = cuda_bench_args(__doc__.splitlines()[0], _options)
    print(f"tree_attention launch plans, bf16, median ms per call (graph replay) on {name}; warm")
    plans = {k: PLANS[k] for k in args.plans}
    shapes = [s for s in SHAPES if s[0] in args.shapes]
    columns = ["shape", "S", "Q", "default", *plans, "best"]
    report(run(device, plans, shapes), columns, args.out, "tree_attention_plans.csv", device)


if __name__ == "__main__":
    main()
