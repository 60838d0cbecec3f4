"""The round's tree mask and acceptance walk, one Triton launch each (capture-safe: no host reads).

``tree_mask_triton``: one program per (tree row, block of key columns). The program walks its row's parent chain
(a fixed number of hops, masked past the root) and marks the columns ``prefix + ancestor``; columns before
``prefix`` are visible to real rows. ``accept_paths_triton``: one program per tree, holding its ``S`` slots as
vectors, walks from the root, at most ``max_depth`` steps, each step one min-reduction over the slots. Both equal
the torch references in ``specdec.kernels.tree_accept`` bit for bit (``tests/kernels/test_tree_accept.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.types import Accept, AcceptRow

__all__ = ["accept_path_triton", "mask_hops", "tree_mask_triton", "tree_masks_triton", "verify_inputs_triton"]


@triton.jit
def _tree_mask_kernel(
    parents_ptr,  # [B, S] int64, parents[b, i] < i, -1 for the root and padding
    valid_ptr,  # [B, S] bool
    prefix_ptr,  # [B] int64: the key slot of each tree's node 0
    out_ptr,  # [B, S, C] out, the additive mask
    depth_ptr,  # [B, S] int64, read when SLOTS
    positions_ptr,  # [B, S] int64 out when SLOTS: prefix + depth
    write_ptr,  # [B, S] int64 out when SLOTS: prefix + slot
    lengths_ptr,  # [B] int64 out when SLOTS: prefix + S
    S,
    C,
    HOPS: tl.constexpr,
    FILL: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SLOTS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * S + slot
    seq = row // S
    slot = row - seq * S
    base = seq * S
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    start = tl.load(prefix_ptr + seq)
    # the verify's position, key slot and read length of the row, written by its first block of columns
    if SLOTS:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if tl.program_id(1) == 0:
            tl.store(positions_ptr + row, start + tl.load(depth_ptr + row))
            tl.store(write_ptr + row, start + slot)
            if slot == 0:
                tl.store(lengths_ptr + seq, start + S)
    rel = cols.to(tl.int64) - start
    row_valid = tl.load(valid_ptr + row).to(tl.int1)
    cur = slot
    seen = ((rel < 0) & row_valid) | (rel == cur)
    for _ in tl.static_range(HOPS):  # one ancestor per hop; past the root cur stays -1 and loads nothing
        up = cur >= 0
        cur = tl.load(parents_ptr + base + cur, mask=up, other=-1)
        seen = seen | ((rel == cur) & (cur >= 0))
    value = tl.where(seen, 0.0, FILL).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * C + cols, value, mask=cols < C)


def mask_hops(max_depth: int) -> int:
    """Parent hops the mask kernel walks: ``2**bit_length(max_depth) - 1``, exactly the distances that
    ``ancestor_matrix``'s ``bit_length(max_depth)`` pointer-jumping rounds cover (``max_depth`` itself when it is
    one less than a power of two, e.g. 15)."""
    return (1 << max_depth.bit_length()) - 1


def tree_mask_triton(
    parents: torch.Tensor,
    valid: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The additive attention mask of a tree round in one launch (arguments as ``tree_mask_reference``).

    Returns:
        torch.Tensor: ``[1, 1, S, capacity]`` of ``dtype``: 0 where visible, ``torch.finfo(dtype).min`` elsewhere.
    """
    return tree_masks_triton(parents[None], valid[None], prefix.reshape(1), capacity, max_depth, dtype)


