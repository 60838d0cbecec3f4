"""Sampled paths merged into a trie in one Triton launch (capture-safe: no host reads, the launch plan from shapes).

One program per row holds the row's ``E = M * L`` path entries in lanes ``e = m * L + l`` (path ``m``, depth ``l``).
For each earlier path ``m' < m`` (in increasing order) a lane compares the prefixes ``paths[m', :l + 1]`` and
``paths[m, :l + 1]`` token by token; the first that agrees is the entry's ``first`` path (itself if none). The
entries whose first path is their own are the new nodes; an inclusive cumulative sum over the lanes numbers them
path by path, depth by depth (the reference's flattening). A node's number is that of its first path's entry at its
depth, and its parent is the node of the entry one depth up: both read back from a scratch row of the output's row
(written, then a block barrier, then gathered). New nodes are stored at the slot of their number, slot 0 and the
slots past the last node get the root's token, parent -1 and depth 0, so each slot is written exactly once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["path_trie_triton"]


@triton.jit
def _trie_kernel(
    paths_ptr,  # [B, M, L] int64, strided
    root_ptr,  # [B] int64, strided
    tokens_ptr,  # [B, S] int64 out
    parents_ptr,  # [B, S] int64 out
    depth_ptr,  # [B, S] int64 out
    valid_ptr,  # [B, S] uint8 out (viewed as bool)
    num_ptr,  # [B] int64 out
    scratch_ptr,  # [B, 2, E] int32: node numbers of the new entries, then of every entry
    M,
    L,
    S,
    stride_pb,
    stride_pm,
    stride_pl,
    stride_root,
    BLOCK_E: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    E = M * L
    e = tl.arange(0, BLOCK_E)
    inside = e < E
    m = e // L
    lvl = e % L
    row = paths_ptr + b * stride_pb
    tok = tl.load(row + m * stride_pm + lvl * stride_pl, mask=inside, other=0)
    first = m
    for mp in range(0, M):
        agree = inside & (mp < m)
        for j in range(0, L):
            theirs = tl.load(row + mp * stride_pm + j * stride_pl)
            ours = tl.load(row + m * stride_pm + j * stride_pl, mask=inside & (j <= lvl), other=0)
            agree = agree & ((j > lvl) | (theirs == ours))
        first = tl.where(agree & (first == m), mp, first)
    new = inside & (first == m)
    order = tl.cumsum(new.to(tl.int32), 0)  # the node number of a new entry
    count = tl.sum(new.to(tl.int32), 0) + 1  # nodes with the root
    scratch = scratch_ptr + b * 2 * E
    tl.store(scratch + e, order, mask=inside)
    tl.debug_barrier()
    node = tl.load(scratch + first * L + lvl, mask=inside, other=0)  # the node of (m, :l + 1), new or shared
    tl.store(scratch + E + e, node, mask=inside)
    tl.debug_barrier()
    parent = tl.load(scratch + E + e - 1, mask=inside & (lvl > 0), other=0)  # the node one depth up (0: the root)
    out = b * S
    tl.store(tokens_ptr + out + order, tok, mask=new)
    tl.store(parents_ptr + out + order, parent, mask=new)
    tl.store(depth_ptr + out + order, lvl + 1, mask=new)
    slots = tl.arange(0, BLOCK_S)
    in_row = slots < S
    rest = in_row & ((slots == 0) | (slots >= count))
    root = tl.load(root_ptr + b * stride_root)
    tl.store(tokens_ptr + out + slots, tl.zeros([BLOCK_S], dtype=tl.int64) + root, mask=rest)
    tl.store(parents_ptr + out + slots, tl.full([BLOCK_S], -1, dtype=tl.int64), mask=rest)
    tl.store(depth_ptr + out + slots, tl.zeros([BLOCK_S], dtype=tl.int64), mask=rest)
    tl.store(valid_ptr + out + slots, (slots < count).to(tl.uint8), mask=in_row)
    tl.store(num_ptr + b, count.to(tl.int64))


def path_trie_triton(paths: torch.Tensor, root: torch.Tensor, num_slots: int):
    """``path_trie_reference(paths, root, num_slots)`` in one launch (arguments checked by the package's entry)."""
    batch, num, length = paths.shape
    device = paths.device
    root = root.reshape(-1)
    tokens = torch.empty((batch, num_slots), dtype=torch.long, device=device)
    parents = torch.empty((batch, num_slots), dtype=torch.long, device=device)
    depth = torch.empty((batch, num_slots), dtype=torch.long, device=device)
    valid = torch.empty((batch, num_slots), dtype=torch.uint8, device=device)
    count = torch.empty(batch, dtype=torch.long, device=device)
    scratch = torch.empty((batch, 2, num * length), dtype=torch.int32, device=device)
    _trie_kernel[(batch,)](
        paths, root, tokens, parents, depth, valid, count, scratch, num, length, num_slots,
        paths.stride(0), paths.stride(1), paths.stride(2), root.stride(0),
        BLOCK_E=triton.next_power_of_2(num * length), BLOCK_S=triton.next_power_of_2(num_slots),
        num_warps=4 if num * length <= 256 else 8,
    )  # fmt: skip
    return tokens, parents, depth, valid.view(torch.bool), count
