"""The tree conv of a recurrent layer in one Triton launch (capture-safe: no host reads).

One program per node and block of channels: the node's ``W`` taps from its row's gather table, each read from the
committed window (``index < S``) or from the nodes' pre-conv inputs (``index - S``), widened to fp32 and multiplied
by the kernel's column in fp32, summed tap by tap (oldest first), the bias added, SiLU (``x / (1 + exp(-x))``) or
none, rounded to the inputs' dtype and stored contiguous ``[B, N, C]``. Replaces the reference's ~8 launches (cat,
cast, gather, product, sum, bias, activation, cast) per layer and forward. Equal to ``tree_conv_reference`` up to
the order of the fp32 sum over the taps and the GPU's ``exp`` (``tests/kernels/test_tree_conv.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton_ops import to_bf16

__all__ = ["tree_conv_triton"]


@triton.jit
def _tree_conv_kernel(
    x_ptr,  # [B, N, C] pre-conv inputs, strided
    win_ptr,  # [B, C, S] committed windows, strided
    w_ptr,  # [C, W] kernel, strided
    b_ptr,  # [C] bias (unused without HAS_BIAS)
    idx_ptr,  # [B, N, W] int64 gather table, strided
    out_ptr,  # [B, N, C] contiguous, the inputs' dtype
    N,
    C,
    S,
    sx_b,
    sx_n,
    sx_c,
    sw_b,
    sw_c,
    sw_s,
    sk_c,
    sk_w,
    si_b,
    si_n,
    si_w,
    W: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    node = tl.program_id(0).to(tl.int64)  # b * N + n
    b, n = node // N, node % N
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = cols < C
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for t in tl.static_range(W):
        idx = tl.load(idx_ptr + b * si_b + n * si_n + t * si_w) + tl.zeros([BLOCK_C], dtype=tl.int64)
        in_window = idx < S
        from_window = tl.load(win_ptr + b * sw_b + cols * sw_c + tl.minimum(idx, S - 1) * sw_s,
                              mask=inside & in_window, other=0.0).to(tl.float32)  # fmt: skip
        from_nodes = tl.load(x_ptr + b * sx_b + tl.maximum(idx - S, 0) * sx_n + cols * sx_c,
                             mask=inside & (idx >= S), other=0.0).to(tl.float32)  # fmt: skip
        tap = tl.where(in_window, from_window, from_nodes)
        weight = tl.load(w_ptr + cols * sk_c + t * sk_w, mask=inside, other=0.0).to(tl.float32)
        acc += tap * weight
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if SILU:
        acc = tl.div_rn(acc, 1.0 + tl.exp(-acc))
    out = to_bf16(acc) if OUT_BF16 else acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + node * C + cols, out, mask=inside)


def tree_conv_triton(
    inputs: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    silu: bool,
) -> torch.Tensor:
    """``tree_conv_reference`` in one launch with SiLU or no activation (arguments as there, any strides; not
    checked here). Returns ``[B, N, C]`` contiguous in ``inputs``' dtype."""
    rows, n, channels = inputs.shape
    out = torch.empty(rows, n, channels, dtype=inputs.dtype, device=inputs.device)
    if out.numel() == 0:
        return out
    block_c = min(triton.next_power_of_2(channels), 1024)
    _tree_conv_kernel[(rows * n, triton.cdiv(channels, block_c))](
        inputs, window, weight, bias if bias is not None else weight, index, out, n, channels, window.shape[-1],
        *inputs.stride(), *window.stride(), *weight.stride(), *index.stride(), W=weight.shape[-1],
        BLOCK_C=block_c, HAS_BIAS=bias is not None, SILU=silu, OUT_BF16=inputs.dtype == torch.bfloat16,
        num_warps=4 if block_c >= 512 else 1,
    )  # fmt: skip
    return out
