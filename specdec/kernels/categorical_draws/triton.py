"""``m`` inverse-CDF draws per row in one Triton launch (capture-safe: no host reads, the launch plan from shapes).

A program per row ``(b, l)`` makes its ``m`` float64 uniforms from the float32 pairs of ``noise`` (``a + b·2⁻²⁴``, exact
in float64, kept below 1 as ``uniforms`` does), then runs the row's float64 cumulative sum twice over blocks of the
vocabulary in one order: the first run gives the total ``T`` (the last running value, so the second run's last value
is ``T`` exactly and every ``u·T`` falls inside), the second counts, for every draw at once, the entries whose running
sum is ``<= u·T`` (``searchsorted(..., right=True)``): the drawn token. A token of probability 0 is never drawn.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import UNIFORM_GRID, UNIFORM_TOP

__all__ = ["categorical_draws_triton"]


@triton.jit
def _draws_kernel(
    probs_ptr,  # [B, L, V] float32 / float64, the last dim contiguous
    noise_ptr,  # [B, L, >= 2 * NUM] float32, the last dim contiguous
    out_ptr,  # [B, L, NUM] int64 contiguous
    L,
    V,
    NUM,
    stride_pb,
    stride_pl,
    stride_nb,
    stride_nl,
    GRID: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    b = r // L
    lvl = r % L
    row = probs_ptr + b * stride_pb + lvl * stride_pl
    lanes = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < V, other=0.0).to(tl.float64)
        total = tl.max(total + tl.cumsum(x, 0), axis=0)  # the block's last running value (non-decreasing)
    j = tl.arange(0, BLOCK_N)
    wanted = j < NUM
    pairs = noise_ptr + b * stride_nb + lvl * stride_nl + 2 * j
    first = tl.load(pairs, mask=wanted, other=0.0).to(tl.float64)
    second = tl.load(pairs + 1, mask=wanted, other=0.0).to(tl.float64)
    at = tl.minimum(first + second * GRID, TOP) * total
    running = tl.zeros([], dtype=tl.float64)
    drawn = tl.zeros([BLOCK_N], dtype=tl.int64)
    for start in range(0, V, BLOCK_V):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < V, other=0.0).to(tl.float64)
        cdf = running + tl.cumsum(x, 0)
        below = (cdf[None, :] <= at[:, None]) & (cols < V)[None, :]
        drawn += tl.sum(below.to(tl.int64), axis=1)
        running = tl.max(cdf, axis=0)
    tl.store(out_ptr + r * NUM + j, drawn, mask=wanted)


def categorical_draws_triton(probs: torch.Tensor, noise: torch.Tensor, num: int, *, block: int | None = None
                             ) -> torch.Tensor:  # fmt: skip
    """``categorical_draws_reference(probs, noise, num)`` in one launch (arguments checked by the package's entry).
    ``block``: vocabulary entries per block (a power of two; default ``min(1024, next_power_of_2(V))``)."""
    batch, length, vocab = probs.shape
    out = torch.empty((batch, length, num), dtype=torch.long, device=probs.device)
    if batch * length == 0:
        return out
    block = min(1024, triton.next_power_of_2(vocab)) if block is None else block
    if block < 1 or block & (block - 1):
        raise ValueError(f"block={block!r}: pass a power of two.")
    _draws_kernel[(batch * length,)](
        probs, noise, out, length, vocab, num, probs.stride(0), probs.stride(1), noise.stride(0), noise.stride(1),
        GRID=UNIFORM_GRID, TOP=UNIFORM_TOP, BLOCK_V=block, BLOCK_N=max(2, triton.next_power_of_2(num)),
        num_warps=4 if block >= 512 else 2,
    )  # fmt: skip
    return out
