"""Fused Triton kernel of ``tree_mamba2``: the whole SSD tree recurrence of one layer in one launch.

One program per (head, block of ``BLOCK_P`` head channels) owns a ``[BLOCK_P, S]`` slice of the state and walks
the nodes in order ``0 .. N-1`` (a parent always precedes its children):

- the running state stays in registers while ``parents[i] == i - 1`` (chains, first children);
- any other node reloads its parent's state from a scratch buffer (``init_state`` for ``parents[i] == -1``);
- after its update, node i's state is written to scratch only if a node other than ``i + 1`` is its child.
  Each program reads the parent array once into registers and tests this per node, so no other launch is needed.

The scratch has one ``[H, P, S]`` fp32 row per node (rows are written only for such branch points and are never
zeroed). The next node's inputs are loaded one step ahead, so their latency overlaps the current update. The
node loop runs to the constexpr ``BLOCK_N`` (next power of two >= N) and skips the tail.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["tree_mamba2_triton"]


@triton.jit
def _tree_mamba2_kernel(
    init_ptr,
    x_ptr,
    b_ptr,
    c_ptr,
    dt_ptr,
    a_ptr,
    d_ptr,
    parents_ptr,
    out_ptr,
    scratch_ptr,
    N,
    H,
    HEADS_PER_GROUP,
    HEADS_PER_ROW,  # heads of one sequence: program head h reads sequence h // HEADS_PER_ROW's tree
    NODE_STRIDE,
    P: tl.constexpr,
    S: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    head = tl.program_id(0).to(tl.int64)
    parents_ptr += (head // HEADS_PER_ROW) * N  # this sequence's parent array
    group = head // HEADS_PER_GROUP
    num_groups = H // HEADS_PER_GROUP
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_s = tl.arange(0, BLOCK_S)
    mask_p = offs_p < P
    mask_s = offs_s < S
    mask_ps = mask_p[:, None] & mask_s[None, :]
    state_offs = head * P * S + offs_p[:, None] * S + offs_s[None, :]  # int64: head is int64

    node_ids = tl.arange(0, BLOCK_N)
    all_parents = tl.load(parents_ptr + node_ids, mask=node_ids < N, other=-2)
    a = tl.load(a_ptr + head)
    d = tl.load(d_ptr + head)

    state = tl.load(init_ptr + state_offs, mask=mask_ps, other=0.0)
    # inputs of node 0; each iteration prefetches those of the next node
    parent = tl.load(parents_ptr)
    x = tl.load(x_ptr + head * P + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + group * S + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + group * S + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + head)
    for i in range(0, BLOCK_N):
        if i < N:
            node = tl.cast(i, tl.int64)
            nxt = tl.minimum(node + 1, N - 1)  # the last node prefetches itself again (unused, always in bounds)
            parent_next = tl.load(parents_ptr + nxt)
            x_next = tl.load(x_ptr + (nxt * H + head) * P + offs_p, mask=mask_p, other=0.0)
            b_next = tl.load(b_ptr + (nxt * num_groups + group) * S + offs_s, mask=mask_s, other=0.0)
            c_next = tl.load(c_ptr + (nxt * num_groups + group) * S + offs_s, mask=mask_s, other=0.0)
            dt_next = tl.load(dt_ptr + nxt * H + head)

            if parent != node - 1:
                if parent < 0:
                    state = tl.load(init_ptr + state_offs, mask=mask_ps, other=0.0)
                else:
                    state = tl.load(scratch_ptr + parent * NODE_STRIDE + state_offs, mask=mask_ps, other=0.0)
            state = state * tl.exp(dt * a) + (dt * b)[None, :] * x[:, None]
            y = tl.sum(state * c[None, :], axis=1) + d * x
            tl.store(out_ptr + (node * H + head) * P + offs_p, y, mask=mask_p)
            branch_children = tl.sum(((all_parents == node) & (node_ids != node + 1)).to(tl.int32), axis=0)
            if branch_children > 0:
                tl.store(scratch_ptr + node * NODE_STRIDE + state_offs, state, mask=mask_ps)
                tl.debug_barrier()  # the reload of this row may be issued by other threads of the program

            parent, dt = parent_next, dt_next
            x, b, c = x_next.to(tl.float32), b_next.to(tl.float32), c_next.to(tl.float32)


def _launch_config(p_dim: int, s_dim: int) -> tuple[int, int]:
    """``(BLOCK_P, num_warps)``: narrow channel blocks give more programs, the walk over nodes is latency-bound."""
    block_p = min(triton.next_power_of_2(p_dim), 16)
    elems = triton.next_power_of_2(s_dim) * block_p
    return block_p, 1 if elems <= 2048 else 2


def tree_mamba2_triton(
    init_state: torch.Tensor,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
) -> torch.Tensor:
    """Triton ``tree_mamba2``; arguments and result as ``tree_mamba2_reference``.

    ``parents`` is not validated here (that would need a device sync): ``parents[i] < i`` is required.
    """
    block_p, num_warps = _launch_config(x.shape[-1], B.shape[-1])
    return _tree_mamba2(init_state, x, B, C, dt, A, D, parents, block_p=block_p, num_warps=num_warps)


def _tree_mamba2(init_state, x, B, C, dt, A, D, parents, *, block_p: int, num_warps: int) -> torch.Tensor:
    n, h, p_dim = x.shape
    s_dim = B.shape[-1]
    out = torch.empty((n, h, p_dim), dtype=torch.float32, device=x.device)
    scratch = torch.empty((n, h, p_dim, s_dim), dtype=torch.float32, device=x.device)
    grid = (h, triton.cdiv(p_dim, block_p))
    _tree_mamba2_kernel[grid](
        init_state.float().contiguous(),
        x.contiguous(),
        B.contiguous(),
        C.contiguous(),
        dt.float().contiguous(),
        A.float().contiguous(),
        D.float().contiguous(),
        parents.to(torch.int64).contiguous(),
        out,
        scratch,
        n,
        h,
        h // B.shape[1],
        h // (parents.numel() // n),  # parents [rows * N]: one tree per sequence
        h * p_dim * s_dim,
        P=p_dim,
        S=s_dim,
        BLOCK_P=block_p,
        BLOCK_S=triton.next_power_of_2(s_dim),
        BLOCK_N=triton.next_power_of_2(n),
        num_warps=num_warps,
    )
    return out
