"""A round of recursive rejection sampling in one Triton launch (capture-safe: no host reads).

One program per (row, node). The setup: it scans its row's parents in blocks of slots and writes the node's
children by rank (a cumulative sum of the matches) and their tokens to scratch rows, then copies the node's ``p``
into its row of ``r``. The loop: it tests the node's children in rank order (a loop of ``K`` steps) until one is
accepted, loading each child's token, uniform and ``q_c(c)`` (without replacement: divided by ``kept``, 1 minus the
earlier siblings' drawn mass; a repeat of an earlier sibling's token is no draw). A drawable child is accepted iff
``u * q_c(c) < r(token)``; a rejected one reduces ``r`` (``_reject``) in two passes over the vocabulary in blocks:
the residual mass ``sum(max(r - q_c, 0))``, then ``r <- max(r - q_c, 0) / mass`` (``r`` left as is when the mass is
0). ``q_c`` is the child's row of ``q`` (without replacement: divided by ``kept``, zero at the earlier siblings'
tokens). The row of ``r`` lives in global memory (the output itself) between passes; a barrier after each write
makes it visible to the program's other threads. ``p``, ``q``, ``r`` and the sums over them in ``p``'s dtype
(float32 in the round, float64 allowed), the uniforms and ``u * q_c(c)`` in float64, as the reference computes them.
Equal to ``tree_rejection_round_reference``
(``nxt`` exactly, ``r`` up to the order of the mass's sum: ``tests/kernels/test_tree_rejection.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels._triton import power_of_two_block
from specdec.kernels.triton_ops import UNIFORM_GRID, UNIFORM_TOP, pair_strides, uniforms_at

__all__ = ["MAX_BLOCK", "MAX_BLOCK_F32", "MAX_SLOT_BLOCK", "rejection_walk_triton", "tree_rejection_round_triton"]

MAX_BLOCK = 1024
"""Vocabulary entries a program handles per block in float64 (fewer when ``V`` is smaller)."""

MAX_BLOCK_F32 = 4096
"""The same in float32 (the round's dtype): half the bytes per entry, so four times the entries with eight warps;
a rejection's two passes over ``V = 8192`` then take two blocks each instead of eight."""

MAX_SLOT_BLOCK = 1024
"""Slots the fused round's setup scans per block (fewer when ``S`` is smaller)."""

@triton.jit
def _tree_rejection_round_kernel(
    tree_tokens_ptr,  # [B, S] int64, contiguous
    parents_ptr,  # [B, S] int64, contiguous
    depth_ptr,  # [B, S] int64, contiguous
    valid_ptr,  # [B, S] bool, contiguous
    p_ptr,  # [B, S, V] float32 or float64, strided
    q_ptr,  # [B, S, V] p's dtype, strided (Q_BY_DEPTH: [B, D, V], slot s reading row clamp(depth_s - 1, 0, D - 1))
    test_ptr,  # [B, S] float64, strided: each slot's uniform (PAIR: [B, S, 2] float32, its two halves)
    table_ptr,  # [B, S, K] int64 scratch: each node's child slot by rank (S where none)
    ranked_ptr,  # [B, S, K] int64 scratch: the children's tokens by rank
    r_ptr,  # [B, S, V] p's dtype out
    nxt_ptr,  # [B, S] int64 out
    S,
    V,
    p_sb,
    p_ss,
    p_sv,
    q_sb,
    q_ss,
    q_sv,
    t_sb,
    t_ss,
    t_sp,
    q_rows,
    K,
    TINY: tl.constexpr,
    REPLACEMENT: tl.constexpr,
    Q_BY_DEPTH: tl.constexpr,
    PAIR: tl.constexpr,
    GRID: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * S + node
    seq = row // S
    node = row - seq * S
    slots_row = seq * S
    ranks = row * K
    # the setup: the node's children in slot order (valid slots of positive depth whose parent is the node)
    spots = tl.arange(0, BLOCK_S)
    last = tl.load(tree_tokens_ptr + slots_row + S - 1)  # the token a missing rank reads (the reference's clamp)
    for start in range(0, K, BLOCK_S):
        k = start + spots
        tl.store(table_ptr + ranks + k, tl.zeros([BLOCK_S], dtype=tl.int64) + S, mask=k < K)
        tl.store(ranked_ptr + ranks + k, tl.zeros([BLOCK_S], dtype=tl.int64) + last, mask=k < K)
    tl.debug_barrier()
    count = node * 0  # children found in the earlier blocks
    for start in range(0, S, BLOCK_S):
        slot = start + spots
        inside = slot < S
        parent = tl.load(parents_ptr + slots_row + slot, mask=inside, other=-1)
        depth = tl.load(depth_ptr + slots_row + slot, mask=inside, other=0)
        valid = tl.load(valid_ptr + slots_row + slot, mask=inside, other=0).to(tl.int1)
        child = inside & valid & (depth > 0) & (parent == node)
        flag = child.to(tl.int64)
        rank = count + tl.cumsum(flag, 0) - flag
        keep = child & (rank < K)
        tl.store(table_ptr + ranks + rank, slot.to(tl.int64), mask=keep)
        tl.store(ranked_ptr + ranks + rank, tl.load(tree_tokens_ptr + slots_row + slot, mask=keep, other=0),
                 mask=keep)  # fmt: skip
        count += tl.sum(flag, 0)
    lanes = tl.arange(0, BLOCK)
    p_row = p_ptr + seq * p_sb + node * p_ss
    r_row = r_ptr + row * V
    for start in range(0, V, BLOCK):
        cols = start + lanes
        inside = cols < V
        tl.store(r_row + cols, tl.load(p_row + cols * p_sv, mask=inside), mask=inside)
    tl.debug_barrier()  # the ranked children and r[token] below are read by every thread
    nxt = node  # the accepted child, the node itself while none is
    # without replacement: the cumulative sum of q_c(c) over ranks (q's dtype, as the reference's cumsum)
    test_row = test_ptr + seq * t_sb
    total = tl.load(test_row).to(q_ptr.dtype.element_ty) * 0.0
    kept = total + 1.0
    for k in range(K):  # a loop, not unrolled: compiling stays one kernel's work whatever the tree's width
        child = tl.load(table_ptr + ranks + k)
        slot = tl.minimum(child, S - 1)
        token = tl.load(ranked_ptr + ranks + k)
        q_slot = slot
        if Q_BY_DEPTH:  # the child's depth's row of q
            q_slot = tl.minimum(tl.maximum(tl.load(depth_ptr + slots_row + slot) - 1, 0), q_rows - 1)
        q_row = q_ptr + seq * q_sb + q_slot * q_ss
        q_tok = tl.load(q_row + token * q_sv)  # q_c(c), before removal
        if not REPLACEMENT:  # weighed against q without the earlier siblings' tokens; a repeat is no draw
            repeat = child < 0
            for j in range(k):
                repeat = repeat | (tl.load(ranked_ptr + ranks + j) == token)
            drawn = tl.where(repeat, 0.0, q_tok)
            total += drawn
            kept = tl.maximum(1.0 - (total - drawn), TINY)
            q_tok = tl.where(repeat, 0.0, q_tok / kept)
        u = uniforms_at(test_row + slot * t_ss, t_sp, True, PAIR, GRID, TOP)
        weight = u * q_tok  # accepted iff u q_c(c) < r(c)
        live = (child < S) & (q_tok > 0) & (nxt == node)
        if live:
            if weight < tl.load(r_row + token):
                nxt = child
            else:  # rejected: r <- norm(max(r - q_c, 0)), unless that mass is 0
                _reject(q_row, q_sv, r_row, ranked_ptr + ranks, kept, V, TINY, k,
                        REPLACEMENT, BLOCK)  # fmt: skip
    tl.store(nxt_ptr + row, nxt)


@triton.jit
def _reject(q_row, q_sv, r_row, ranked_row, kept, V, TINY: tl.constexpr, k,
            REPLACEMENT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """A rejected child: ``r <- max(r - q_c, 0) / mass`` over the vocabulary in blocks, unless the mass is 0."""
    lanes = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], dtype=r_row.dtype.element_ty)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        inside = cols < V
        qk = _child_q(q_row, q_sv, ranked_row, kept, cols, inside, k, REPLACEMENT)
        total += tl.maximum(tl.load(r_row + cols, mask=inside, other=0.0) - qk, 0.0)
    mass = tl.sum(total, axis=0)
    if mass > 0:
        scale = tl.maximum(mass, TINY)
        for start in range(0, V, BLOCK):
            cols = start + lanes
            inside = cols < V
            qk = _child_q(q_row, q_sv, ranked_row, kept, cols, inside, k, REPLACEMENT)
            r = tl.load(r_row + cols, mask=inside, other=0.0)
            tl.store(r_row + cols, tl.maximum(r - qk, 0.0) / scale, mask=inside)
        tl.debug_barrier()


@triton.jit
def _child_q(q_row, q_sv, ranked_row, kept, cols, inside, k, REPLACEMENT: tl.constexpr):
    """A block of the rejected child's ``q_c``: its row of ``q`` (without replacement: divided by ``kept``, zero at
    the earlier siblings' tokens, which are no draw now)."""
    qk = tl.load(q_row + cols * q_sv, mask=inside, other=0.0)
    if not REPLACEMENT:
        qk = qk / kept
        for j in range(k):
            qk = tl.where(cols == tl.load(ranked_row + j), 0.0, qk)
    return qk


def tree_rejection_round_triton(
    tree_tokens: torch.Tensor,
    tree_parents: torch.Tensor,
    tree_depth: torch.Tensor,
    tree_valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    test: torch.Tensor,
    max_children: int | None,
    replacement: bool,
    *,
    q_by_depth: bool = False,
    block: int | None = None,
    slot_block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A round (setup and sibling-rank loop) in one launch; arguments as ``tree_rejection_round_reference``
    (``test`` any strides); ``q_by_depth``: ``q`` is ``[B, D, V]``, one row per depth, slot ``s`` reading row
    ``clamp(depth_s - 1, 0, D - 1)`` (as ``tree_rejection_round``'s); ``test`` ``[B, S]`` float64 or ``[B, S, 2]``
    float32 (each slot's uniform as two halves, made in the kernel);
    ``block``: vocabulary entries per block, a power of two (default ``min(MAX_BLOCK, next_power_of_2(V))``,
    ``MAX_BLOCK_F32`` in float32);
    ``slot_block``: slots the setup scans per block, a power of two (default ``min(MAX_SLOT_BLOCK,
    next_power_of_2(S))``).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``r [B, S, V]`` (p's dtype) and ``nxt [B, S]`` int64.
    """
    from specdec.kernels.tree_rejection.reference import rank_width

    batch, slots, vocab = p.shape
    width = rank_width(slots, max_children)
    block = power_of_two_block("block", block, vocab, MAX_BLOCK_F32 if p.dtype == torch.float32 else MAX_BLOCK)
    slot_block = power_of_two_block("slot_block", slot_block, slots, MAX_SLOT_BLOCK)
    r = torch.empty(batch, slots, vocab, dtype=p.dtype, device=p.device)
    nxt = torch.empty(batch, slots, dtype=torch.long, device=p.device)
    table = torch.empty(batch, slots, width, dtype=torch.long, device=p.device)
    ranked = torch.empty(batch, slots, width, dtype=torch.long, device=p.device)
    _tree_rejection_round_kernel[(batch * slots,)](
        tree_tokens.contiguous(), tree_parents.contiguous(), tree_depth.contiguous(), tree_valid.contiguous(),
        p, q, test, table, ranked, r, nxt,
        slots, vocab, *p.stride(), *q.stride(), *pair_strides(test), q.shape[1], width,
        TINY=torch.finfo(p.dtype).tiny, REPLACEMENT=bool(replacement), Q_BY_DEPTH=bool(q_by_depth),
        PAIR=test.dim() == 3, GRID=UNIFORM_GRID, TOP=UNIFORM_TOP, BLOCK=block,
        BLOCK_S=slot_block, num_warps=8 if block >= 2048 else 4 if block >= 512 else 1,
    )  # fmt: skip
    return r, nxt


@triton.jit
def _walk_kernel(
    tokens_ptr,  # [B, S] int64, contiguous
    depth_ptr,  # [B, S] int64, contiguous
    nxt_ptr,  # [B, S] int64, contiguous: each node's accepted child (the node itself where none)
    r_ptr,  # [B, S, V] float32 / float64, strided
    u_ptr,  # [B, S] float64, strided: each slot's bonus uniform (PAIR: [B, S, 2] float32, its two halves)
    path_ptr,  # [B, P] int64 out
    num_ptr,  # [B] int64 out
    new_ptr,  # [B, P] int64 out
    S,
    V,
    r_sb,
    r_ss,
    r_sv,
    u_sb,
    u_ss,
    u_sp,
    P: tl.constexpr,
    PAIR: tl.constexpr,
    GRID: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    slot = tl.arange(0, BLOCK_S)
    nxt = tl.load(nxt_ptr + seq * S + slot, mask=slot < S, other=0)
    step = tl.arange(0, BLOCK_P)
    cur = tl.zeros([], dtype=tl.int64)  # the root
    path = tl.zeros([BLOCK_P], dtype=tl.int64)
    drafts = tl.zeros([BLOCK_P], dtype=tl.int64)
    for h in range(P - 1):  # slot h + 1 of the path: nxt^(h+1)(0); past the walk's end the end node repeats
        cur = tl.sum(tl.where(slot == cur, nxt, 0), axis=0)
        path = tl.where(step == h + 1, cur, path)
        drafts = tl.where(step == h, tl.load(tokens_ptr + seq * S + cur), drafts)  # read only below the end's depth
    end_depth = tl.load(depth_ptr + seq * S + cur)
    # the bonus: the end node's r by inverse CDF, its float64 cumulative sum over blocks of the vocabulary run
    # twice in one order (so the second run's last value is the first's total exactly and u * total falls inside)
    at = uniforms_at(u_ptr + seq * u_sb + cur * u_ss, u_sp, True, PAIR, GRID, TOP)
    row = r_ptr + seq * r_sb + cur * r_ss
    lanes = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        cols = start + lanes
        x = tl.load(row + cols * r_sv, mask=cols < V, other=0.0).to(tl.float64)
        total = tl.max(total + tl.cumsum(x, 0), axis=0)  # the block's last running value (non-decreasing)
    at = at * total
    running = tl.zeros([], dtype=tl.float64)
    bonus = tl.zeros([], dtype=tl.int64)
    for start in range(0, V, BLOCK_V):
        cols = start + lanes
        x = tl.load(row + cols * r_sv, mask=cols < V, other=0.0).to(tl.float64)
        cdf = running + tl.cumsum(x, 0)
        bonus += tl.sum(((cdf <= at) & (cols < V)).to(tl.int64), axis=0)  # searchsorted(cdf, at, right=True)
        running = tl.max(cdf, axis=0)
    new = tl.where(step < end_depth, drafts, tl.where(step == end_depth, bonus, 0))
    tl.store(path_ptr + seq * P + step, path, mask=step < P)
    tl.store(new_ptr + seq * P + step, new, mask=step < P)
    tl.store(num_ptr + seq, end_depth + 1)


def rejection_walk_triton(tokens, depth, nxt, r, u, max_depth: int, *, block: int | None = None):
    """``rejection_walk_reference`` in one launch, a program per sequence (arguments as there, ``u`` also its
    ``[B, S, 2]`` float32 halves; ``S <= MAX_WALK_SLOTS`` of the package; not checked here); ``block``: vocabulary
    entries per block of the bonus's cumulative sum.

    Returns:
        Accept: ``path`` / ``tokens [B, P]`` and ``num_path [B]``, int64, ``P = max_depth + 1``.
    """
    from specdec.types import Accept

    batch, slots = tokens.shape
    vocab = r.shape[-1]
    steps = max_depth + 1
    block = power_of_two_block("block", block, vocab, 2048)
    path = torch.empty(batch, steps, dtype=torch.long, device=tokens.device)
    num_path = torch.empty(batch, dtype=torch.long, device=tokens.device)
    new = torch.empty(batch, steps, dtype=torch.long, device=tokens.device)
    _walk_kernel[(batch,)](
        tokens.contiguous(), depth.contiguous(), nxt.contiguous(), r, u, path, num_path, new, slots, vocab,
        *r.stride(), *pair_strides(u), P=steps, PAIR=u.dim() == 3, GRID=UNIFORM_GRID, TOP=UNIFORM_TOP,
        BLOCK_S=max(triton.next_power_of_2(slots), 2),
        BLOCK_P=max(triton.next_power_of_2(steps), 2), BLOCK_V=block, num_warps=4,
    )  # fmt: skip
    return Accept(path=path, num_path=num_path, tokens=new)
