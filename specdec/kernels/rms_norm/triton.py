"""The drafter's RMSNorm in one Triton launch (capture-safe: no host reads).

One program per block of ``ROWS`` rows (a power of two; several rows only when ``D`` is small), each row held
whole in a ``BLOCK_D = next_power_of_2(D)`` vector: the sum of squares in fp32, ``rsqrt(sum / D + eps)`` (as
``1 / sqrt`` with IEEE division and square root, like the CPU reference), the normalised row rounded to ``x``'s
dtype, then the product with its weight row (``(row // period) % G``) in fp32 (fp64 for a fp64 output) rounded
once to the output dtype, as PyTorch's mixed-dtype multiply does. Equal to ``rms_norm_reference`` up to the order
of the fp32 sum (``tests/kernels/test_rms_norm.py``).

Roundings to bf16 are done with integer arithmetic (round to nearest even, the bits of the GPU's ``cvt.rn``):
Triton's interpreter truncates a float32 -> bfloat16 cast, and the tests run the kernel through it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import to_bf16

__all__ = ["add_rms_norm_triton", "block_rows", "rms_norm_cat_triton", "rms_norm_triton"]

_BLOCK_ELEMENTS = 2048
"""Elements per program that several short rows are batched up to."""


@triton.jit
def _normalise(x, w, D, eps, ROWS: tl.constexpr, X_BF16: tl.constexpr, OUT_BF16: tl.constexpr, WIDE: tl.constexpr,
               UNIT_OFFSET: tl.constexpr, x_dtype: tl.constexpr, out_dtype: tl.constexpr):  # fmt: skip
    """Rows ``x [ROWS, BLOCK_D]`` (fp32, zero past ``D``) normalised and scaled by their weight rows ``w``, rounded
    to ``out_dtype`` as the reference rounds them."""
    # rsqrt(sum / D + eps) with IEEE division and square root (Triton's `/` and `rsqrt` are approximate on GPUs)
    mean = tl.div_rn(tl.sum(x * x, axis=1), tl.full([ROWS], D, tl.float32))
    # eps arrives as fp32 from a plain launch and as fp64 from torch.compile: the sum is fp32 either way
    rstd = tl.div_rn(tl.full([ROWS], 1.0, tl.float32), tl.sqrt_rn(mean + tl.cast(eps, tl.float32)))
    normed = x * rstd[:, None]
    if UNIT_OFFSET:
        y = normed * (1.0 + w.to(tl.float32))
    else:
        normed = to_bf16(normed) if X_BF16 else normed.to(x_dtype)
        acc = tl.float64 if WIDE else tl.float32
        y = normed.to(acc) * w.to(acc)
    return to_bf16(y) if OUT_BF16 else y.to(out_dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [R, D] rows stride_x apart (SPLIT_ROWS: [R / inner, inner, D] at stride_x, stride_xi), D contiguous
    w_ptr,  # [G, D] with strides (stride_wg, stride_wd)
    out_ptr,  # [R, D] contiguous
    res_ptr,  # [R, D] rows stride_r apart, x's dtype (HAS_RES), else unused
    sum_ptr,  # [R, D] contiguous, x's dtype: residual + x (HAS_RES), else unused
    R,
    D,
    stride_x,
    inner,
    stride_xi,
    stride_r,
    stride_wg,
    stride_wd,
    period,
    G,
    eps,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    X_BF16: tl.constexpr,  # x is bf16: round the normalised row with to_bf16
    OUT_BF16: tl.constexpr,  # the output is bf16: round the product with to_bf16
    WIDE: tl.constexpr,  # the output is fp64: multiply in fp64
    UNIT_OFFSET: tl.constexpr,  # Gemma / Qwen3-Next: (x / rms) * (1 + w) in fp32, rounded once to x's dtype
    HAS_RES: tl.constexpr,  # normalise residual + x (rounded to x's dtype, as the tensor add), stored to sum_ptr
    SPLIT_ROWS: tl.constexpr,  # row r of x is (r // inner, r % inner) of a [R / inner, inner, D] view
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # int32 (R < 2**31): the group is a 32-bit division
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    offs = rows.to(tl.int64)[:, None]
    if SPLIT_ROWS:  # e.g. the query and key heads of a fused q / k / v product: heads stride_xi apart, tokens stride_x
        x_offs = (rows // inner).to(tl.int64)[:, None] * stride_x + (rows % inner).to(tl.int64)[:, None] * stride_xi
    else:
        x_offs = offs * stride_x
    x = tl.load(x_ptr + x_offs + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # the residual add first, rounded to x's dtype as the tensor op rounds it
        x = x + tl.load(res_ptr + offs * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = (to_bf16(x) if X_BF16 else x.to(x_ptr.dtype.element_ty)).to(tl.float32)
        tl.store(sum_ptr + offs * D + cols[None, :], x.to(sum_ptr.dtype.element_ty), mask=mask)
    group = (rows // period) % G
    w = tl.load(w_ptr + group[:, None] * stride_wg + cols[None, :] * stride_wd, mask=mask, other=0.0)
    y = _normalise(x, w, D, eps, ROWS, X_BF16, OUT_BF16, WIDE, UNIT_OFFSET, x_ptr.dtype.element_ty,
                   out_ptr.dtype.element_ty)  # fmt: skip
    tl.store(out_ptr + offs * D + cols[None, :], y, mask=mask)


@triton.jit
def _rms_norm_cat_kernel(
    a_ptr,  # [R, D] rows stride_a apart, the last dim contiguous (GATHER: a table [N, D] whose rows are read)
    b_ptr,  # [R, D] rows stride_b apart, a's dtype
    idx_ptr,  # [R] int32 / int64: the table row of each output row (GATHER), else unused
    map_ptr,  # [M] int32 / int64: ids -> table rows (MAP), else unused
    wa_ptr,  # [D] contiguous
    wb_ptr,  # [D] contiguous, wa's dtype
    out_ptr,  # [R, 2 D] contiguous: a's norm, then b's
    R,
    D,
    stride_a,
    stride_b,
    eps_a,
    eps_b,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    X_BF16: tl.constexpr,
    OUT_BF16: tl.constexpr,
    WIDE: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    GATHER: tl.constexpr,  # a's rows are table rows idx[r] (an embedding lookup)
    MAP: tl.constexpr,  # ... through map: table row map[idx[r]]
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    row_ok = rows < R
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None]
    out_rows = out_ptr + offs * (2 * D) + cols[None, :]
    a_rows = offs
    if GATHER:
        ids = tl.load(idx_ptr + rows, mask=row_ok, other=0)
        if MAP:
            ids = tl.load(map_ptr + ids, mask=row_ok, other=0)
        a_rows = ids.to(tl.int64)[:, None]
    a = tl.load(a_ptr + a_rows * stride_a + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    wa = tl.load(wa_ptr + cols, mask=col_ok, other=0.0)[None, :]
    y = _normalise(a, wa, D, eps_a, ROWS, X_BF16, OUT_BF16, WIDE, UNIT_OFFSET, a_ptr.dtype.element_ty,
                   out_ptr.dtype.element_ty)  # fmt: skip
    tl.store(out_rows, y, mask=mask)
    b = tl.load(b_ptr + offs * stride_b + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    wb = tl.load(wb_ptr + cols, mask=col_ok, other=0.0)[None, :]
    y = _normalise(b, wb, D, eps_b, ROWS, X_BF16, OUT_BF16, WIDE, UNIT_OFFSET, a_ptr.dtype.element_ty,
                   out_ptr.dtype.element_ty)  # fmt: skip
    tl.store(out_rows + D, y, mask=mask)


def block_rows(rows: int, dim: int) -> tuple[int, int]:
    """``(ROWS, BLOCK_D)`` of a launch: whole rows of ``next_power_of_2(dim)`` (at least 2), and as many rows per
    program as fill ``_BLOCK_ELEMENTS`` (at most ``next_power_of_2(rows)``)."""
    block_d = max(triton.next_power_of_2(dim), 2)
    return max(1, min(_BLOCK_ELEMENTS // block_d, triton.next_power_of_2(rows))), block_d


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, period: int = 1, *, unit_offset: bool = False
) -> torch.Tensor:
    """RMSNorm of the rows of ``x`` in one launch (arguments as ``rms_norm_reference``; not checked here).

    Returns:
        torch.Tensor: ``x``'s shape, dtype ``torch.promote_types(x.dtype, weight.dtype)`` (``unit_offset``:
        ``x.dtype``), contiguous.
    """
    return _launch(x, None, weight, eps, period, unit_offset)[0]


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = residual + x`` and RMSNorm of ``s`` in one launch (arguments as ``add_rms_norm_reference``: ``x`` and
    ``residual`` of one shape and dtype; not checked here).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``s`` (x's dtype) and its norm, both contiguous.
    """
    normed, total = _launch(x, residual, weight, eps, 1, False)
    return total, normed


