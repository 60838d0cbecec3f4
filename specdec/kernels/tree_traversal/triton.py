"""A round of traversal verification in two Triton launches (capture-safe: no host reads).

``_setup_kernel``, one program per (row, node): the node's token probability under the distribution it was drawn
from, ``Q_a(x_a)``, and (without replacement) the mass ``k_a`` of its q once its earlier siblings' tokens are
removed (a sum over the vocabulary in blocks), so that ``Q_a = q_a / k_a`` off those tokens.

``_traversal_kernel``, one program per sequence, walks the tree in post-order as the reference's steps do, with the
per-node state in registers (a lane per slot): the weights ``w``, each node's ``P_parent(x_node)`` and its row of
``P``. Entering a node sets its weight from its parent's current state; a leaf-to-root step tests a node (accepted
iff its uniform is below ``w``) and, on a rejection, corrects the parent in one pass over the vocabulary:
``R = max(0, w_b P_b - Q_a)`` is written unnormalised to a spare row of a per-sequence pool and summed; if its mass
is positive the row becomes the parent's ``P`` (read as ``R / mass``, the reference's division) and the parent's
children's ``P_b(x_c)`` follow from their own values, else the parent keeps its row. Under a parent of weight 0
a rejection corrects nothing (the residual is 0) and skips the pass. Then the path from the root to the end node,
and the bonus drawn from the end node's ``P`` by inverse CDF on a float64 cumulative sum (as ``draws.categorical``).
Sums over the vocabulary run in another order than torch's: equal to ``traversal_round_reference`` up to that
rounding (``tests/kernels/test_tree_traversal.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels._triton import power_of_two_block
from specdec.kernels.triton_ops import UNIFORM_GRID, UNIFORM_TOP, pair_strides, uniforms_at

__all__ = ["MAX_BLOCK", "MAX_BLOCK_F32", "traversal_round_triton"]

MAX_BLOCK = 2048
"""Vocabulary entries a program handles per block in float64 (fewer when ``V`` is smaller)."""

MAX_BLOCK_F32 = 4096
"""The same in float32 (the round's dtype)."""



@triton.jit
def _setup_kernel(
    tokens_ptr,  # [B, S] int64, contiguous
    parents_ptr,  # [B, S] int64, contiguous
    depth_ptr,  # [B, S] int64, contiguous
    valid_ptr,  # [B, S] bool, contiguous
    q_ptr,  # [B, S, V] float32 / float64, strided (Q_BY_DEPTH: [B, D, V], node a reading row depth_a - 1)
    qtok_ptr,  # [B, S] q's dtype out: Q_a(x_a)
    kept_ptr,  # [B, S] q's dtype out: k_a clamped to TINY (1 with replacement)
    S,
    V,
    q_sb,
    q_ss,
    q_sv,
    q_rows,
    TINY: tl.constexpr,
    REPLACEMENT: tl.constexpr,
    Q_BY_DEPTH: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * S + node
    seq = row // S
    node = row - seq * S
    token = tl.load(tokens_ptr + row)
    q_row = q_ptr + seq * q_sb + _q_index(node, tl.load(depth_ptr + row), q_rows, Q_BY_DEPTH) * q_ss
    q_tok = tl.load(q_row + token * q_sv)
    if REPLACEMENT:
        tl.store(qtok_ptr + row, q_tok)
        tl.store(kept_ptr + row, q_tok * 0.0 + 1.0)
    else:
        # the earlier siblings: valid slots before the node, of positive depth, with its parent
        slot = tl.arange(0, BLOCK_S)
        inside = slot < S
        parent = tl.load(parents_ptr + row)
        parents = tl.load(parents_ptr + seq * S + slot, mask=inside, other=-2)
        depths = tl.load(depth_ptr + seq * S + slot, mask=inside, other=0)
        valids = tl.load(valid_ptr + seq * S + slot, mask=inside, other=0).to(tl.int1)
        earlier = inside & valids & (depths > 0) & (parents == parent) & (slot < node)
        tokens = tl.load(tokens_ptr + seq * S + slot, mask=earlier, other=-1)
        rank = tl.cumsum(earlier.to(tl.int32), 0) - 1  # among the earlier siblings
        count = tl.sum(earlier.to(tl.int32), 0)
        lanes = tl.arange(0, BLOCK)
        total = tl.zeros([BLOCK], dtype=q_ptr.dtype.element_ty)
        for start in range(0, V, BLOCK):
            cols = start + lanes
            x = tl.load(q_row + cols * q_sv, mask=cols < V, other=0.0)
            for k in range(count):
                drawn = tl.sum(tl.where(earlier & (rank == k), tokens, 0), 0)
                x = tl.where(cols == drawn, 0.0, x)
            total += x
        kept = tl.maximum(tl.sum(total, 0), TINY)
        repeat = tl.sum((tokens == token).to(tl.int32), 0) > 0  # the node repeats an earlier sibling: no draw
        tl.store(qtok_ptr + row, tl.where(repeat, 0.0, q_tok) / kept)
        tl.store(kept_ptr + row, kept)


@triton.jit
def _q_index(node, depth, q_rows, Q_BY_DEPTH: tl.constexpr):
    """The row of ``q`` node ``node`` (at ``depth``) was drawn from: its own, or (``Q_BY_DEPTH``) its depth's,
    ``clamp(depth - 1, 0, q_rows - 1)``."""
    return tl.minimum(tl.maximum(depth - 1, 0), q_rows - 1) if Q_BY_DEPTH else node


@triton.jit
def _pick(vec, slot, at):
    """Lane ``at`` of ``vec`` (a scalar)."""
    return tl.sum(tl.where(slot == at, vec, 0), 0)


@triton.jit
def _traversal_kernel(
    tokens_ptr,  # [B, S] int64, contiguous
    parents_ptr,  # [B, S] int64, contiguous
    depth_ptr,  # [B, S] int64, contiguous
    valid_ptr,  # [B, S] bool, contiguous
    p_ptr,  # [B, S, V] float32 / float64, strided
    q_ptr,  # [B, S, V] p's dtype, strided (Q_BY_DEPTH: [B, D, V], one row per depth)
    qtok_ptr,  # [B, S] p's dtype: Q_a(x_a) (the setup's)
    kept_ptr,  # [B, S] p's dtype: k_a (the setup's)
    test_ptr,  # [B, S] float64, strided: each node's test uniform (PAIR: [B, S, 2] float32, its two halves)
    final_ptr,  # [B, S] float64, strided: each node's bonus uniform (PAIR: as test)
    pool_ptr,  # [B, S + 1, V] p's dtype scratch: corrected rows (unnormalised)
    path_ptr,  # [B, P] int64 out
    num_ptr,  # [B] int64 out
    new_ptr,  # [B, P] int64 out
    end_ptr,  # [B, V] p's dtype out (with END): the end node's P, the bonus's distribution
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
    f_sb,
    f_ss,
    f_sp,
    q_rows,
    TINY: tl.constexpr,
    REPLACEMENT: tl.constexpr,
    Q_BY_DEPTH: tl.constexpr,
    PAIR: tl.constexpr,
    GRID: tl.constexpr,
    TOP: tl.constexpr,
    P: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    END: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    base = seq * S
    slot = tl.arange(0, BLOCK_S).to(tl.int64)
    inside = slot < S
    tokens = tl.load(tokens_ptr + base + slot, mask=inside, other=0)
    parents = tl.load(parents_ptr + base + slot, mask=inside, other=-1)
    depths = tl.load(depth_ptr + base + slot, mask=inside, other=0)
    valid = tl.load(valid_ptr + base + slot, mask=inside, other=0).to(tl.int1)
    real = inside & valid & (depths > 0)  # the nodes that hang from a parent
    above = tl.maximum(parents, 0)
    qtok = tl.load(qtok_ptr + base + slot, mask=real, other=0.0)
    live = real & (qtok > 0)
    kept = tl.load(kept_ptr + base + slot, mask=real, other=1.0)
    test = uniforms_at(test_ptr + seq * t_sb + slot * t_ss, t_sp, inside, PAIR, GRID, TOP)
    # P_parent(x_node) for every node, p's until the parent is corrected
    ptok = tl.load(p_ptr + seq * p_sb + above * p_ss + tokens * p_sv, mask=real, other=0.0)
    w = tl.zeros([BLOCK_S], dtype=qtok.dtype) + 1.0  # the root's stays 1; the others are set on entry
    scale = tl.zeros([BLOCK_S], dtype=qtok.dtype) + 1.0  # a corrected node's mass: its P is pool[row] / scale
    pool_row = tl.zeros([BLOCK_S], dtype=tl.int64) - 1  # the pool row holding its P (-1: p's own row)
    spare = base * 0 + S  # the pool row the next correction writes (then each node's own, once first corrected)
    none = S  # no such slot
    # descend from the root to its first leaf, entering each node on the way
    node = tl.min(tl.where(real & (parents == 0), slot, none), 0)
    going = node < none
    descending = going
    end = node * 0  # the root, until a node is accepted
    while going:
        if descending:  # enter node: its weight from its parent's state, then its first child (if any)
            parent = _pick(above, slot, node)
            w_parent = _pick(w, slot, parent)
            fresh = tl.minimum(w_parent * _pick(ptok, slot, node) / tl.maximum(_pick(qtok, slot, node), TINY), 1.0)
            w = tl.where(slot == node, tl.where(_pick(live.to(tl.int32), slot, node) > 0, fresh, 0.0), w)
            child = tl.min(tl.where(real & (parents == node), slot, none), 0)
            descending = child < none
            node = tl.where(descending, child, node)
        else:  # test node (all its children rejected), then on to its next sibling's subtree or its parent
            parent = _pick(above, slot, node)
            w_node = _pick(w, slot, node)
            is_live = _pick(live.to(tl.int32), slot, node) > 0
            accept = is_live & (_pick(test, slot, node) < w_node)
            if accept:
                end = node
                going = node < 0
            else:
                w_parent = _pick(w, slot, parent)
                q_row = q_ptr + seq * q_sb + _q_index(node, _pick(depths, slot, node), q_rows, Q_BY_DEPTH) * q_ss
                if is_live:  # rejected: correct the parent
                    mass = w_parent * 0.0
                    if w_parent > 0:  # else its residual max(0, 0 - Q) is 0
                        mass = _correct(p_ptr + seq * p_sb + parent * p_ss, p_sv,
                                        pool_ptr + seq * (S + 1) * V, _pick(pool_row, slot, parent),
                                        _pick(scale, slot, parent), spare, q_row, q_sv,
                                        w_parent, _pick(kept, slot, node), tokens, real, parents, slot, node, V,
                                        REPLACEMENT, BLOCK)  # fmt: skip
                    if mass > 0:  # the residual becomes the parent's P; its children's P_b(x_c) follow
                        scaled = tl.maximum(mass, TINY)
                        children = real & (parents == parent)
                        q_c = tl.load(q_row + tokens * q_sv, mask=children, other=0.0)  # the siblings' shared q
                        if not REPLACEMENT:
                            q_c = q_c / _pick(kept, slot, node)
                        ptok = tl.where(children, tl.maximum(w_parent * ptok - q_c, 0.0) / scaled, ptok)
                        held = _pick(pool_row, slot, parent)
                        pool_row = tl.where(slot == parent, spare, pool_row)
                        spare = tl.where(held >= 0, held, parent)
                        scale = tl.where(slot == parent, scaled, scale)
                    w_new = tl.where(w_parent >= 1.0, 1.0, mass / tl.maximum(mass + 1.0 - w_parent, TINY))
                    w = tl.where(slot == parent, w_new, w)
                sibling = tl.min(tl.where(real & (parents == parent) & (slot > node), slot, none), 0)
                descending = sibling < none
                node = tl.where(descending, sibling, parent)
                going = node > 0
    # the path from the root to end (the end repeated past its depth) and the tokens: drafts, then the bonus
    end_depth = _pick(depths, slot, end)
    step = tl.arange(0, BLOCK_P)
    path = tl.where(step >= end_depth, end, 0)
    new = tl.zeros([BLOCK_P], dtype=tl.int64)
    cur = end
    for _ in range(P - 1):
        d = _pick(depths, slot, cur)
        path = tl.where((step == d) & (d > 0), cur, path)
        new = tl.where((step == d - 1) & (d > 0), _pick(tokens, slot, cur), new)
        cur = _pick(above, slot, cur)
    # the bonus: the end node's P by inverse CDF, its float64 cumulative sum run twice in one order (so the second
    # run's last value is the first's total exactly and u * total falls inside)
    held = _pick(pool_row, slot, end)
    corrected = held >= 0
    row = tl.where(corrected, pool_ptr + seq * (S + 1) * V + tl.maximum(held, 0) * V, p_ptr + seq * p_sb + end * p_ss)
    stride = tl.where(corrected, 1, p_sv)
    divide = _pick(scale, slot, end)  # 1 for p's row
    at = uniforms_at(final_ptr + seq * f_sb + end * f_ss, f_sp, True, PAIR, GRID, TOP)
    cols = tl.arange(0, BLOCK_C)
    total = tl.zeros([], dtype=tl.float64)
    for start in range(0, V, BLOCK_C):
        x = _row_probs(row, stride, start + cols, V, divide)
        total = tl.max(total + tl.cumsum(x, 0), axis=0)
        if END:
            tl.store(end_ptr + seq * V + start + cols, x.to(end_ptr.dtype.element_ty), mask=start + cols < V)
    at = at * total
    running = tl.zeros([], dtype=tl.float64)
    bonus = tl.zeros([], dtype=tl.int64)
    for start in range(0, V, BLOCK_C):
        x = _row_probs(row, stride, start + cols, V, divide)
        cdf = running + tl.cumsum(x, 0)
        bonus += tl.sum(((cdf <= at) & (start + cols < V)).to(tl.int64), axis=0)  # searchsorted(right=True)
        running = tl.max(cdf, axis=0)
    new = tl.where(step == end_depth, bonus, new)
    tl.store(path_ptr + seq * P + step, path, mask=step < P)
    tl.store(new_ptr + seq * P + step, new, mask=step < P)
    tl.store(num_ptr + seq, end_depth + 1)


@triton.jit
def _row_probs(row, stride, cols, V, divide):
    """A block of a node's ``P`` as float64: ``p``'s row (``divide`` 1), or a pool row divided by its mass (in
    ``P``'s dtype)."""
    return (tl.load(row + cols * stride, mask=cols < V, other=0.0) / divide).to(tl.float64)


@triton.jit
def _correct(p_row, p_sv, pool, held, scale, spare, q_row, q_sv, w_parent, kept, tokens, real, parents, slot, node,
             V, REPLACEMENT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """One pass over the vocabulary: ``R = max(0, w_b P_b - Q_a)`` into pool row ``spare``; returns ``sum(R)``.
    ``P_b`` is ``p``'s row (``held < 0``) or pool row ``held`` divided by ``scale``; ``Q_a`` is ``q_a`` (without
    replacement: divided by ``kept``, 0 at the node's earlier siblings' tokens)."""
    lanes = tl.arange(0, BLOCK)
    parent = tl.sum(tl.where(slot == node, parents, 0), 0)
    earlier = real & (parents == parent) & (slot < node)
    rank = tl.cumsum(earlier.to(tl.int32), 0) - 1
    count = tl.sum(earlier.to(tl.int32), 0)
    corrected = held >= 0
    src = tl.where(corrected, pool + tl.maximum(held, 0) * V, p_row)
    stride = tl.where(corrected, 1, p_sv)
    dst = pool + spare * V
    total = tl.zeros([BLOCK], dtype=w_parent.dtype)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        inside = cols < V
        target = tl.load(src + cols * stride, mask=inside, other=0.0) / scale  # scale 1 for p's row
        q = tl.load(q_row + cols * q_sv, mask=inside, other=0.0)
        if not REPLACEMENT:
            q = q / kept
            for k in range(count):
                drawn = tl.sum(tl.where(earlier & (rank == k), tokens, 0), 0)
                q = tl.where(cols == drawn, 0.0, q)
        residual = tl.maximum(w_parent * target - q, 0.0)
        tl.store(dst + cols, residual, mask=inside)
        total += tl.where(inside, residual, 0.0)
    tl.debug_barrier()  # the row is read by other threads of the program later
    return tl.sum(total, 0)


def traversal_round_triton(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    test: torch.Tensor,
    final: torch.Tensor,
    max_depth: int,
    replacement: bool,
    *,
    q_by_depth: bool = False,
    block: int | None = None,
    return_target: bool = False,
):
    """A round in two launches; arguments as ``traversal_round_reference`` (``test`` and ``final`` both ``[B, S]``
    float64 or both their ``[B, S, 2]`` float32 halves, any strides; ``q_by_depth``: ``q`` is ``[B, D, V]``, node
    ``a`` drawn from row ``clamp(depth_a - 1, 0, D - 1)``); ``block``: vocabulary entries per
    block, a power of two (default ``min(MAX_BLOCK_F32, next_power_of_2(V))`` in float32, ``MAX_BLOCK`` in
    float64).

    Returns:
        Accept: ``path`` / ``tokens [B, max_depth + 1]`` and ``num_path [B]``, int64; with ``return_target``
        ``(Accept, target)``, ``target [B, V]`` (p's dtype) the end node's distribution, the bonus's.
    """
    from specdec.types import Accept

    batch, slots, vocab = p.shape
    steps = max_depth + 1
    block = power_of_two_block("block", block, vocab, MAX_BLOCK_F32 if p.dtype == torch.float32 else MAX_BLOCK)
    tokens, parents, depth, valid = (t.contiguous() for t in (tokens, parents, depth, valid))
    block_s = max(triton.next_power_of_2(slots), 2)
    warps = 8 if block >= 2048 else 4 if block >= 512 else 1
    qtok = torch.empty(batch, slots, dtype=p.dtype, device=p.device)
    kept = torch.empty(batch, slots, dtype=p.dtype, device=p.device)
    tiny = torch.finfo(p.dtype).tiny
    _setup_kernel[(batch * slots,)](
        tokens, parents, depth, valid, q, qtok, kept, slots, vocab, *q.stride(), q.shape[1],
        TINY=tiny, REPLACEMENT=bool(replacement), Q_BY_DEPTH=bool(q_by_depth), BLOCK=block, BLOCK_S=block_s,
        num_warps=warps,
    )  # fmt: skip
    pool = torch.empty(batch, slots + 1, vocab, dtype=p.dtype, device=p.device)
    path = torch.empty(batch, steps, dtype=torch.long, device=p.device)
    num_path = torch.empty(batch, dtype=torch.long, device=p.device)
    new = torch.empty(batch, steps, dtype=torch.long, device=p.device)
    target = torch.empty(batch, vocab if return_target else 1, dtype=p.dtype, device=p.device)
    _traversal_kernel[(batch,)](
        tokens, parents, depth, valid, p, q, qtok, kept, test, final, pool, path,
        num_path, new, target, slots, vocab, *p.stride(), *q.stride(), *pair_strides(test), *pair_strides(final),
        q.shape[1], TINY=tiny, REPLACEMENT=bool(replacement), Q_BY_DEPTH=bool(q_by_depth), PAIR=test.dim() == 3,
        GRID=UNIFORM_GRID, TOP=UNIFORM_TOP,
        P=steps, BLOCK=block, BLOCK_S=block_s, BLOCK_P=max(triton.next_power_of_2(steps), 2),
        BLOCK_C=min(block, 2048), END=bool(return_target),
        num_warps=warps,
    )  # fmt: skip
    accept = Accept(path=path, num_path=num_path, tokens=new)
    return (accept, target) if return_target else accept
