"""A gated MLP's ``silu(gate) * up`` in one Triton launch (capture-safe: no host reads).

One program per block of elements of the contiguous ``[R, F]`` rows: ``gate`` widened to fp32, ``silu = g / (1 +
exp(-g))`` rounded to ``gate``'s dtype and widened again (PyTorch's SiLU of a half tensor rounds once), times ``up``
in fp32, rounded to the output dtype. Replaces the two launches of the reference (the activation, the product).
Equal to ``silu_mul_reference`` up to the GPU's ``exp`` (``tests/kernels/test_silu_mul.py``). Roundings to bf16 are
integer arithmetic (round to nearest even), as in ``rms_norm``: Triton's interpreter truncates a cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import FLOAT_KIND, round_to, to_bf16

__all__ = ["silu_mul_triton"]

_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    g_ptr,  # [R, F] rows stride_g apart, the last dim contiguous
    u_ptr,  # [R, F] rows stride_u apart, the last dim contiguous
    out_ptr,  # [R, F] contiguous
    F,
    stride_g,
    stride_u,
    BLOCK: tl.constexpr,
    GATE: tl.constexpr,  # gate's dtype: 0 fp32, 1 bf16, 2 fp16
    OUT: tl.constexpr,  # the output's dtype (same codes)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    y = round_to(tl.div_rn(g, 1.0 + tl.exp(-g)), GATE) * u
    y = to_bf16(y) if OUT == 1 else y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * F + cols, y, mask=mask)




def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu_mul_reference`` in one launch (``gate`` / ``up`` of one shape, fp32 / bf16 / fp16, rows with a
    contiguous last dim; not checked here). Returns ``gate``'s shape, contiguous, in the promoted dtype."""
    out_dtype = torch.promote_types(gate.dtype, up.dtype)
    out = torch.empty(gate.shape, dtype=out_dtype, device=gate.device)
    if out.numel() == 0:
        return out
    width = gate.shape[-1]
    g, u = gate.reshape(-1, width), up.reshape(-1, width)
    block = min(_BLOCK, triton.next_power_of_2(width))
    _silu_mul_kernel[(g.shape[0], triton.cdiv(width, block))](
        g, u, out, width, g.stride(0), u.stride(0), BLOCK=block, GATE=FLOAT_KIND[gate.dtype], OUT=FLOAT_KIND[out_dtype],
        num_warps=4 if block >= 512 else 1,
    )  # fmt: skip
    return out