def rms_norm_cat_triton(
    a: torch.Tensor,
    b: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    eps_a: float,
    eps_b: float,
    *,
    rows: torch.Tensor | None = None,
    row_map: torch.Tensor | None = None,
    unit_offset: bool = False,
) -> torch.Tensor:
    """``torch.cat([rms_norm(a, weight_a, eps_a), rms_norm(b, weight_b, eps_b)], -1)`` in one launch (arguments as
    ``rms_norm_cat_reference``: ``a`` (or the rows ``rows`` / ``row_map`` pick from it) and ``b`` of one shape and
    dtype, ``[D]`` weights of one dtype; not checked here).

    Returns:
        torch.Tensor: ``[..., 2 D]`` contiguous (``b``'s leading shape), dtype as ``rms_norm_triton``'s.
    """
    dim = b.shape[-1]
    out_dtype = a.dtype if unit_offset else torch.promote_types(a.dtype, weight_a.dtype)
    out = torch.empty((*b.shape[:-1], 2 * dim), dtype=out_dtype, device=b.device)
    if out.numel() == 0:
        return out
    rows_a, rows_b = (t.reshape(-1, dim) for t in (a, b))
    rows_a, rows_b = (r if r.stride(1) == 1 else r.contiguous() for r in (rows_a, rows_b))
    ids = None if rows is None else rows.reshape(-1).contiguous()
    wa, wb = weight_a.contiguous(), weight_b.contiguous()
    num_rows = rows_b.shape[0]
    block, block_d = block_rows(num_rows, dim)
    _rms_norm_cat_kernel[(triton.cdiv(num_rows, block),)](
        rows_a, rows_b, out if ids is None else ids, out if row_map is None else row_map, wa, wb, out, num_rows, dim,
        rows_a.stride(0), rows_b.stride(0), float(eps_a), float(eps_b),
        ROWS=block, BLOCK_D=block_d, X_BF16=a.dtype == torch.bfloat16, OUT_BF16=out_dtype == torch.bfloat16,
        WIDE=out_dtype == torch.float64, UNIT_OFFSET=unit_offset, GATHER=ids is not None, MAP=row_map is not None,
        num_warps=min(max(block * block_d // 256, 1), 16),
    )  # fmt: skip
    return out


def _launch(x, residual, weight, eps, period, unit_offset):
    dim = x.shape[-1]
    out_dtype = x.dtype if unit_offset else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    total = None if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out, total
    rows, inner, stride_inner = _rows_of(x) if residual is None else (x.reshape(-1, dim), 1, 0)
    if rows.stride(-1) != 1:
        rows, inner = rows.reshape(-1, dim).contiguous(), 1
    res = rows if residual is None else residual.reshape(-1, dim)  # (unread without a residual)
    if residual is not None and res.stride(1) != 1:
        res = res.contiguous()
    w = weight if weight.dim() == 2 else weight[None]
    num_rows = out.numel() // dim
    block, block_d = block_rows(num_rows, dim)
    _rms_norm_kernel[(triton.cdiv(num_rows, block),)](
        rows, w, out, res, out if total is None else total, num_rows, dim, rows.stride(0), inner, stride_inner,
        res.stride(0), w.stride(0), w.stride(1), period, w.shape[0], float(eps),
        ROWS=block, BLOCK_D=block_d, X_BF16=x.dtype == torch.bfloat16, OUT_BF16=out_dtype == torch.bfloat16,
        WIDE=out_dtype == torch.float64, UNIT_OFFSET=unit_offset, HAS_RES=residual is not None,
        SPLIT_ROWS=inner > 1, num_warps=min(max(block * block_d // 256, 1), 16),
    )  # fmt: skip
    return out, total


def _merges(x: torch.Tensor, start: int, end: int) -> bool:
    """Whether dims ``start .. end - 1`` of ``x`` view as one (each stride the next one's times its size; dims of
    size 1 are free)."""
    dims = [d for d in range(start, end) if x.shape[d] != 1]
    return all(x.stride(a) == x.stride(b) * x.shape[b] for a, b in zip(dims, dims[1:], strict=False))


def _rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``(rows, inner, stride_inner)``: ``x``'s rows as one ``[R, D]`` view (``inner`` 1), or, where its leading dims
    do not merge into one stride (heads cut out of a wider row, e.g. ``qkv[..., :H + H_kv, :]``, or the keys of a
    stacked key / value product), as a ``[R / inner, inner, D]`` view: the trailing leading dims merged into
    ``inner`` rows ``stride_inner`` apart. The contiguous copy only where neither view exists."""
    dim, lead = x.shape[-1], x.dim() - 1
    # decided from the strides, not by trying ``view`` (a failing view inside torch.compile's trace is an error of
    # the trace, not one the code can catch)
    if _merges(x, 0, lead):
        return x.view(-1, dim), 1, 0
    for split in range(1, lead):  # the inner block: dims split .. -2 merged (the widest that views first)
        inner = math.prod(x.shape[split:-1])
        if inner > 1 and _merges(x, 0, split) and _merges(x, split, lead):
            grid = x.view(-1, inner, dim)
            return grid, inner, grid.stride(1)
    return x.reshape(-1, dim), 1, 0
