"""The gated RMSNorm of a Gated DeltaNet layer in one Triton launch (capture-safe: no host reads).

One program per block of ``ROWS`` rows (``[N * HV, V]``: one row per node and value head), each row whole in a
``BLOCK_D`` vector: ``x`` rounded to the model dtype (it arrives as the recurrence's fp32 output, so the cast
the layer would launch is this load), the sum of squares in fp32, ``1 / sqrt(mean + eps)`` with IEEE division
and square root, the normalised row rounded to the model dtype, times the weight rounded to the dtype the two
promote to, times ``silu(gate) = gate / (1 + exp(-gate))`` in fp32, rounded to the model dtype. Replaces the ~13
small launches of the layer's own norm (and the cast before it). Equal to ``gated_rms_norm_reference`` up to the
order of the fp32 sum and the GPU's ``exp`` (``tests/kernels/test_gated_rms_norm.py``).

Roundings to bf16 are integer arithmetic (round to nearest even), as in ``rms_norm``: Triton's interpreter
truncates a float32 -> bfloat16 cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import FLOAT_KIND, round_to, to_bf16

__all__ = ["gated_rms_norm_triton"]

_BLOCK_ELEMENTS = 2048
"""Elements per program that several short rows are batched up to."""


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr,  # [R, D] rows stride_x apart, the last dim contiguous
    g_ptr,  # [R, D] rows stride_g apart, the last dim contiguous
    w_ptr,  # [D]
    out_ptr,  # [R, D] contiguous, the model dtype
    R,
    D,
    stride_x,
    stride_g,
    eps,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DTYPE: tl.constexpr,  # the model dtype: 0 fp32, 1 bf16, 2 fp16
    PROD: tl.constexpr,  # the dtype weight * normed promotes to (same codes)
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    offs = rows.to(tl.int64)[:, None]
    x = round_to(tl.load(x_ptr + offs * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32), DTYPE)
    mean = tl.div_rn(tl.sum(x * x, axis=1), tl.full([ROWS], D, tl.float32))
    rstd = tl.div_rn(tl.full([ROWS], 1.0, tl.float32), tl.sqrt_rn(mean + tl.cast(eps, tl.float32)))
    normed = round_to(x * rstd[:, None], DTYPE)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = round_to(normed * w[None, :], PROD)
    gate = tl.load(g_ptr + offs * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = y * tl.div_rn(gate, 1.0 + tl.exp(-gate))
    y = to_bf16(y) if DTYPE == 1 else y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs * D + cols[None, :], y, mask=mask)




def gated_rms_norm_triton(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """``gated_rms_norm_reference`` in one launch (``x`` / ``gate`` ``[R, D]`` with a contiguous last dim, ``dtype``
    and ``weight.dtype`` fp32 / bf16 / fp16; not checked here). Returns ``[R, D]`` in ``dtype``, contiguous."""
    rows, dim = x.shape
    out = torch.empty(rows, dim, dtype=dtype, device=x.device)
    if out.numel() == 0:
        return out
    block_d = max(triton.next_power_of_2(dim), 2)
    block = max(1, min(_BLOCK_ELEMENTS // block_d, triton.next_power_of_2(rows)))
    _gated_rms_norm_kernel[(triton.cdiv(rows, block),)](
        x, gate, weight, out, rows, dim, x.stride(0), gate.stride(0), float(eps), ROWS=block, BLOCK_D=block_d,
        DTYPE=FLOAT_KIND[dtype], PROD=FLOAT_KIND[torch.promote_types(weight.dtype, dtype)],
        num_warps=min(max(block * block_d // 256, 1), 16),
    )  # fmt: skip
    return out
