"""Split-K matrix multiply of a few rows by a large weight, ``y = x @ W^T (+ bias)``, in one or two launches
(capture-safe: no host reads, the launch plan comes from shapes and the device's SM count alone).

Tiles. ``x`` is ``[M, K]`` with ``M <= 64`` rows, held in one row block of ``BLOCK_M`` rows (``M`` rounded up to a
power of two, at least 16 so that ``tl.dot`` applies). The weight ``[N, K]`` is cut into column blocks of
``BLOCK_N`` output features and the ``K`` axis into tiles of ``BLOCK_K``.

Split. A grid over the column blocks alone is too small for a skinny call (``N = 4096`` in blocks of 64 is 64
programs for an H200's 132 SMs), and the call is bound by reading the weight once, so the ``K`` tiles are dealt out
to ``SPLIT_K`` programs per column block: split ``s`` covers tiles ``[s * TILES, (s + 1) * TILES)`` (the last
split may hold fewer, the last tile may be partial; every split holds at least one). ``_split_kernel`` runs on a
grid ``(column blocks, SPLIT_K)``; each program accumulates its tiles' ``tl.dot`` in fp32 and writes its partial
``[M, BLOCK_N]`` to an fp32 workspace ``[SPLIT_K, M, N]``. ``SPLIT_K`` aims at about ``_TARGET_PER_SM`` programs per
SM, with a floor on the ``K`` span of a split so that the workspace traffic stays at most half the weight's; it is
1 when the column blocks alone give ``_ENOUGH_PER_SM`` programs per SM (e.g. the lm_head), and then the kernel
adds the bias and writes the output itself.

Reduce. ``_reduce_kernel`` runs one program per ``BLOCK_R`` output elements and sums the ``SPLIT_K`` partials in
split order (deterministic: no atomics), adds the bias in fp32 and rounds to the output dtype (bf16 with integer
round-to-nearest-even: Triton's interpreter truncates a float32 -> bfloat16 cast).

Precision. fp32 accumulation throughout; fp32 inputs use IEEE dots (no TF32). Under Triton's interpreter bf16 tiles
are widened to fp32 before the dot (the interpreter multiplies bf16 tiles as raw integers); the products of bf16
values are exact in fp32, so the sums are the same.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specdec.kernels._triton import device_property
from specdec.kernels.triton_ops import dot_fp32, load_k_tile, to_bf16

__all__ = ["MAX_ROWS", "block_plan", "block_span", "k_split", "skinny_linear_triton", "split_plan", "split_product"]

MAX_ROWS = 64
"""The most rows ``M`` one call takes (one row block)."""

_ENOUGH_PER_SM = 2
"""Column blocks per SM at which the ``K`` axis is not split."""

_TARGET_PER_SM = 3
"""Programs per SM a split call aims at."""

_WORKSPACE_SHARE = 2
"""A split's weight bytes are at least this many times its workspace bytes (written and read back)."""

_STAGE_BUDGET = 160 * 1024
"""Shared memory for the pipelined x / weight tiles (an H200 has 227 KiB per SM)."""

_INTERPRETER_SMS = 8
"""The SM count planned for off CUDA (Triton's interpreter): a few splits, small grids."""


