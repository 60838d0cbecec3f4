"""The end of a decode round in one Triton launch (capture-safe: no host reads).

One program per block of sequences: each row's accepted tokens copied into its output row (and the path's length
and the tree's size after them), the token at ``num_path - 1`` read as the next root where the row is active, and
the row's length advanced by ``num_path`` (one without it) where active. Integer copies and sums: equal to
``round_tail_reference`` bit for bit (``tests/kernels/test_round_tail.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["round_tail_triton"]


@triton.jit
def _round_tail_kernel(
    out_ptr,  # [B, W] int64 (strides s_ob, s_ow)
    tok_ptr,  # [B, P] int64 (strides s_tb, s_tp)
    active_ptr,  # [B] bool (as uint8)
    root_ptr,  # [B] int64
    prefix_ptr,  # [B] int64
    path_ptr,  # [B] int64 (HAS_PATH), else unused
    nodes_ptr,  # [B] int64 (HAS_NODES), else unused
    B,
    P,
    s_ob, s_ow, s_tb, s_tp, s_a, s_r, s_x, s_n, s_m,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HAS_PATH: tl.constexpr,
    HAS_NODES: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_P)
    mask = row_ok[:, None] & (cols < P)[None, :]
    tokens = tl.load(tok_ptr + rows64[:, None] * s_tb + cols[None, :] * s_tp, mask=mask, other=0)
    tl.store(out_ptr + rows64[:, None] * s_ob + cols[None, :] * s_ow, tokens, mask=mask)
    if HAS_PATH:
        num = tl.load(path_ptr + rows64 * s_n, mask=row_ok, other=1)
        tl.store(out_ptr + rows64 * s_ob + P * s_ow, num, mask=row_ok)
        if HAS_NODES:
            nodes = tl.load(nodes_ptr + rows64 * s_m, mask=row_ok, other=0)
            tl.store(out_ptr + rows64 * s_ob + (P + 1) * s_ow, nodes, mask=row_ok)
    else:
        num = tl.full([BLOCK_B], 1, tl.int64)
    choice = tl.load(tok_ptr + rows64 * s_tb + (num - 1) * s_tp, mask=row_ok, other=0)
    active = tl.load(active_ptr + rows64 * s_a, mask=row_ok, other=0) != 0
    root = tl.load(root_ptr + rows64 * s_r, mask=row_ok, other=0)
    tl.store(root_ptr + rows64 * s_r, tl.where(active, choice, root), mask=row_ok)
    prefix = tl.load(prefix_ptr + rows64 * s_x, mask=row_ok, other=0)
    tl.store(prefix_ptr + rows64 * s_x, prefix + tl.where(active, num, 0), mask=row_ok)


def round_tail_triton(out, tokens, active, root, prefix, num_path=None, num_nodes=None) -> None:
    """``round_tail_reference`` in one launch (arguments as there; ``fits_triton`` holds, not checked here)."""
    batch, width = tokens.shape
    if batch == 0:
        return
    block_b = min(triton.next_power_of_2(batch), 64)
    flags = active.view(torch.uint8)
    path = num_path if num_path is not None else prefix
    nodes = num_nodes if num_nodes is not None else prefix
    _round_tail_kernel[(triton.cdiv(batch, block_b),)](
        out, tokens, flags, root, prefix, path, nodes, batch, width,
        out.stride(0), out.stride(1), tokens.stride(0), tokens.stride(1), flags.stride(0), root.stride(0),
        prefix.stride(0), path.stride(0), nodes.stride(0),
        BLOCK_B=block_b, BLOCK_P=max(triton.next_power_of_2(width), 2), HAS_PATH=num_path is not None,
        HAS_NODES=num_nodes is not None, num_warps=1,
    )  # fmt: skip
