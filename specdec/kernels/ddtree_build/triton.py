"""One-launch DDTree build kernels: the per-depth top-k and the heap builder's pops.

Selection: a single Triton program keeps the heap's open prefixes in registers (``F`` slots: score, parent score,
packed rank tuple, packed depth / rank / parent) and pops ``N`` times. A pop takes the open prefix with the
largest score, ties broken by the smallest packed rank tuple (one int64, most significant digit = depth 1, so
shorter tuples sort first; open prefixes have distinct tuples), emits it as node ``t + 1``, replaces it by its
next sibling and opens its first child in slot ``t + 1``. Scores are float64 sums ``parent score + fp32 value``,
the same arithmetic as the heap builder, so the nodes and their order are identical
(``tests/kernels/test_ddtree_build.py``). Each pop is one reduction (a tuple combine of score and rank key that
carries the winner's payload); a closed or unused slot holds score -inf and the largest key, so it never wins
against an open prefix and needs no flag of its own.

Top-k: one program per depth. Rows of up to 16384 entries are read once into registers as distinct int64 keys
and each rank is one max; longer rows are scanned once per rank.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specdec.kernels.ddtree_build import EXPECT_SIZES_MAX  # sizes packed 16 bits each in one int64 constant

__all__ = ["best_first_triton", "topk_rows_triton"]

_INT64_MAX = tl.constexpr(9223372036854775807)


@triton.jit
def _pick(s1, k1, ps1, inf1, s2, k2, ps2, inf2):
    # The better of two prefixes: the larger score, then the smaller rank key. Closed and unused slots hold score
    # -inf and the largest key, so any open prefix (even one of score -inf) beats them, and open prefixes have
    # distinct keys; the payload (parent score, packed info) travels with the winner.
    first = (s1 > s2) | ((s1 == s2) & (k1 < k2))
    return (
        tl.where(first, s1, s2),
        tl.where(first, k1, k2),
        tl.where(first, ps1, ps2),
        tl.where(first, inf1, inf2),
    )


@triton.jit
def _best_first_kernel(
    vals_ptr,  # [D, K] fp32, each row sorted (value desc, id asc)
    ids_ptr,  # [D, K] int64
    tokens_ptr,  # [N] int64 out
    parents_ptr,  # [N] int64 out
    depth_ptr,  # [N] int64 out
    scores_ptr,  # [N] fp64 out (the popped prefixes' scores), written when SCORES
    roots_ptr,  # [B] int64 the roots' tokens, read when PADDED
    K: tl.constexpr,
    D: tl.constexpr,
    BITS: tl.constexpr,
    N: tl.constexpr,
    F: tl.constexpr,
    SCORES: tl.constexpr,
    PADDED: tl.constexpr,  # write whole trees [S]: the root at slot 0, pops 1 .. TREE_N at 1 .., padding to S - 1
    S: tl.constexpr,
    BLOCK_PAD: tl.constexpr,
    expect_ptr,  # [B, NE] fp64 out: E(n) = sum of exp(score) over the first n pops, per size n (NE > 0)
    TREE_N: tl.constexpr,  # pops written as the tree (PADDED; <= N): the rest only score and expect
    NE: tl.constexpr,  # sizes whose expectations are written (0: none)
    SIZES: tl.constexpr,  # those sizes, 16 bits each (size j at bits 16 j .. 16 j + 15); a size past N gets -1
):
    # A pop is on the critical path of the next one, so it is one reduction: the open prefix with the largest
    # score (ties: smallest rank key) together with its parent score and packed (depth, rank, parent) = depth |
    # rank << 8 | parent << 32; its slot is the one holding its key. One program per sequence of a batch.
    seq = tl.program_id(0).to(tl.int64)
    vals_ptr += seq * D * K
    ids_ptr += seq * D * K
    scores_ptr += seq * N
    if PADDED:  # the root and the padding slots hold the root's token, parent -1, depth 0 (``pad_trees``)
        tokens_ptr += seq * S
        parents_ptr += seq * S
        depth_ptr += seq * S
        root = tl.load(roots_ptr + seq)
        pad = tl.arange(0, BLOCK_PAD)
        at = tl.where(pad == 0, 0, TREE_N + pad)  # slot 0, then slots TREE_N + 1 .. S - 1
        outside = (pad == 0) | (TREE_N + pad < S)
        tl.store(tokens_ptr + at, tl.zeros([BLOCK_PAD], dtype=tl.int64) + root, mask=outside)
        tl.store(parents_ptr + at, tl.full([BLOCK_PAD], -1, tl.int64), mask=outside)
        tl.store(depth_ptr + at, tl.zeros([BLOCK_PAD], dtype=tl.int64), mask=outside)
        tokens_ptr += 1
        parents_ptr += 1
        depth_ptr += 1
    else:
        tokens_ptr += seq * N
        parents_ptr += seq * N
        depth_ptr += seq * N
    slot = tl.arange(0, F)
    one = tl.full([], 1, tl.int64)
    first = tl.load(vals_ptr).to(tl.float64)
    closed = tl.full([F], float("-inf"), tl.float64)  # a closed or unused slot: score -inf, the largest key
    score = tl.where(slot == 0, first, closed)
    parent_score = tl.zeros([F], dtype=tl.float64)
    key = tl.where(slot == 0, one << ((D - 1) * BITS), _INT64_MAX).to(tl.int64)
    info = tl.where(slot == 0, 1, 0).to(tl.int64)  # depth 1, rank 0, parent 0 (the root)
    total = tl.zeros([], dtype=tl.float64)  # sum of exp(score) over the pops so far (NE > 0)
    if NE > 0:
        expect_ptr += seq * NE
        for j in tl.static_range(NE):  # sizes past the pops: not computed
            if (SIZES >> (16 * j)) & 0xFFFF > N:
                tl.store(expect_ptr + j, tl.full([], -1.0, tl.float64))
    for t in range(N):
        best, low, p_parent_score, p_info = tl.reduce((score, key, parent_score, info), 0, _pick)
        sel = key == low
        p_depth = (p_info & 0xFF).to(tl.int32)
        p_rank = ((p_info >> 8) & 0xFFFFFF).to(tl.int32)
        row = (p_depth - 1) * K
        in_tree = t < TREE_N
        tl.store(tokens_ptr + t, tl.load(ids_ptr + row + p_rank), mask=in_tree)
        tl.store(parents_ptr + t, p_info >> 32, mask=in_tree)
        tl.store(depth_ptr + t, p_depth.to(tl.int64), mask=in_tree)
        if SCORES:
            tl.store(scores_ptr + t, best)
        if NE > 0:
            total += tl.exp(best)
            for j in tl.static_range(NE):
                if (SIZES >> (16 * j)) & 0xFFFF <= N:
                    tl.store(expect_ptr + j, total, mask=t + 1 == (SIZES >> (16 * j)) & 0xFFFF)
        # the popped prefix's slot now holds its next sibling (same parent, next rank at that depth)
        has_sibling = p_rank + 1 < K
        sibling = tl.load(vals_ptr + row + p_rank + 1, mask=has_sibling, other=0.0).to(tl.float64)
        digit = one << ((D - p_depth) * BITS).to(tl.int64)
        score = tl.where(sel, tl.where(has_sibling, p_parent_score + sibling, closed), score)
        key = tl.where(sel, tl.where(has_sibling, low + digit, _INT64_MAX), key)
        info = tl.where(sel, p_info + 256, info)  # rank + 1
        # its first child opens in slot t + 1 (never used before: each pop opens at most one new slot)
        has_child = p_depth < D
        child = tl.load(vals_ptr + p_depth * K, mask=has_child, other=0.0).to(tl.float64)
        opened = (slot == t + 1) & has_child
        child_digit = one << (tl.maximum(D - p_depth - 1, 0) * BITS).to(tl.int64)
        score = tl.where(opened, best + child, score)
        parent_score = tl.where(opened, best, parent_score)
        key = tl.where(opened, low + child_digit, key)
        info = tl.where(opened, (p_depth + 1).to(tl.int64) | ((t + 1) * one << 32), info)


def best_first_triton(
    vals: torch.Tensor,
    ids: torch.Tensor,
    num_nodes: int,
    *,
    scores: bool = False,
    roots: torch.Tensor | None = None,
    num_slots: int | None = None,
    tree_nodes: int | None = None,
    expect: tuple[int, ...] = (),
):
    """The first ``num_nodes`` pops of the DDTree heap over per-depth candidates.

    Args:
        vals (torch.Tensor): ``[D, K]`` (or ``[B, D, K]``, one program per sequence) fp32 candidate log-probs per
            depth, each row ranked (value desc, id asc).
        ids (torch.Tensor): ``[D, K]`` (``[B, D, K]``) int64 their token ids.
        num_nodes (int): pops (non-root nodes), at most the number of reachable prefixes.
        scores (bool): also return the popped prefixes' scores (float64 path log-probabilities, descending).
        roots (torch.Tensor | None): with ``num_slots``, ``[B]`` int64 root tokens (batched ``vals`` only): the
            outputs are whole trees of ``num_slots >= num_nodes + 1`` slots as ``build.pad_trees`` lays them out
            (the root at slot 0, parent -1, depth 0; the pops at slots 1 .. ``num_nodes``; the padding slots
            holding the root's token, parent -1, depth 0), written by the same launch.
        tree_nodes (int | None): with ``roots``, only the first ``tree_nodes`` pops form the tree (``num_slots >=
            tree_nodes + 1``); the later ones count only in ``scores`` and ``expect``. Default ``num_nodes``.
        expect (tuple[int, ...]): up to ``EXPECT_SIZES_MAX`` candidate sizes: the launch also writes, per sequence
            and size ``n``, ``E(n) = sum over the first n pops of exp(score)`` (``specdec.budget.expected_accepts``
            of the scores) in float64, or -1 for a size past ``num_nodes``.

    Returns:
        tuple: ``tokens``, ``parents`` (0 = the root), ``depth``, each ``[num_nodes]`` (``[B, num_nodes]``) int64,
        in pop order (``[B, num_slots]`` trees with ``roots``); with ``scores=True`` then their scores (float64,
        ``[B, num_nodes]``); with ``expect`` last the expectations (float64, ``[B, len(expect)]``).
    """
    batch = vals.shape[0] if vals.dim() == 3 else None
    depth_limit, k = vals.shape[-2:]
    bits = k.bit_length()
    if k >= 2**24 or num_nodes >= 2**31:
        raise ValueError(f"k={k}, num_nodes={num_nodes}: the selection packs ranks in 24 bits and parents in 31.")
    if depth_limit * bits > 63:
        raise ValueError(f"rank tuples of {depth_limit} digits of {bits} bits do not fit one int64 key.")
    padded = roots is not None
    tree_n = num_nodes if tree_nodes is None else tree_nodes
    if padded and (batch is None or num_slots is None or num_slots < tree_n + 1 or roots.shape != (batch,)):
        got = None if roots is None else list(roots.shape)
        least = "num_nodes" if tree_nodes is None else "tree_nodes"
        raise ValueError(f"roots [B] and num_slots >= {least} + 1 = {tree_n + 1} go with batched vals "
                         f"[B, D, K]; got roots {got}, num_slots={num_slots}.")  # fmt: skip
    if not 0 <= tree_n <= num_nodes or (tree_n < num_nodes and not padded):
        raise ValueError(f"tree_nodes={tree_nodes}: at most num_nodes={num_nodes}, fewer only with roots (whole "
                         "padded trees).")  # fmt: skip
    if len(expect) > EXPECT_SIZES_MAX or any(not 1 <= int(n) < 2**16 for n in expect):
        raise ValueError(f"expect={tuple(expect)}: at most {EXPECT_SIZES_MAX} sizes, each in [1, 65535].")
    width = num_slots if padded else num_nodes
    out = torch.empty(3, batch or 1, width, dtype=torch.long, device=vals.device)
    popped = torch.empty(batch or 1, num_nodes, dtype=torch.float64, device=vals.device) if scores else out[0]
    expected = torch.empty(batch or 1, max(len(expect), 1), dtype=torch.float64, device=vals.device)
    slots = triton.next_power_of_2(num_nodes + 1)
    _best_first_kernel[(batch or 1,)](
        vals.contiguous(), ids.contiguous(), out[0], out[1], out[2], popped, roots if padded else out[0],
        K=k, D=depth_limit, BITS=bits, N=num_nodes, F=slots, SCORES=scores, PADDED=padded, S=width,
        BLOCK_PAD=max(triton.next_power_of_2(width - tree_n), 2), expect_ptr=expected, TREE_N=tree_n,
        NE=len(expect), SIZES=sum(int(n) << (16 * j) for j, n in enumerate(expect)), num_warps=1,
    )  # fmt: skip
    result = (out[0], out[1], out[2]) + ((popped,) if scores else ()) + ((expected,) if expect else ())
    return tuple(x[0] for x in result) if batch is None else result


@triton.jit
def _topk_rows_kernel(x_ptr, vals_ptr, ids_ptr, V, stride, K, BLOCK: tl.constexpr, SMALLEST: tl.constexpr):
    """One program per row: ``K`` passes, pass j taking the best element ranked after pass j-1's pick in the order
    (value desc, id asc; ``SMALLEST``: value asc, id asc, by ranking the negated values); each pass scans the row in
    ``BLOCK`` chunks, so any vocabulary size works."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride
    prev_v = tl.full([], float("inf"), tl.float32)
    prev_i = tl.full([], -1, tl.int64)
    for j in range(0, K):
        best_v = tl.full([], float("-inf"), tl.float32)
        best_i = tl.full([], V, tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            inside = offs < V
            x = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32)
            if SMALLEST:
                x = -x
            after = inside & ((x < prev_v) | ((x == prev_v) & (offs > prev_i)))
            m = tl.max(tl.where(after, x, float("-inf")), axis=0)
            idx = tl.min(tl.where(after & (x == m), offs, V), axis=0).to(tl.int64)
            better = (m > best_v) | ((m == best_v) & (idx < best_i))
            best_v = tl.where(better, m, best_v)
            best_i = tl.where(better, idx, best_i)
        value = tl.load(base + best_i).to(tl.float32)  # the element itself (-0.0 stays -0.0)
        tl.store(vals_ptr + row * K + j, value)
        tl.store(ids_ptr + row * K + j, best_i)
        prev_v = -value if SMALLEST else value
        prev_i = best_i


@triton.jit
def _topk_row_in_registers_kernel(x_ptr, vals_ptr, ids_ptr, V, stride, K: tl.constexpr, KP: tl.constexpr,
                                  BLOCK: tl.constexpr, SMALLEST: tl.constexpr):  # fmt: skip
    """One program per row for rows that fit one ``BLOCK``: the row is read once into registers as distinct int64
    keys (fp32 value mapped to an ordered integer in the high half, ``V - 1 - id`` in the low half; ``SMALLEST``:
    the negated value's), then each of the ``K`` passes is a single max over the keys below the previous pick.
    Values are read at the end (-0.0 stays -0.0)."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride
    offs = tl.arange(0, BLOCK)
    inside = offs < V
    x = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32)
    if SMALLEST:
        x = -x
    bits = x.to(tl.int32, bitcast=True).to(tl.int64)
    ordered = tl.where(bits < 0, -2147483648 - bits, bits)  # -0.0 and +0.0 both map to 0
    keys = tl.where(inside, ordered * 4294967296 + (V - 1 - offs), -_INT64_MAX - 1)
    slot = tl.arange(0, KP)
    picked = tl.zeros([KP], dtype=tl.int64)
    prev = tl.full([], _INT64_MAX, tl.int64)
    for j in range(K):
        prev = tl.max(tl.where(keys < prev, keys, -_INT64_MAX - 1), axis=0)
        picked = tl.where(slot == j, V - 1 - (prev & 0xFFFFFFFF), picked)
    keep = slot < K
    tl.store(ids_ptr + row * K + slot, picked, mask=keep)
    tl.store(vals_ptr + row * K + slot, tl.load(base + picked, mask=keep).to(tl.float32), mask=keep)


# Rows up to this many entries are read once into registers (the zoo's 8192-token vocabulary); longer rows are
# scanned once per rank.
_REGISTER_ROW_MAX = 16384

_TWO_STAGE_MIN = 32768
"""Rows wider than this take two launches of the in-register kernel: the top ``k`` of each ``_CHUNK``-wide chunk,
then the top ``k`` of those candidates (``topk_impl="auto"`` takes them: at 151936 tokens the 8 B round's draft and
selection took 190 µs less than with ``torch.topk`` over packed keys on an H100, docs/kernels.md)."""

_CHUNK = 8192


def topk_rows_triton(logq: torch.Tensor, k: int, smallest: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` fp32 values and int64 ids per row of ``logq [D, V]``, ranked by (fp32 value desc, id asc), as
    ``reference.topk_rows_reference`` (ties included; -0.0 equals +0.0; no NaN or +inf); ``smallest``: the ``k``
    smallest, ranked by (value asc, id asc) (no NaN or -inf). ``k <= V``."""
    depth, vocab = logq.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"k={k} must be in [1, V={vocab}].")
    x = logq.contiguous()
    if vocab > _TWO_STAGE_MIN:
        return _topk_two_stage(x, k, smallest)
    vals = torch.empty(depth, k, dtype=torch.float32, device=x.device)
    ids = torch.empty(depth, k, dtype=torch.int64, device=x.device)
    if vocab <= _REGISTER_ROW_MAX:
        block = triton.next_power_of_2(vocab)
        _topk_row_in_registers_kernel[(depth,)](
            x, vals, ids, vocab, x.stride(0), K=k, KP=triton.next_power_of_2(k), BLOCK=block, SMALLEST=smallest,
            num_warps=max(1, min(16, block // 512)),
        )  # fmt: skip
        return vals, ids
    block = min(triton.next_power_of_2(vocab), 4096)
    _topk_rows_kernel[(depth,)](x, vals, ids, vocab, x.stride(0), k, BLOCK=block, SMALLEST=smallest,
                                num_warps=8 if block >= 2048 else 4)  # fmt: skip
    return vals, ids


def _topk_two_stage(x: torch.Tensor, k: int, smallest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``k`` of rows wider than ``_TWO_STAGE_MIN``: each ``_CHUNK``-wide chunk's top ``k`` (the last chunk
    padded with the worst value, whose ids past the row lose every tie), then the top ``k`` of those candidates.
    The order is the one-launch kernel's: a chunk's candidates come in (value, id asc) order and the chunks in id
    order, so a tie between candidates goes to the smaller position, which is the smaller id."""
    depth, vocab = x.shape
    chunks = triton.cdiv(vocab, _CHUNK)
    if chunks * _CHUNK > vocab:
        x = torch.nn.functional.pad(x.float(), (0, chunks * _CHUNK - vocab), value=math.inf if smallest else -math.inf)
    kc = min(k, _CHUNK)
    vals, ids = topk_rows_triton(x.view(depth * chunks, _CHUNK), kc, smallest)
    ids = ids.view(depth, chunks, kc) + torch.arange(chunks, device=x.device)[:, None] * _CHUNK
    top, pos = topk_rows_triton(vals.view(depth, chunks * kc), k, smallest)
    return top, ids.view(depth, chunks * kc).gather(1, pos)
