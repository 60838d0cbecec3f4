"""The accepted path's key / value rows moved to the committed slots in one Triton launch (capture-safe).

One program per (layer, keys or values, sequence, head) plane and block of head dims: it reads the sequence's
``prefix`` and path, loads the path's rows (slots ``prefix + path[p]``) into registers, waits for every thread of
the program (a barrier: the rows a step reads may be the slots an earlier step writes, since ``path[p] >= p``), then
stores them at ``prefix + p``. Planes are disjoint, so programs never touch each other's rows. A copy: equal to
``kv_commit_reference`` bit for bit (``tests/kernels/test_kv_commit.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["kv_commit_triton"]


@triton.jit
def _kv_commit_kernel(
    kv_ptr,  # [L * 2, B, H, capacity, D] (strides s_p, s_b, s_h, s_s, 1)
    prefix_ptr,  # [B] int64
    path_ptr,  # [B, P] int64 (strides s_pb, s_pp)
    B,
    H,
    P,
    D,
    s_p, s_b, s_h, s_s,
    s_pb, s_pp,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)  # (plane * B + b) * H + h
    h = pid % H
    b = (pid // H) % B
    plane = pid // (H * B)
    steps = tl.arange(0, BLOCK_P)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    step_ok = steps < P
    mask = step_ok[:, None] & (cols < D)[None, :]
    base = kv_ptr + plane * s_p + b * s_b + h * s_h
    start = tl.load(prefix_ptr + b)
    src = start + tl.load(path_ptr + b * s_pb + steps * s_pp, mask=step_ok, other=0)
    rows = tl.load(base + src[:, None] * s_s + cols[None, :], mask=mask)
    tl.debug_barrier()  # every read of the plane done before any write (a step's source may be another's target)
    tl.store(base + (start + steps)[:, None] * s_s + cols[None, :], rows, mask=mask)


def kv_commit_triton(kv: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor) -> None:
    """``kv_commit_reference`` in one launch (arguments as there; ``fits_triton`` holds, not checked here)."""
    layers, two, batch, heads, _, dim = kv.shape
    path = path.reshape(batch, -1)
    steps = path.shape[1]
    if kv.numel() == 0 or steps == 0:
        return
    planes = kv.view(layers * two, *kv.shape[2:]) if kv.stride(0) == two * kv.stride(1) else None
    if planes is None:  # layers not evenly spaced: one launch per layer
        for layer in range(layers):
            kv_commit_triton(kv[layer : layer + 1], prefix, path)
        return
    block_p = max(triton.next_power_of_2(steps), 2)
    block_d = min(triton.next_power_of_2(dim), max(16, 8192 // block_p))
    _kv_commit_kernel[(layers * two * batch * heads, triton.cdiv(dim, block_d))](
        planes, prefix.reshape(-1), path, batch, heads, steps, dim,
        planes.stride(0), planes.stride(1), planes.stride(2), planes.stride(3),
        path.stride(0), path.stride(1),
        BLOCK_P=block_p, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
