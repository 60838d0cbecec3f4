"""The Gated DeltaNet adapter's per-node gates in one Triton launch (capture-safe: no host reads).

One program per node: its ``q`` and ``k`` heads as ``[heads, K]`` tiles of the post-conv row, each head's sum of
squares in fp32 and ``x * rsqrt(sum + 1e-6)`` (``q`` read once per value head, so the repeat over grouped value
heads is the store's indexing, then divided by ``sqrt(K)``), ``beta = sigmoid(b)`` rounded to ``b``'s dtype and
widened, and ``g = -exp(A_log) * softplus(a + dt_bias)`` with ``softplus(y) = y`` above 20 (as PyTorch's
threshold) and ``log1p(exp(y))`` below it (as ``log(u) * e / (u - 1)``, ``u = 1 + e``: ``log(1 + e)`` alone
would lose a small ``e``'s digits to the rounding of ``1 + e``). Replaces about 25 small launches of the
reference per Gated DeltaNet layer and forward. Equal to ``gdn_gates_reference`` up to the order of the fp32 sums
and the GPU's ``exp`` / ``log`` (``tests/kernels/test_gdn_gates.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import to_bf16

__all__ = ["gdn_gates_triton"]


@triton.jit
def _gdn_gates_kernel(
    x_ptr,  # [T, C] strided (a tree's post-conv rows are a transposed view)
    b_ptr,  # [T, HV] strided
    a_ptr,  # [T, HV] strided
    alog_ptr,  # [HV]
    dt_ptr,  # [HV]
    q_ptr,  # [T, HV, K] fp32 out
    k_ptr,  # [T, H, K] fp32 out
    beta_ptr,  # [T, HV] fp32 out
    g_ptr,  # [T, HV] fp32 out
    stride_x,
    stride_xc,
    stride_b,
    stride_bc,
    stride_a,
    stride_ac,
    H,
    HV,
    K,
    key_dim,
    scale,
    REP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    B_BF16: tl.constexpr,  # b is bf16: sigmoid rounded to bf16 (round to nearest even)
    B_HALF: tl.constexpr,  # b is fp16: rounded to fp16
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    row = x_ptr + t * stride_x
    # keys: one row per key head
    heads = tl.arange(0, BLOCK_H)
    mask = (heads < H)[:, None] & (cols < K)[None, :]
    kk = tl.load(row + (key_dim + heads[:, None] * K + cols[None, :]) * stride_xc, mask=mask, other=0.0)
    kk = kk.to(tl.float32)
    kk = kk * tl.rsqrt(tl.sum(kk * kk, axis=1) + 1e-6)[:, None]
    tl.store(k_ptr + t * H * K + heads[:, None] * K + cols[None, :], kk, mask=mask)
    # queries: one row per value head, read from its key head
    vheads = tl.arange(0, BLOCK_HV)
    inside = vheads < HV
    mask = inside[:, None] & (cols < K)[None, :]
    qq = tl.load(row + ((vheads // REP)[:, None] * K + cols[None, :]) * stride_xc, mask=mask, other=0.0)
    qq = qq.to(tl.float32)
    qq = qq * tl.rsqrt(tl.sum(qq * qq, axis=1) + 1e-6)[:, None]
    qq = tl.div_rn(qq, tl.full([BLOCK_HV, BLOCK_K], scale, tl.float32))
    tl.store(q_ptr + t * HV * K + vheads[:, None] * K + cols[None, :], qq, mask=mask)
    # write strengths and log decays
    bb = tl.load(b_ptr + t * stride_b + vheads * stride_bc, mask=inside, other=0.0).to(tl.float32)
    beta = 1.0 / (1.0 + tl.exp(-bb))
    if B_BF16:
        beta = to_bf16(beta).to(tl.float32)
    elif B_HALF:
        beta = beta.to(tl.float16).to(tl.float32)
    tl.store(beta_ptr + t * HV + vheads, beta, mask=inside)
    y = tl.load(a_ptr + t * stride_a + vheads * stride_ac, mask=inside, other=0.0).to(tl.float32)
    y = y + tl.load(dt_ptr + vheads, mask=inside, other=0.0).to(tl.float32)
    e = tl.exp(tl.minimum(y, 20.0))
    # log1p(e) as log(u) * e / (u - 1), u = 1 + e: the rounding of 1 + e cancels (log(1 + e) alone loses all of a
    # tiny e's digits); e itself where u rounds to 1
    u = 1.0 + e
    soft = tl.where(y > 20.0, y, tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0))))
    decay = tl.exp(tl.load(alog_ptr + vheads, mask=inside, other=0.0).to(tl.float32))
    tl.store(g_ptr + t * HV + vheads, -decay * soft, mask=inside)


def gdn_gates_triton(
    x: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``gdn_gates_reference`` in one launch (arguments as there, any strides; not checked here)."""
    total = x.shape[0]
    dev = x.device
    q = torch.empty(total, num_v_heads, head_k_dim, dtype=torch.float32, device=dev)
    k = torch.empty(total, num_k_heads, head_k_dim, dtype=torch.float32, device=dev)
    beta = torch.empty(total, num_v_heads, dtype=torch.float32, device=dev)
    g = torch.empty(total, num_v_heads, dtype=torch.float32, device=dev)
    if total == 0:
        return q, k, beta, g
    block_hv = triton.next_power_of_2(num_v_heads)
    block_k = triton.next_power_of_2(head_k_dim)
    _gdn_gates_kernel[(total,)](
        x, b, a, a_log, dt_bias, q, k, beta, g, *x.stride(), *b.stride(), *a.stride(), num_k_heads, num_v_heads,
        head_k_dim, num_k_heads * head_k_dim, float(head_k_dim**0.5), REP=num_v_heads // num_k_heads,
        BLOCK_H=triton.next_power_of_2(num_k_heads), BLOCK_HV=block_hv, BLOCK_K=block_k,
        B_BF16=b.dtype == torch.bfloat16, B_HALF=b.dtype == torch.float16,
        num_warps=4 if block_hv * block_k >= 2048 else 1,
    )  # fmt: skip
    return q, k, beta, g
