"""Triton device functions shared by several kernels (imported only by ``specdec/kernels/*/triton.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["FLOAT_KIND", "UNIFORM_GRID", "UNIFORM_TOP", "dot_fp32", "load_k_tile", "pair_strides", "round_to",
           "to_bf16", "uniforms_at"]  # fmt: skip

UNIFORM_GRID = 2.0**-24
"""The spacing of ``torch.rand``'s float32 uniforms: a float64 uniform is ``a + b * UNIFORM_GRID`` of a float32 pair."""
UNIFORM_TOP = 1.0 - 2.0**-52
"""The float64 uniforms' bound (``specdec.verify.draws.uniforms``)."""


def pair_strides(u: torch.Tensor) -> tuple[int, int, int]:
    """The row, slot and pair strides of uniforms ``u``: ``[B, S]`` float64 (pair stride 0, unread) or ``[B, S, 2]``
    float32 halves."""
    return (*u.stride(), 0) if u.dim() == 2 else tuple(u.stride())


@triton.jit
def uniforms_at(ptr, pair_stride, mask, PAIR: tl.constexpr, GRID: tl.constexpr, TOP: tl.constexpr):
    """Float64 uniforms at ``ptr`` (near 1 where masked): as stored, or (``PAIR``) made of their float32 halves
    ``a + b·2⁻²⁴`` (exact in float64) kept below 1, as ``specdec.verify.draws.uniforms`` makes them."""
    if PAIR:
        first = tl.load(ptr, mask=mask, other=1.0).to(tl.float64)
        second = tl.load(ptr + pair_stride, mask=mask, other=0.0).to(tl.float64)
        u = tl.minimum(first + second * GRID, TOP)
    else:
        u = tl.load(ptr, mask=mask, other=1.0)
    return u


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


@triton.jit
def load_k_tile(rows_ptr, ks, stride_k, ok, end, EVEN_K: tl.constexpr, K_FIRST: tl.constexpr):
    """One ``K`` tile of a skinny product's operand: ``rows_ptr`` holds a pointer per row (``x``) or column (the
    weight), ``ks`` the tile's int64 ``K`` indices, ``ok`` which rows / columns exist; ``[len(rows), BLOCK_K]``, or
    ``[BLOCK_K, len(cols)]`` with ``K_FIRST`` (a weight tile laid out for ``x @ W^T``). Past ``end`` (unless
    ``EVEN_K``) and outside ``ok`` it reads 0."""
    if K_FIRST:
        ptrs = rows_ptr + ks[:, None] * stride_k
        if EVEN_K:
            tile = tl.load(ptrs, mask=ok[None, :], other=0.0)
        else:
            tile = tl.load(ptrs, mask=(ks < end)[:, None] & ok[None, :], other=0.0)
    else:
        ptrs = rows_ptr + ks[None, :] * stride_k
        if EVEN_K:
            tile = tl.load(ptrs, mask=ok[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=ok[:, None] & (ks < end)[None, :], other=0.0)
    return tile
