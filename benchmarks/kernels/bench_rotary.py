"""Speed of ``rotary``: HF's ``apply_rotary_pos_emb`` (its ~10 elementwise launches for q and k) vs one Triton launch.

Shapes: the Qwen3-8B attention (32 query and 8 key heads of 128) at 1, 16, 32 and 64 positions (a decode step and
verify trees), the zoo target's (6 and 2 heads of 64) and a Qwen3.5-style layer with partial rotary (16 and 2
heads of 256, the first 64 dims rotated; HF's function is Qwen3-Next's there), bf16, q / k as ``[B, H, N, D]``
views of ``[B, N, H, D]`` projections as the attention layers pass them. Providers: ``hf`` (HF's function, eager
launches), ``hf-graph`` (replayed from a CUDA graph: GPU time without launch overhead), ``triton`` and
``triton-graph``; all but ``hf`` need CUDA.

    python benchmarks/kernels/bench_rotary.py [--device cuda] [--out bench_out/kernels]

Prints a table of median ms per call (20th / 80th percentiles in the CSV) and writes it under ``--out``.
"""

from __future__ import annotations

import torch
import transformers.models.qwen3.modeling_qwen3 as qwen3
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from _common import bench_args, report, time_providers  # benchmarks/kernels, beside this script

from specdec.kernels.rotary import rotary

PROVIDERS = ["hf", "hf-graph", "triton", "triton-graph"]
# (name, H, H_kv, D, rotated dims R)
SHAPES = [("8b", 32, 8, 128, 128), ("zoo", 6, 2, 64, 64), ("qwen3.5 partial", 16, 2, 256, 64)]
POSITIONS = [1, 16, 32, 64]


def make_call(provider: str, q, k, cos, sin):
    """A no-argument callable running one rotary embedding, or None when the provider does not apply."""
    if provider != "hf" and q.device.type != "cuda":
        return None
    if provider.startswith("hf"):
        module = qwen3 if cos.shape[-1] == q.shape[-1] else qwen3_next  # Qwen3-Next's takes partial rotary
        return lambda: module.apply_rotary_pos_emb(q, k, cos, sin)
    return lambda: rotary(q, k, cos, sin, impl="triton")


def run(device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, heads, kv_heads, dim, rotated in SHAPES:
        for num in POSITIONS:
            q = torch.randn(1, num, heads, dim, generator=gen).to(device=device, dtype=torch.bfloat16).transpose(1, 2)
            k = torch.randn(1, num, kv_heads, dim, generator=gen).to(device=device, dtype=torch.bfloat16)
            k = k.transpose(1, 2)
            angle = torch.rand(1, num, rotated // 2, generator=gen) * 1000
            angle = torch.cat([angle, angle], dim=-1).to(device)
            cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
            row = {"shape": name, "H": heads, "H_kv": kv_heads, "D": dim, "R": rotated, "N": num}
            time_providers(row, PROVIDERS, lambda p, a=(q, k, cos, sin): make_call(p, *a), device)
            if row.get("triton-graph"):
                row["graph speedup"] = row["hf-graph"] / row["triton-graph"]
            rows.append(row)
    return rows


def main() -> None:
    args, device, name = bench_args(__doc__.splitlines()[0])
    print(f"rotary, bf16, median ms per call on {name} (torch {torch.__version__}); warm")
    columns = ["shape", "H", "H_kv", "D", "R", "N", *PROVIDERS, "graph speedup"]
    report(run(device), columns, args.out, "rotary.csv", device)


if __name__ == "__main__":
    main()
