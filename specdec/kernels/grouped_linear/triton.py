"""Several products of one input in one launch (plus one reduction launch when ``K`` is split), and a gated MLP's
input side with its activation in the same launches (capture-safe: no host reads, the plan comes from shapes and
the device's SM count alone).

Grouped. ``x [M, K]`` (``M <= 64``) times up to four weights ``W_i [N_i, K]`` (contiguous), each output ``[M, N_i]``
contiguous: a layer's ``q_proj`` / ``k_proj`` / ``v_proj``. The column blocks of the weights are laid end to end
(weight ``i`` owns blocks ``[C_i, C_{i+1})``, its last block masked at ``N_i``), so every program reads one tile
column of one weight; the ``K`` axis is split as in ``skinny_linear`` (``split_plan``'s rule over the blocks of all
weights together). ``_grouped_kernel`` writes each program's fp32 partial into a workspace ``[SPLIT_K, M, sum N_i]``
(or, with one split, the rounded output itself); ``_grouped_reduce`` sums the partials in split order, one grid
axis per weight.

Gated. ``silu(x W_g^T + b_g) * (x W_u^T + b_u)`` for ``W_g``, ``W_u`` of one shape ``[N, K]``: every program reads
the same columns of both weights, and the epilogue (in the first kernel with one split, else in the reduction)
rounds each product to the output dtype, applies the SiLU rounded once, and multiplies, as the layer's
``gate_proj``, ``up_proj`` and ``silu_mul`` compute it: one or two launches for three.

Precision: fp32 accumulation, IEEE dots for fp32 inputs, one rounding per product (bf16 round to nearest even by
integer arithmetic: Triton's interpreter truncates a cast). The sum order differs from cuBLAS's, so a bf16 output
may differ from ``F.linear``'s by an ulp.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specdec.kernels.skinny_linear.triton import MAX_ROWS, block_plan, block_span, sm_count, split_product
from specdec.kernels.triton_ops import FLOAT_KIND, dot_fp32, load_k_tile, round_to, to_bf16

__all__ = ["MAX_ROWS", "MAX_WEIGHTS", "gated_linear_triton", "group_plan", "grouped_linear_triton"]

MAX_WEIGHTS = 4
"""The most weights one grouped call takes."""

_ENOUGH_PER_SM = 2
"""Column blocks per SM (two weight tiles each) at which the gated call's ``K`` is not split."""

_UNSPLIT_PER_SM = 0.5
"""Column blocks per SM at which a grouped call's ``K`` is not split: on an H100 the q / k / v group of Qwen3-8B
(96 blocks of 64 columns, ``K`` = 4096) took 19.7 µs unsplit against 22.1 µs in five splits and a reduction at one
row, 21.5 against 26.8 µs at 32 rows (``benchmarks/kernels/bench_grouped_linear.py --sweep``); ``down_proj``'s 64
blocks of ``K`` = 12288 were fastest in four splits."""

_UNSPLIT_BLOCK_K = 256
"""The ``K`` tile of an unsplit grouped call in half precision (fewer, longer loads; the same sweep)."""


