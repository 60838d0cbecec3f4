"""HF's top-k warper in one Triton launch (capture-safe: no host reads, no allocation that depends on values).

One program per row, the row in registers (``BLOCK = next_power_of_2(V)``). Each fp32 value maps to an unsigned key in
value order: a negative float to minus its magnitude bits (so -0.0 meets +0.0, as in ``ddtree_build``'s
``topk_rows_reference``), then offset by ``2**31``; -inf is the smallest real key, the padding lanes get key 0 and are
left out of every count, minimum and maximum.

The ``K``-th largest key ``t`` is found by narrowing a bracket ``[lo, hi)`` with ``count(keys >= lo) >= K >
count(keys >= hi)``, from ``[min, max + 1)`` (one reduction). Each step takes a candidate ``c`` inside the bracket and,
in one reduction, the number of keys ``>= c``, the smallest key ``>= c`` and the largest key ``< c``; then ``lo``
becomes that smallest key (where the count is ``>= K``) or ``hi`` that largest key plus one (where it is not), so both
ends sit on keys of the row. The search ends when ``count(keys >= lo) == K`` or the bracket holds one key: ``t = lo``.
The candidates are the bracket's midpoint (at most 32 halvings) or, with ``INTERPOLATE``, alternately the point where
the counts at the two ends, spread evenly over the bracket, would give ``K`` and the midpoint. The row is read again
(from cache) and every value whose key is below ``t`` becomes ``fill``; ties with the ``K``-th value are kept, as HF
keeps every value ``>= topk(...)[0][..., -1]``.

Launch plan, from graph-replayed timings of 16 rows on an H100 (``benchmarks/kernels/bench_topk_mask.py --plans``):
interpolated candidates on rows of up to 8192 entries (fewer steps), midpoints past that (interpolation's steps cost
more there on some rows than they save); 2 to 8 warps. One tuple reduction per step instead of three separate ones
measured no faster.

Triton features relied on (present in Triton 3.6 and 3.9): a ``while`` loop on a scalar condition, bitcasts between
fp32, int32 and uint32, unsigned compares, ``tl.sum`` / ``tl.min`` / ``tl.max``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["INTERPOLATE_MAX_BLOCK", "topk_mask_triton"]

INTERPOLATE_MAX_BLOCK = 8192
"""Rows of up to this many entries (padded) take interpolated candidates by default, longer ones midpoints."""


@triton.jit
def _topk_mask_kernel(
    x_ptr,  # [R, V] fp32, rows stride_x apart, the last dim contiguous
    out_ptr,  # [R, V] fp32 contiguous
    V,
    stride_x,
    K,  # 1 <= K <= V
    fill,  # fp32 filter value
    BLOCK: tl.constexpr,
    INTERPOLATE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < V
    bits = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # value order; -0.0 and +0.0 both 0
    ukey = key.to(tl.uint32, bitcast=True) ^ 0x80000000  # unsigned order: -inf -> 0x00800000
    ukey = tl.where(inside, ukey, tl.zeros_like(ukey))  # padding: 0, below every real key
    top = tl.full([BLOCK], 0xFFFFFFFF, tl.uint32)
    low = tl.zeros([BLOCK], dtype=tl.uint32)
    first = tl.min(tl.where(inside, ukey, top), axis=0)
    last = tl.max(ukey, axis=0)
    lo = first.to(tl.int64)
    n_lo = tl.zeros([], dtype=tl.int64) + V  # count(keys >= lo) = V >= K
    hi = last.to(tl.int64) + 1
    n_hi = tl.zeros([], dtype=tl.int64)  # count(keys >= hi) = 0 < K
    step = tl.zeros([], dtype=tl.int32)
    while (n_lo != K) & (hi - lo > 1):
        mid = lo + (hi - lo) // 2
        if INTERPOLATE:
            share = (n_lo - K).to(tl.float32) + 0.5
            guess = lo + ((hi - lo).to(tl.float32) * (share / (n_lo - n_hi).to(tl.float32))).to(tl.int64)
            guess = tl.minimum(tl.maximum(guess, lo + 1), hi - 1)
            cand = tl.where(step % 2 == 0, guess, mid)
        else:
            cand = mid
        at = ukey >= cand.to(tl.uint32)
        n = tl.sum(at.to(tl.int32), axis=0)  # count(keys >= cand)
        above = tl.min(tl.where(at, ukey, top), axis=0)  # the smallest key >= cand
        below = tl.max(tl.where(at, low, ukey), axis=0)  # the largest key < cand (padding: 0, never the largest)
        keep = n >= K
        lo = tl.where(keep, above.to(tl.int64), lo)
        n_lo = tl.where(keep, n.to(tl.int64), n_lo)
        hi = tl.where(keep, hi, below.to(tl.int64) + 1)
        n_hi = tl.where(keep, n_hi, n.to(tl.int64))
        step += 1
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0)  # the values as they are (-0.0 stays)
    tl.store(out_ptr + row * V + cols, tl.where(ukey < lo.to(tl.uint32), fill, x), mask=inside)


def _num_warps(block: int) -> int:
    return max(2, min(8, block // 1024))


def topk_mask_triton(scores: torch.Tensor, k: int, filter_value: float = float("-inf"), *,
                     interpolate: bool | None = None, num_warps: int | None = None) -> torch.Tensor:  # fmt: skip
    """``topk_mask_reference(scores, k, filter_value)`` in one launch: fp32 ``scores [..., V]`` with a contiguous last
    dim, ``V <= MAX_VOCAB`` of the package, ``1 <= k < V`` (not checked here). Returns a new contiguous tensor of
    ``scores``'s shape. ``interpolate`` (the search's candidates; None: up to ``INTERPOLATE_MAX_BLOCK``) and
    ``num_warps``: the launch plan (tests and benchmarks)."""
    width = scores.shape[-1]
    rows = scores.reshape(-1, width)
    out = torch.empty(scores.shape, dtype=scores.dtype, device=scores.device)
    if rows.shape[0] == 0:
        return out
    block = triton.next_power_of_2(width)
    interpolate = block <= INTERPOLATE_MAX_BLOCK if interpolate is None else interpolate
    _topk_mask_kernel[(rows.shape[0],)](
        rows, out, width, rows.stride(0), k, filter_value, BLOCK=block, INTERPOLATE=interpolate,
        num_warps=_num_warps(block) if num_warps is None else num_warps,
    )  # fmt: skip
    return out
