"""An attention layer's new keys and values into the static storage in one Triton launch (capture-safe).

One program per (sequence, new row) and block of heads: the row's slot read from ``index``, its key and value
heads (``[heads, D]`` tiles, any strides) copied to that slot of the layer's keys and values. Replaces the two
``index_copy_`` launches of the reference (one per tensor; for several sequences, two ``index_put_`` and the row
numbers they need). A copy: equal to ``kv_write_reference`` bit for bit (``tests/kernels/test_kv_write.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["kv_write_triton"]


@triton.jit
def _kv_write_kernel(
    keys_ptr,  # [B, H, capacity, D] strided
    values_ptr,  # [B, H, capacity, D] strided
    index_ptr,  # [B, N] strided
    k_ptr,  # [B, H, N, D] strided
    v_ptr,  # [B, H, N, D] strided
    N,
    H,
    D,
    s_kb, s_kh, s_ks, s_kd,
    s_vb, s_vh, s_vs, s_vd,
    s_ib, s_in,
    s_xb, s_xh, s_xn, s_xd,
    s_yb, s_yh, s_yn, s_yd,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)  # b * N + n
    b, n = pid // N, pid % N
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    mask = (heads < H)[:, None] & (cols < D)[None, :]
    slot = tl.load(index_ptr + b * s_ib + n * s_in)
    h, d = heads.to(tl.int64)[:, None], cols[None, :]
    key = tl.load(k_ptr + b * s_xb + h * s_xh + n * s_xn + d * s_xd, mask=mask)
    tl.store(keys_ptr + b * s_kb + h * s_kh + slot * s_ks + d * s_kd, key, mask=mask)
    value = tl.load(v_ptr + b * s_yb + h * s_yh + n * s_yn + d * s_yd, mask=mask)
    tl.store(values_ptr + b * s_vb + h * s_vh + slot * s_vs + d * s_vd, value, mask=mask)


def kv_write_triton(
    keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor, key_states: torch.Tensor,
    value_states: torch.Tensor,
) -> None:  # fmt: skip
    """``kv_write_reference`` in one launch (arguments as there, one dtype throughout, any strides; not checked
    here)."""
    rows, heads, n, dim = key_states.shape
    if rows * n == 0:
        return
    block_d = triton.next_power_of_2(dim)
    block_h = min(triton.next_power_of_2(heads), max(1, 4096 // block_d))
    _kv_write_kernel[(rows * n, triton.cdiv(heads, block_h))](
        keys, values, index, key_states, value_states, n, heads, dim, *keys.stride(), *values.stride(),
        *index.stride(), *key_states.stride(), *value_states.stride(), BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_h * block_d >= 2048 else 1,
    )  # fmt: skip