def tree_masks_triton(
    parents: torch.Tensor,
    valid: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The masks of a batch of trees (``parents``, ``valid`` ``[B, S]``, ``prefix [B]``) in one launch:
    ``[B, 1, S, capacity]``."""
    return _masks(parents, valid, prefix, capacity, max_depth, dtype, None)[0]


def verify_inputs_triton(
    parents: torch.Tensor,
    valid: torch.Tensor,
    depth: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tree_masks_triton``'s masks and, from the same launch, the verify's ``prefix + depth``, ``prefix + slot``
    (``[B, S]`` int64 each) and ``prefix + S`` (``[B]``)."""
    return _masks(parents, valid, prefix, capacity, max_depth, dtype, depth)


def _masks(parents, valid, prefix, capacity, max_depth, dtype, depth):
    batch, slots = parents.shape
    out = torch.empty(batch, 1, slots, capacity, dtype=dtype, device=parents.device)
    block = min(triton.next_power_of_2(capacity), 1024)
    grid = (batch * slots, triton.cdiv(capacity, block))
    extra = depth is not None
    positions = torch.empty(batch, slots, dtype=torch.long, device=parents.device) if extra else prefix
    write = torch.empty(batch, slots, dtype=torch.long, device=parents.device) if extra else prefix
    lengths = torch.empty(batch, dtype=torch.long, device=parents.device) if extra else prefix
    _tree_mask_kernel[grid](
        parents.contiguous(), valid.contiguous(), prefix.contiguous(), out,
        depth.contiguous() if extra else prefix, positions, write, lengths, slots, capacity,
        HOPS=mask_hops(max_depth), FILL=torch.finfo(dtype).min, BLOCK_C=block, SLOTS=extra,
        num_warps=4 if block >= 512 else 1,
    )  # fmt: skip
    return out, positions, write, lengths
    return out


@triton.jit
def _accept_path_kernel(
    tokens_ptr,  # [S] int64
    parents_ptr,  # [S] int64
    valid_ptr,  # [S] bool, a prefix of the slots
    choices_ptr,  # [S] int64, the target's token at each slot
    path_ptr,  # [P] int64 out
    num_ptr,  # [] int64 out
    new_ptr,  # [P] int64 out
    S,
    P: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    row = tl.program_id(0)  # one tree per program: inputs [B, S], outputs [B, P] and [B], contiguous
    tokens_ptr += row * S
    parents_ptr += row * S
    valid_ptr += row * S
    choices_ptr += row * S
    path_ptr += row * P
    new_ptr += row * P
    num_ptr += row
    slot = tl.arange(0, BLOCK_S)
    inside = slot < S
    parents = tl.load(parents_ptr + slot, mask=inside, other=-1)
    valid = tl.load(valid_ptr + slot, mask=inside, other=0).to(tl.int1) & inside
    has_parent = valid & (parents >= 0)
    tokens = tl.load(tokens_ptr + slot, mask=has_parent, other=0)
    want = tl.load(choices_ptr + parents, mask=has_parent, other=0)
    # a slot can be the next step only if it is real and carries its parent's choice; the walk takes the first
    # such child of the current node (the smallest slot), as walk_tree among duplicate siblings
    good = has_parent & (tokens == want)
    parent32 = tl.where(good, parents, -1).to(tl.int32)
    step = tl.arange(0, BLOCK_P)
    alive = tl.load(valid_ptr).to(tl.int1)  # the root, slot 0
    cur = tl.zeros([], dtype=tl.int32)
    num = alive.to(tl.int64)
    path = tl.zeros([BLOCK_P], dtype=tl.int64)
    drafts = tl.zeros([BLOCK_P], dtype=tl.int64)
    for h in tl.static_range(P - 1):
        nxt = tl.min(tl.where(parent32 == cur, slot, BLOCK_S), axis=0)
        found = alive & (nxt < BLOCK_S)
        cur = tl.where(found, nxt, cur)
        path = tl.where(step == h + 1, cur.to(tl.int64), path)  # a stop repeats the last node
        drafts = tl.where(step == h, tl.load(tokens_ptr + cur), drafts)  # used only below num - 1
        num += found.to(tl.int64)
        alive = found
    bonus = tl.load(choices_ptr + cur)
    new = tl.where(step < num - 1, drafts, tl.where(step == num - 1, bonus, 0))
    tl.store(path_ptr + step, path, mask=step < P)
    tl.store(new_ptr + step, new, mask=step < P)
    tl.store(num_ptr, num)


def accept_path_triton(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    valid: torch.Tensor,
    choices: torch.Tensor,
    max_depth: int,
) -> AcceptRow:
    """The accepted path of a tree round in one launch (arguments as ``accept_path_reference``; the depths are
    not read: the walk counts them).

    Returns:
        AcceptRow: ``path [P]``, ``num_path`` (0-d) and ``tokens [P]``, int64, ``P = max_depth + 1``.
    """
    accept = accept_paths_triton(tokens[None], parents[None], valid[None], choices[None], max_depth)
    return AcceptRow(path=accept.path[0], num_path=accept.num_path[0], tokens=accept.tokens[0])


def accept_paths_triton(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    valid: torch.Tensor,
    choices: torch.Tensor,
    max_depth: int,
) -> Accept:
    """The accepted paths of a batch of trees (``[B, S]`` each) in one launch, one program per tree (arguments as
    ``accept_path_reference``, per row).

    Returns:
        Accept: ``path [B, P]``, ``num_path [B]`` and ``tokens [B, P]``, int64, ``P = max_depth + 1``.
    """
    batch, slots = tokens.shape
    steps = max_depth + 1
    device = tokens.device
    path = torch.empty(batch, steps, dtype=torch.long, device=device)
    num_path = torch.empty(batch, dtype=torch.long, device=device)
    new_tokens = torch.empty(batch, steps, dtype=torch.long, device=device)
    _accept_path_kernel[(batch,)](
        tokens.contiguous(), parents.contiguous(), valid.contiguous(), choices.contiguous(),
        path, num_path, new_tokens, slots,
        P=steps, BLOCK_S=max(triton.next_power_of_2(slots), 2), BLOCK_P=max(triton.next_power_of_2(steps), 2),
        num_warps=1,
    )  # fmt: skip
    return Accept(path=path, num_path=num_path, tokens=new_tokens)