@triton.jit
def block_span(x_ptr, M, N, K, block, split, stride_xm, TILES: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """A program's share of a skinny product: its rows and column block ``block``'s columns (and which exist), a
    pointer per row of ``x`` and split ``split``'s ``K`` range ``[start, end)``."""
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    start = split * (TILES * BLOCK_K)
    end = tl.minimum(start + TILES * BLOCK_K, K)
    return rows, row_ok, cols, col_ok, x_rows, start, end


@triton.jit
def split_product(
    x_ptr, w_ptr, M, N, K, block, split, stride_xm, stride_xk, stride_wn, stride_wk,
    TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Column block ``block``'s fp32 partial ``x @ W^T`` over split ``split``'s ``K`` tiles (``[BLOCK_M,
    BLOCK_N]``), with the block's row and column indices and which of them exist."""
    rows, row_ok, cols, col_ok, x_rows, start, end = block_span(
        x_ptr, M, N, K, block, split, stride_xm, TILES, BLOCK_M, BLOCK_N, BLOCK_K
    )
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(start, end, BLOCK_K):
        ks = (k0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        x = load_k_tile(x_rows, ks, stride_xk, row_ok, end, EVEN_K, False)
        w = load_k_tile(w_cols, ks, stride_wk, col_ok, end, EVEN_K, True)
        acc += dot_fp32(x, w, IEEE, UPCAST)  # [BLOCK_M, BLOCK_K] @ [BLOCK_K, BLOCK_N]: the W^T tile
    return acc, rows, row_ok, cols, col_ok


@triton.jit
def _split_kernel(
    x_ptr,  # [M, K], strides (stride_xm, stride_xk)
    w_ptr,  # [N, K], strides (stride_wn, stride_wk)
    b_ptr,  # [N] bias (read only when HAS_BIAS and DIRECT)
    dst_ptr,  # DIRECT: the output [M, N] contiguous; else the fp32 workspace [SPLIT_K, M, N] contiguous
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    TILES: tl.constexpr,  # K tiles per split
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask
    DIRECT: tl.constexpr,  # SPLIT_K == 1: add the bias, round and store the output here
    HAS_BIAS: tl.constexpr,
    OUT_BF16: tl.constexpr,  # DIRECT into bf16: round with _to_bf16
    IEEE: tl.constexpr,  # fp32 inputs: IEEE dots
    UPCAST: tl.constexpr,  # bf16 under the interpreter: dots on operands widened to fp32 (see _dot)
):
    block = tl.program_id(0)
    split = tl.program_id(1)
    acc, rows, row_ok, cols, col_ok = split_product(
        x_ptr, w_ptr, M, N, K, block, split, stride_xm, stride_xk, stride_wn, stride_wk,
        TILES, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, UPCAST,
    )  # fmt: skip

    ok = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if DIRECT:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out = to_bf16(acc) if OUT_BF16 else acc.to(dst_ptr.dtype.element_ty)
        tl.store(dst_ptr + offs, out, mask=ok)
    else:
        tl.store(dst_ptr + split.to(tl.int64) * M * N + offs, acc, mask=ok)


@triton.jit
def _reduce_kernel(
    ws_ptr,  # [SPLIT_K, M, N] fp32
    b_ptr,  # [N] (read only when HAS_BIAS)
    out_ptr,  # [M, N] contiguous
    MN,
    N,
    SPLIT_K,
    BLOCK_R: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    idx = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = idx < MN
    acc = tl.zeros([BLOCK_R], tl.float32)
    parts = ws_ptr + idx
    for _ in range(0, SPLIT_K):  # in split order: the same sum on every run
        acc += tl.load(parts, mask=ok, other=0.0)
        parts += MN  # 64-bit pointer arithmetic: no int32 overflow of s * M * N
    if HAS_BIAS:
        acc += tl.load(b_ptr + idx % N, mask=ok, other=0.0).to(tl.float32)
    out = to_bf16(acc) if OUT_BF16 else acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + idx, out, mask=ok)


def split_plan(m: int, n: int, k: int, sm_count: int, *, itemsize: int = 2, block_k: int | None = None) -> dict:
    """The launch plan of a call from shapes only: ``M`` rows, ``N`` output features, ``K`` input features, the
    device's SM count and the element size of ``x`` / the weight.

    Args:
        block_k (int | None): the ``K`` tile (a power of two >= 16) instead of the default: 128 (64 for 4-byte
            elements), smaller when ``K`` is.

    Returns:
        dict: ``BLOCK_M`` (16-64), ``BLOCK_N`` (64; 128 when ``N`` alone gives enough programs), ``BLOCK_K``,
        ``n_blocks`` (``cdiv(N, BLOCK_N)``), ``k_tiles`` (``cdiv(K, BLOCK_K)``), ``SPLIT_K`` and ``TILES`` (``K``
        tiles per split: ``SPLIT_K = cdiv(k_tiles, TILES)``, so every split holds at least one tile and together
        they cover ``K`` once), ``programs`` (``n_blocks * SPLIT_K``), ``STAGES`` and ``num_warps``.
    """
    if not 0 <= m <= MAX_ROWS:
        raise ValueError(f"split_plan takes 0 <= M <= {MAX_ROWS} rows; got {m}.")
    plan = block_plan(m, [n], k, sm_count, itemsize=itemsize, block_k=block_k)
    del plan["starts"]
    return plan


def block_plan(m: int, widths: list[int], k: int, sm_count: int, *, itemsize: int = 2, tiles_per_block: int = 1,
               block_k: int | None = None, enough_per_sm: float = _ENOUGH_PER_SM,
               unsplit_block_k: int | None = None) -> dict:  # fmt: skip
    """``split_plan``'s plan for the column blocks of several weights laid end to end (``widths``: their ``N``), each
    program reading ``tiles_per_block`` weight tiles of its columns: ``starts`` (each weight's first column block,
    then the total ``n_blocks``) beside ``split_plan``'s keys. ``K`` is not split from ``enough_per_sm`` programs
    per SM (``k_split``); a call that is not split takes ``unsplit_block_k`` (if given, half precision, ``K`` at
    least that long) as its ``K`` tile when ``block_k`` is None."""
    if sm_count < 1:
        raise ValueError(f"sm_count={sm_count}: pass the device's SM count (>= 1).")
    block_m = max(16, min(MAX_ROWS, triton.next_power_of_2(max(m, 1))))
    wide = sum(triton.cdiv(n, 128) for n in widths) * tiles_per_block >= _ENOUGH_PER_SM * sm_count
    block_n = 128 if wide else 64
    starts = [0]
    for n in widths:
        starts.append(starts[-1] + triton.cdiv(n, block_n))
    n_blocks = starts[-1]
    programs = n_blocks * tiles_per_block
    if block_k is None and unsplit_block_k and programs >= enough_per_sm * sm_count and itemsize <= 2 \
            and k >= unsplit_block_k:  # fmt: skip
        block_k = unsplit_block_k
    split = k_split(m, programs, k, sm_count, itemsize=itemsize, block_k=block_k, enough_per_sm=enough_per_sm)
    stage = (block_m + tiles_per_block * block_n) * split["BLOCK_K"] * itemsize
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "starts": starts,
        "n_blocks": n_blocks,
        **split,
        "programs": n_blocks * split["SPLIT_K"],
        "STAGES": max(2, min(4, _STAGE_BUDGET // stage)),
        "num_warps": 8 if block_m * block_n * tiles_per_block >= 8192 else 4,
    }


def k_split(m: int, n_blocks: int, k: int, sm_count: int, *, itemsize: int = 2, block_k: int | None = None,
            enough_per_sm: float = _ENOUGH_PER_SM) -> dict:  # fmt: skip
    """How the ``K`` axis of a call with ``n_blocks`` column blocks is dealt out: ``BLOCK_K``, ``k_tiles``,
    ``SPLIT_K`` and ``TILES`` (see ``split_plan``). Not split when the column blocks alone give ``enough_per_sm``
    programs per SM; else about ``_TARGET_PER_SM`` programs per SM, each split's ``K`` span at least
    ``_WORKSPACE_SHARE`` times its workspace bytes."""
    if sm_count < 1:
        raise ValueError(f"sm_count={sm_count}: pass the device's SM count (>= 1).")
    if block_k is None:
        block_k = max(16, min(128 if itemsize <= 2 else 64, triton.next_power_of_2(max(k, 1))))
    elif block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k={block_k}: pass a power of two >= 16.")
    k_tiles = triton.cdiv(k, block_k)
    tiles = max(k_tiles, 1)
    if n_blocks < enough_per_sm * sm_count and k_tiles > 1:
        want = triton.cdiv(_TARGET_PER_SM * sm_count, max(n_blocks, 1))
        # the workspace (M fp32 values per column, written and read) at most 1 / _WORKSPACE_SHARE of the weight
        floor = triton.cdiv(_WORKSPACE_SHARE * 8 * m, itemsize * block_k)
        tiles = max(triton.cdiv(k_tiles, min(want, k_tiles)), floor, 1)
    split = triton.cdiv(k_tiles, tiles) if k_tiles else 1
    return {"BLOCK_K": block_k, "k_tiles": k_tiles, "SPLIT_K": split, "TILES": min(tiles, max(k_tiles, 1))}


def sm_count(device: torch.device) -> int:
    """The SM count of a CUDA ``device`` (read once per device); ``_INTERPRETER_SMS`` elsewhere."""
    return device_property(device, "multi_processor_count", _INTERPRETER_SMS)


def skinny_linear_triton(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    sms: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """``x2d @ weight^T (+ bias)`` (arguments as ``skinny_linear_reference`` with ``x`` 2-d; not checked here:
    fp32 / bf16 / fp16, one dtype, ``M <= MAX_ROWS``; any strides).

    Args:
        sms (int | None): the SM count to plan for instead of the device's (tests force the split with it).
        block_k (int | None): the ``K`` tile instead of the plan's (see ``split_plan``).

    Returns:
        torch.Tensor: ``[M, N]`` contiguous, ``x2d``'s dtype.
    """
    m, k = x2d.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0 or n == 0:
        return out
    plan = split_plan(m, n, k, sms or sm_count(x2d.device), itemsize=x2d.element_size(), block_k=block_k)
    split = plan["SPLIT_K"]
    direct = split == 1
    dst = out if direct else torch.empty((split, m, n), dtype=torch.float32, device=x2d.device)
    has_bias = bias is not None
    # never read without a bias; not ``out``, so that no argument the kernel writes aliases another one (torch.compile
    # tracks each argument's mutation)
    bias_arg = bias if has_bias else weight
    out_bf16 = x2d.dtype == torch.bfloat16
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    _split_kernel[(plan["n_blocks"], split)](
        x2d, weight, bias_arg, dst, m, n, k, x2d.stride(0), x2d.stride(1), weight.stride(0), weight.stride(1),
        TILES=plan["TILES"], BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], BLOCK_K=plan["BLOCK_K"],
        EVEN_K=k % plan["BLOCK_K"] == 0, DIRECT=direct, HAS_BIAS=has_bias, OUT_BF16=out_bf16,
        IEEE=x2d.dtype == torch.float32, UPCAST=out_bf16 and interpreted,
        num_warps=plan["num_warps"], num_stages=plan["STAGES"],
    )  # fmt: skip
    if not direct:
        block_r = 1024 if m * n >= 1 << 18 else 256
        _reduce_kernel[(triton.cdiv(m * n, block_r),)](
            dst, bias_arg, out, m * n, n, split, BLOCK_R=block_r, HAS_BIAS=has_bias, OUT_BF16=out_bf16, num_warps=4
        )
    return out
