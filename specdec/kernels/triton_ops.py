"""Triton device functions shared by several kernels (imported only by ``specdec/kernels/*/triton.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["FLOAT_KIND", "dot_fp32", "round_to", "to_bf16"]


@triton.jit
def to_bf16(x):
    """fp32 -> bf16, round to nearest even (NaN stays a quiet NaN)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    high = tl.where(x != x, (bits >> 16) | 0x40, rounded)
    return high.to(tl.uint16).to(tl.bfloat16, bitcast=True)


FLOAT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The ``KIND`` code of a dtype for :func:`round_to`."""


@triton.jit
def round_to(x, KIND: tl.constexpr):
    """fp32 ``x`` rounded to bf16 (KIND 1, round to nearest even), fp16 (KIND 2) or kept (KIND 0), widened back to
    fp32: the value a tensor of that dtype would hold."""
    if KIND == 1:
        x = to_bf16(x).to(tl.float32)
    elif KIND == 2:
        x = x.to(tl.float16).to(tl.float32)
    return x


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
