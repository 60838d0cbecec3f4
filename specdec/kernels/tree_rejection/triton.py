"""The sibling-rank loop of recursive rejection sampling in one Triton launch (capture-safe: no host reads).

One program per (row, node): it copies the node's ``p`` into its row of ``r``, then tests the node's children in
rank order (``K`` unrolled steps) until one is accepted. A drawable child is accepted iff ``weighed < r(token)``;
a rejected one reduces ``r`` in two passes over the vocabulary in blocks: the residual mass
``sum(max(r - q_c, 0))``, then ``r <- max(r - q_c, 0) / mass`` (``r`` left as is when the mass is 0). ``q_c`` is the
child's row of ``q`` (without replacement: divided by ``kept``, zero at the earlier siblings' tokens). The row of
``r`` lives in global memory (the output itself) between passes; a barrier after each write makes it visible to
the program's other threads. Float64 throughout. Equal to ``tree_rejection_reference`` (``nxt`` exactly, ``r`` up
to the order of the mass's sum: ``tests/kernels/test_tree_rejection.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_BLOCK", "tree_rejection_triton"]

MAX_BLOCK = 1024
"""Vocabulary entries a program handles per block (fewer when ``V`` is smaller)."""


@triton.jit
def _tree_rejection_kernel(
    p_ptr,  # [B, S, V] float64, strided
    q_ptr,  # [B, S, V] float64, strided
    table_ptr,  # [B, S, K] int64: each node's child slot by rank (S where none)
    tokens_ptr,  # [B, S, K] int64: the children's tokens
    weighed_ptr,  # [B, S, K] float64: u * q_c(c)
    drawable_ptr,  # [B, S, K] bool
    kept_ptr,  # [B, S, K] float64 (read only without replacement)
    r_ptr,  # [B, S, V] float64 out
    nxt_ptr,  # [B, S] int64 out
    S,
    V,
    p_sb,
    p_ss,
    p_sv,
    q_sb,
    q_ss,
    q_sv,
    TINY: tl.constexpr,
    K: tl.constexpr,
    REPLACEMENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * S + node
    seq = row // S
    node = row - seq * S
    p_row = p_ptr + seq * p_sb + node * p_ss
    r_row = r_ptr + row * V
    ranks = row * K
    lanes = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        inside = cols < V
        tl.store(r_row + cols, tl.load(p_row + cols * p_sv, mask=inside), mask=inside)
    tl.debug_barrier()  # r[token] below is read by every thread
    nxt = node  # the accepted child, the node itself while none is
    for k in tl.static_range(K):
        live = tl.load(drawable_ptr + ranks + k).to(tl.int1) & (nxt == node)
        if live:
            child = tl.load(table_ptr + ranks + k)
            weight = tl.load(weighed_ptr + ranks + k)
            if weight < tl.load(r_row + tl.load(tokens_ptr + ranks + k)):
                nxt = child
            else:  # rejected: r <- norm(max(r - q_c, 0)), unless that mass is 0
                q_row = q_ptr + seq * q_sb + child * q_ss
                if not REPLACEMENT:
                    kept = tl.load(kept_ptr + ranks + k)
                total = tl.zeros([BLOCK], dtype=tl.float64)
                for start in range(0, V, BLOCK):
                    cols = start + lanes
                    inside = cols < V
                    qk = tl.load(q_row + cols * q_sv, mask=inside, other=0.0)
                    if not REPLACEMENT:
                        qk = qk / kept
                        for j in tl.static_range(k):  # the earlier siblings' tokens: no draw now
                            qk = tl.where(cols == tl.load(tokens_ptr + ranks + j), 0.0, qk)
                    r = tl.load(r_row + cols, mask=inside, other=0.0)
                    total += tl.maximum(r - qk, 0.0)
                mass = tl.sum(total, axis=0)
                if mass > 0:
                    scale = tl.maximum(mass, TINY)
                    for start in range(0, V, BLOCK):
                        cols = start + lanes
                        inside = cols < V
                        qk = tl.load(q_row + cols * q_sv, mask=inside, other=0.0)
                        if not REPLACEMENT:
                            qk = qk / kept
                            for j in tl.static_range(k):
                                qk = tl.where(cols == tl.load(tokens_ptr + ranks + j), 0.0, qk)
                        r = tl.load(r_row + cols, mask=inside, other=0.0)
                        tl.store(r_row + cols, tl.maximum(r - qk, 0.0) / scale, mask=inside)
                    tl.debug_barrier()
    tl.store(nxt_ptr + row, nxt)


def tree_rejection_triton(
    p: torch.Tensor,
    q: torch.Tensor,
    table: torch.Tensor,
    tokens: torch.Tensor,
    weighed: torch.Tensor,
    drawable: torch.Tensor,
    kept: torch.Tensor | None,
    replacement: bool,
    *,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sibling-rank loop in one launch (arguments as ``tree_rejection_reference``); ``block``: vocabulary
    entries per block, a power of two (default ``min(MAX_BLOCK, next_power_of_2(V))``).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``r [B, S, V]`` float64 and ``nxt [B, S]`` int64.
    """
    batch, slots, vocab = p.shape
    width = table.shape[-1]
    if block is None:
        block = min(triton.next_power_of_2(vocab), MAX_BLOCK)
    elif block < 1 or block & (block - 1):
        raise ValueError(f"block={block!r}: pass a power of two.")
    r = torch.empty(batch, slots, vocab, dtype=torch.float64, device=p.device)
    nxt = torch.empty(batch, slots, dtype=torch.long, device=p.device)
    weighed = weighed.contiguous()
    kept = weighed if kept is None else kept.contiguous()  # not read with replacement
    _tree_rejection_kernel[(batch * slots,)](
        p, q, table.contiguous(), tokens.contiguous(), weighed, drawable.contiguous(), kept, r, nxt,
        slots, vocab, *p.stride(), *q.stride(),
        TINY=torch.finfo(torch.float64).tiny, K=width, REPLACEMENT=bool(replacement), BLOCK=block,
        num_warps=4 if block >= 512 else 1,
    )  # fmt: skip
    return r, nxt
