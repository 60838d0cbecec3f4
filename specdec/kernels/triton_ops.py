"""Triton device functions shared by several kernels (imported only by ``specdec/kernels/*/triton.py``)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["dot_fp32", "to_bf16"]


@triton.jit
def to_bf16(x):
    """fp32 -> bf16, round to nearest even (NaN stays a quiet NaN)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    high = tl.where(x != x, (bits >> 16) | 0x40, rounded)
    return high.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def dot_fp32(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in fp32: IEEE for fp32 inputs; ``UPCAST``: bf16 operands widened to fp32 first (exact
    products, so the same sums), because Triton's interpreter multiplies bf16 tiles as raw integers."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out