@triton.jit(do_not_specialize=["N0", "N1", "N2", "N3", "C1", "C2", "C3"])
def _grouped_kernel(
    x_ptr,  # [M, K], strides (stride_xm, stride_xk)
    w0_ptr, w1_ptr, w2_ptr, w3_ptr,  # [N_i, K] contiguous (unused ones: any tensor, never read)
    b0_ptr, b1_ptr, b2_ptr, b3_ptr,  # [N_i] biases (read only when HAS_BIAS and DIRECT)
    d0_ptr, d1_ptr, d2_ptr, d3_ptr,  # DIRECT: the outputs [M, N_i] contiguous
    ws_ptr,  # not DIRECT: the fp32 workspace [SPLIT_K, M, NT] contiguous
    M, K, N0, N1, N2, N3,
    C1, C2, C3,  # first column block of weights 1, 2, 3
    NT,  # N0 + N1 + N2 + N3
    stride_xm, stride_xk,
    TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, DIRECT: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    split = tl.program_id(1)
    if block < C1:
        w_ptr, b_ptr, d_ptr, n, local, off = w0_ptr, b0_ptr, d0_ptr, N0, block, N0 - N0
    elif block < C2:
        w_ptr, b_ptr, d_ptr, n, local, off = w1_ptr, b1_ptr, d1_ptr, N1, block - C1, N0 + 0
    elif block < C3:
        w_ptr, b_ptr, d_ptr, n, local, off = w2_ptr, b2_ptr, d2_ptr, N2, block - C2, N0 + N1
    else:
        w_ptr, b_ptr, d_ptr, n, local, off = w3_ptr, b3_ptr, d3_ptr, N3, block - C3, N0 + N1 + N2
    acc, rows, row_ok, cols, col_ok = split_product(
        x_ptr, w_ptr, M, n, K, local, split, stride_xm, stride_xk, K, 1,
        TILES, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, UPCAST,
    )  # fmt: skip

    ok = row_ok[:, None] & col_ok[None, :]
    if DIRECT:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out = to_bf16(acc) if OUT_BF16 else acc.to(d_ptr.dtype.element_ty)
        tl.store(d_ptr + rows.to(tl.int64)[:, None] * n + cols[None, :], out, mask=ok)
    else:
        offs = split.to(tl.int64) * M * NT + rows.to(tl.int64)[:, None] * NT + off + cols[None, :]
        tl.store(ws_ptr + offs, acc, mask=ok)


@triton.jit(do_not_specialize=["N0", "N1", "N2", "N3"])
def _grouped_reduce(
    ws_ptr,  # [SPLIT_K, M, NT] fp32
    b0_ptr, b1_ptr, b2_ptr, b3_ptr,
    d0_ptr, d1_ptr, d2_ptr, d3_ptr,  # [M, N_i] contiguous
    M, N0, N1, N2, N3, NT, SPLIT_K,
    BLOCK_R: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    segment = tl.program_id(1)
    if segment == 0:
        b_ptr, d_ptr, n, off = b0_ptr, d0_ptr, N0, N0 - N0
    elif segment == 1:
        b_ptr, d_ptr, n, off = b1_ptr, d1_ptr, N1, N0 + 0
    elif segment == 2:
        b_ptr, d_ptr, n, off = b2_ptr, d2_ptr, N2, N0 + N1
    else:
        b_ptr, d_ptr, n, off = b3_ptr, d3_ptr, N3, N0 + N1 + N2
    idx = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = idx < M * n
    row = idx // n
    col = idx % n
    parts = ws_ptr + row * NT + off + col
    acc = tl.zeros([BLOCK_R], tl.float32)
    for _ in range(0, SPLIT_K):  # in split order: the same sum on every run
        acc += tl.load(parts, mask=ok, other=0.0)
        parts += M * NT
    if HAS_BIAS:
        acc += tl.load(b_ptr + col, mask=ok, other=0.0).to(tl.float32)
    out = to_bf16(acc) if OUT_BF16 else acc.to(d_ptr.dtype.element_ty)
    tl.store(d_ptr + idx, out, mask=ok)


@triton.jit
def _gate_epilogue(g, u, KIND: tl.constexpr):
    """``silu(g) * u`` of fp32 sums: each rounded to the output dtype first, the SiLU rounded once, fp32 back."""
    g = round_to(g, KIND)
    u = round_to(u, KIND)
    return round_to(tl.div_rn(g, 1.0 + tl.exp(-g)), KIND) * u


@triton.jit
def _gated_kernel(
    x_ptr,  # [M, K], strides (stride_xm, stride_xk)
    wg_ptr, wu_ptr,  # [N, K] contiguous
    bg_ptr, bu_ptr,  # [N] (read only when HAS_BIAS and DIRECT)
    dst_ptr,  # DIRECT: the output [M, N] contiguous; else the fp32 workspace [SPLIT_K, 2, M, N]
    M, N, K, stride_xm, stride_xk,
    TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, DIRECT: tl.constexpr, HAS_BIAS: tl.constexpr, KIND: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    split = tl.program_id(1)
    rows, row_ok, cols, col_ok, x_rows, start, end = block_span(
        x_ptr, M, N, K, block, split, stride_xm, TILES, BLOCK_M, BLOCK_N, BLOCK_K
    )
    w_offs = cols.to(tl.int64)[None, :] * K

    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(start, end, BLOCK_K):
        ks = (k0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        x = load_k_tile(x_rows, ks, stride_xk, row_ok, end, EVEN_K, False)
        wg = load_k_tile(wg_ptr + w_offs, ks, 1, col_ok, end, EVEN_K, True)
        wu = load_k_tile(wu_ptr + w_offs, ks, 1, col_ok, end, EVEN_K, True)
        acc_g += dot_fp32(x, wg, IEEE, UPCAST)
        acc_u += dot_fp32(x, wu, IEEE, UPCAST)

    ok = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if DIRECT:
        if HAS_BIAS:
            acc_g += tl.load(bg_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            acc_u += tl.load(bu_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        y = _gate_epilogue(acc_g, acc_u, KIND)
        out = to_bf16(y) if KIND == 1 else y.to(dst_ptr.dtype.element_ty)
        tl.store(dst_ptr + offs, out, mask=ok)
    else:
        base = dst_ptr + split.to(tl.int64) * 2 * M * N
        tl.store(base + offs, acc_g, mask=ok)
        tl.store(base + M * N + offs, acc_u, mask=ok)


@triton.jit
def _gated_reduce(
    ws_ptr,  # [SPLIT_K, 2, M, N] fp32
    bg_ptr, bu_ptr,
    out_ptr,  # [M, N] contiguous
    MN, N, SPLIT_K,
    BLOCK_R: tl.constexpr, HAS_BIAS: tl.constexpr, KIND: tl.constexpr,
):  # fmt: skip
    idx = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = idx < MN
    acc_g = tl.zeros([BLOCK_R], tl.float32)
    acc_u = tl.zeros([BLOCK_R], tl.float32)
    parts = ws_ptr + idx
    for _ in range(0, SPLIT_K):  # in split order
        acc_g += tl.load(parts, mask=ok, other=0.0)
        acc_u += tl.load(parts + MN, mask=ok, other=0.0)
        parts += 2 * MN
    if HAS_BIAS:
        acc_g += tl.load(bg_ptr + idx % N, mask=ok, other=0.0).to(tl.float32)
        acc_u += tl.load(bu_ptr + idx % N, mask=ok, other=0.0).to(tl.float32)
    y = _gate_epilogue(acc_g, acc_u, KIND)
    out = to_bf16(y) if KIND == 1 else y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + idx, out, mask=ok)


def group_plan(m: int, widths: list[int], k: int, sms: int, *, itemsize: int = 2, tiles_per_block: int = 1,
               block_k: int | None = None) -> dict:  # fmt: skip
    """The launch plan of a grouped (``widths`` = the ``N_i``) or gated (``widths = [N]``, ``tiles_per_block=2``:
    each program reads two weight tiles) call from shapes only.

    Returns:
        dict: ``BLOCK_M``, ``BLOCK_N`` (64; 128 when the columns alone give enough programs), ``BLOCK_K``,
        ``starts`` (each weight's first column block, then the total: ``n_blocks``), ``k_tiles``, ``SPLIT_K``,
        ``TILES``, ``programs``, ``STAGES`` and ``num_warps``, as ``skinny_linear.triton.split_plan``'s.
    """
    if not 0 <= m <= MAX_ROWS:
        raise ValueError(f"group_plan takes 0 <= M <= {MAX_ROWS} rows; got {m}.")
    if not 1 <= len(widths) <= MAX_WEIGHTS:
        raise ValueError(f"group_plan takes 1 to {MAX_WEIGHTS} weights; got {len(widths)}.")
    gated = tiles_per_block > 1
    return block_plan(m, widths, k, sms, itemsize=itemsize, tiles_per_block=tiles_per_block, block_k=block_k,
                      enough_per_sm=_ENOUGH_PER_SM if gated else _UNSPLIT_PER_SM,
                      unsplit_block_k=None if gated else _UNSPLIT_BLOCK_K)  # fmt: skip


def _flags(x2d: torch.Tensor) -> dict:
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    bf16 = x2d.dtype == torch.bfloat16
    return {"IEEE": x2d.dtype == torch.float32, "UPCAST": bf16 and interpreted}


def grouped_linear_triton(x2d: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None,
                          *, sms: int | None = None, block_k: int | None = None) -> list[torch.Tensor]:  # fmt: skip
    """``[x2d @ w^T (+ b) for each weight]`` in one launch (two with a split ``K``). Not checked here (see
    ``grouped_linear``): ``x2d [M, K]`` with ``M <= MAX_ROWS``, 1 to ``MAX_WEIGHTS`` contiguous weights ``[N_i, K]``
    of ``x2d``'s dtype (fp32 / bf16 / fp16), biases all given or all None.

    Args:
        sms (int | None): the SM count to plan for instead of the device's (tests force the split with it).
        block_k (int | None): the ``K`` tile instead of the plan's.

    Returns:
        list[torch.Tensor]: ``[M, N_i]`` contiguous, ``x2d``'s dtype.
    """
    m, k = x2d.shape
    widths = [w.shape[0] for w in weights]
    outs = [torch.empty((m, n), dtype=x2d.dtype, device=x2d.device) for n in widths]
    if m == 0 or sum(widths) == 0:
        return outs
    plan = group_plan(m, widths, k, sms or sm_count(x2d.device), itemsize=x2d.element_size(), block_k=block_k)
    split = plan["SPLIT_K"]
    direct = split == 1
    has_bias = biases is not None and biases[0] is not None
    pad = MAX_WEIGHTS - len(weights)
    w = list(weights) + [weights[0]] * pad
    # never read without a bias; not an output, so that no argument the kernel writes aliases another one
    b = (list(biases) if has_bias else list(weights)) + [weights[0]] * pad
    d = outs + [outs[0]] * pad
    n = widths + [0] * pad
    nt = sum(widths)
    starts = plan["starts"] + [plan["n_blocks"]] * pad
    ws = outs[0] if direct else torch.empty((split, m, nt), dtype=torch.float32, device=x2d.device)
    out_bf16 = x2d.dtype == torch.bfloat16
    _grouped_kernel[(plan["n_blocks"], split)](
        x2d, *w, *b, *d, ws, m, k, *n, starts[1], starts[2], starts[3], nt, x2d.stride(0), x2d.stride(1),
        TILES=plan["TILES"], BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], BLOCK_K=plan["BLOCK_K"],
        EVEN_K=k % plan["BLOCK_K"] == 0, DIRECT=direct, HAS_BIAS=has_bias, OUT_BF16=out_bf16, **_flags(x2d),
        num_warps=plan["num_warps"], num_stages=plan["STAGES"],
    )  # fmt: skip
    if not direct:
        block_r = 1024 if m * max(widths) >= 1 << 18 else 256
        _grouped_reduce[(triton.cdiv(m * max(widths), block_r), len(weights))](
            ws, *b, *d, m, *n, nt, split, BLOCK_R=block_r, HAS_BIAS=has_bias, OUT_BF16=out_bf16, num_warps=4
        )
    return outs


def gated_linear_triton(x2d: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                        b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None, *,
                        sms: int | None = None, block_k: int | None = None) -> torch.Tensor:  # fmt: skip
    """``silu(x2d W_g^T + b_g) * (x2d W_u^T + b_u)`` in one launch (two with a split ``K``). Not checked here (see
    ``gated_linear``): ``x2d [M, K]``, ``M <= MAX_ROWS``, contiguous weights ``[N, K]`` of one shape and ``x2d``'s
    dtype, both biases given or both None.

    Returns:
        torch.Tensor: ``[M, N]`` contiguous, ``x2d``'s dtype.
    """
    m, k = x2d.shape
    n = w_gate.shape[0]
    out = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0 or n == 0:
        return out
    plan = group_plan(m, [n], k, sms or sm_count(x2d.device), itemsize=x2d.element_size(), tiles_per_block=2,
                      block_k=block_k)  # fmt: skip
    split = plan["SPLIT_K"]
    direct = split == 1
    has_bias = b_gate is not None
    bg, bu = (b_gate, b_up) if has_bias else (w_gate, w_up)
    dst = out if direct else torch.empty((split, 2, m, n), dtype=torch.float32, device=x2d.device)
    kind = FLOAT_KIND[x2d.dtype]
    _gated_kernel[(plan["n_blocks"], split)](
        x2d, w_gate, w_up, bg, bu, dst, m, n, k, x2d.stride(0), x2d.stride(1),
        TILES=plan["TILES"], BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], BLOCK_K=plan["BLOCK_K"],
        EVEN_K=k % plan["BLOCK_K"] == 0, DIRECT=direct, HAS_BIAS=has_bias, KIND=kind, **_flags(x2d),
        num_warps=plan["num_warps"], num_stages=plan["STAGES"],
    )  # fmt: skip
    if not direct:
        block_r = 1024 if m * n >= 1 << 18 else 256
        _gated_reduce[(triton.cdiv(m * n, block_r),)](
            dst, bg, bu, out, m * n, n, split, BLOCK_R=block_r, HAS_BIAS=has_bias, KIND=kind, num_warps=4
        )
    return out
