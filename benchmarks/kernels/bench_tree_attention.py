"""Speed of ``tree_attention``: a decode step or a draft tree over a static-cache span, grouped-query attention.

Shapes: the 8 B target's attention (H 32, H_kv 8, D 128) over a span of S = 1024 slots of a 1536-slot cache, the 8 B
Qwen3.5 hybrid's (H 16, H_kv 4, D 256) over the same, and the zoo target's (H 6, H_kv 2, D 64) over S = 512 of 768;
bf16, Q in {1, 16, 32, 64} query rows, a tree mask (the committed prefix plus each node's ancestors). Providers:
``hf-sdpa`` (HF's ``sdpa_attention_forward`` with an additive mask: K / V repeated per query head, as the model runs
it), ``sdpa-stacked`` (PyTorch's SDPA on the query reshaped to ``[1, H_kv, rep * Q, D]`` against unexpanded K / V,
the mask repeated ``rep`` times), ``reference`` (``tree_attention_reference``), ``triton`` (the split-KV kernel);
``-graph`` variants replay the call from a CUDA graph (GPU time without launch overhead). Only the eager torch
providers run without CUDA.

    python benchmarks/kernels/bench_tree_attention.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdec.kernels.tree_attention import tree_attention, tree_attention_reference
from specdec.trees import tree_attention_bias

BASE = ["hf-sdpa", "sdpa-stacked", "reference", "triton"]
PROVIDERS = [p for base in BASE for p in (base, f"{base}-graph")]
CPU_PROVIDERS = ("hf-sdpa", "sdpa-stacked", "reference")
ROWS = [1, 16, 32, 64]
# (name, H, H_kv, D, span S, cache slots)
SHAPES = [("8b", 32, 8, 128, 1024, 1536), ("8b-hybrid", 16, 4, 256, 1024, 1536), ("zoo", 6, 2, 64, 512, 768)]
DTYPE = torch.bfloat16


class _GroupedAttention(torch.nn.Module):
    """What HF's attention functions read from the attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def tree_mask(gen: torch.Generator, rows: int, slots: int) -> torch.Tensor:
    """``[1, 1, Q, S]`` bool: the prefix ``[0, S - Q)`` seen by all, node i at ``S - Q + i`` seeing its ancestors
    (a random tree; the library's ``tree_attention_bias``)."""
    parents = torch.tensor([-1] + [int(torch.randint(i, (1,), generator=gen)) for i in range(1, rows)])
    return tree_attention_bias(parents, slots - rows, dtype=torch.float32, device="cpu") == 0


def make_call(provider: str, query, key, value, mask, additive, scale):
    """A no-argument callable running one attention, or None when the provider does not apply to the device."""
    base = provider.removesuffix("-graph")
    if query.device.type != "cuda" and (provider.endswith("-graph") or base not in CPU_PROVIDERS):
        return None
    heads, rows, dim = query.shape[1:]
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    if base == "hf-sdpa":
        module = _GroupedAttention(rep)
        return lambda: sdpa_attention_forward(module, query, key, value, additive, scaling=scale)[0]
    if base == "sdpa-stacked":
        stacked_mask = additive.repeat(1, 1, rep, 1)  # row i * Q + q: query q of head g * rep + i

        def stacked():
            q = query.reshape(1, kv_heads, rep * rows, dim)
            out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=stacked_mask, scale=scale)
            return out.reshape(1, heads, rows, dim).transpose(1, 2).contiguous()

        return stacked
    if base == "reference":
        return lambda: tree_attention_reference(query, key, value, mask, scale)
    return lambda: tree_attention(query, key, value, mask, scale, impl="triton")


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    for name, heads, kv_heads, dim, slots, cache in SHAPES:
        buffers = [torch.randn(1, kv_heads, cache, dim, generator=gen).to(device=device, dtype=DTYPE) for _ in "kv"]
        key, value = (b[:, :, :slots] for b in buffers)  # a span of the static cache, as the verifier reads it
        for rows in ROWS:
            query = torch.randn(1, heads, rows, dim, generator=gen).to(device=device, dtype=DTYPE)
            mask = tree_mask(gen, rows, slots).to(device)
            additive = torch.zeros(mask.shape, dtype=DTYPE, device=device).masked_fill(~mask, torch.finfo(DTYPE).min)
            row = {"shape": name, "H": heads, "H_kv": kv_heads, "D": dim, "S": slots, "Q": rows}
            args = (query, key, value, mask, additive, dim**-0.5)
            time_providers(row, PROVIDERS, lambda p, a=args: make_call(p, *a), device)
            row["speedup vs hf (graph)"] = row["hf-sdpa-graph"] / row["triton-graph"]
            rows_out.append(row)
    return rows_out


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"tree_attention, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "H", "H_kv", "D", "S", "Q", *PROVIDERS, "speedup vs hf (graph)"]
    report(run(device), columns, args.out, "tree_attention.csv", device)


if __name__ == "__main__":
    main()
