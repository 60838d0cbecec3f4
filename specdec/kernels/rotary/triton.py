"""HF's rotary embedding of the queries and keys in one Triton launch (capture-safe: no host reads).

A program per (sequence, position, head of ``H + H_kv``): it loads the head's row of ``D`` values and the
position's ``cos`` / ``sin`` rows, and writes ``x * cos + rotate_half(x) * sin`` (partial rotary: over the first
``R`` dims, the rest copied) with each product and the sum
rounded to the inputs' dtype as PyTorch's separate kernels round them (a product of two bf16 values is
exact in fp32; the roundings are explicit, so no fused multiply-add can change a result): equal to
``rotary_reference`` bit for bit. Half dtypes only (bf16, fp16): fp32 would need products rounded without
contraction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import to_bf16

__all__ = ["rotary_triton"]


@triton.jit
def _round(x, BF16: tl.constexpr):
    """fp32 -> the half dtype and back, rounding to nearest even."""
    if BF16:
        return to_bf16(x).to(tl.float32)
    return x.to(tl.float16).to(tl.float32)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    N, H, HK,
    sqb, sqh, sqn, skb, skh, skn,  # input strides (the last dim contiguous)
    sob, soh, son, skob, skoh, skon,  # output strides
    scb, scn, ssb, ssn,  # cos / sin strides (batch stride 0 when shared)
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    BF16: tl.constexpr,
    PASS: tl.constexpr,  # dims past the rotated ones (partial rotary), copied unchanged
    BLOCK_PASS: tl.constexpr,
):
    pid = tl.program_id(0)  # (b * N + n) * (H + HK) + head
    heads = H + HK
    head = pid % heads
    bn = pid // heads
    n = (bn % N).to(tl.int64)
    b = (bn // N).to(tl.int64)
    i = tl.arange(0, BLOCK)
    ok = i < HALF
    c1 = tl.load(cos_ptr + b * scb + n * scn + i, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + b * scb + n * scn + HALF + i, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + b * ssb + n * ssn + i, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + b * ssb + n * ssn + HALF + i, mask=ok, other=0.0).to(tl.float32)
    is_q = head < H
    kh = (head - H).to(tl.int64)
    head = head.to(tl.int64)
    src = tl.where(is_q, q_ptr + b * sqb + head * sqh + n * sqn, k_ptr + b * skb + kh * skh + n * skn)
    dst = tl.where(is_q, qo_ptr + b * sob + head * soh + n * son, ko_ptr + b * skob + kh * skoh + n * skon)
    x1 = tl.load(src + i, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=ok, other=0.0).to(tl.float32)
    # first half: x1 * c1 + (-x2) * s1; second half: x2 * c2 + x1 * s2 (rotate_half = cat(-x2, x1))
    y1 = _round(_round(x1 * c1, BF16) + _round(-x2 * s1, BF16), BF16)
    y2 = _round(_round(x2 * c2, BF16) + _round(x1 * s2, BF16), BF16)
    tl.store(dst + i, y1.to(qo_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + HALF + i, y2.to(qo_ptr.dtype.element_ty), mask=ok)
    if PASS > 0:
        j = tl.arange(0, BLOCK_PASS)
        rest = tl.load(src + 2 * HALF + j, mask=j < PASS, other=0.0)
        tl.store(dst + 2 * HALF + j, rest, mask=j < PASS)


def rotary_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Arguments as ``rotary_reference`` (not checked here: bf16 (fp16 compiles too), ``D`` and ``R`` even, last
    dims contiguous).
    Returns outputs laid out as the inputs (``torch.empty_like``)."""
    batch, heads, num, dim = q.shape
    kv_heads = k.shape[1]
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0:
        return q_out, k_out
    half = cos.shape[-1] // 2  # the rotated dims' half (partial rotary: fewer than the head's)
    rest = dim - 2 * half
    scb = cos.stride(0) if cos.shape[0] > 1 else 0
    ssb = sin.stride(0) if sin.shape[0] > 1 else 0
    _rotary_kernel[(batch * num * (heads + kv_heads),)](
        q, k, cos, sin, q_out, k_out, num, heads, kv_heads,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        scb, cos.stride(1), ssb, sin.stride(1),
        HALF=half, BLOCK=triton.next_power_of_2(half), BF16=q.dtype == torch.bfloat16, PASS=rest,
        BLOCK_PASS=triton.next_power_of_2(max(rest, 1)), num_warps=1,
    )  # fmt: skip
    return q_out, k_out
