"""``tree_rejection`` reference: the sibling-rank loop of recursive rejection sampling as plain tensor ops.

It is the specification of the Triton kernel in ``triton.py`` and what runs off CUDA; like the kernel it reads
nothing on the host, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

__all__ = ["tree_rejection_reference"]


def tree_rejection_reference(
    p: torch.Tensor,
    q: torch.Tensor,
    table: torch.Tensor,
    tokens: torch.Tensor,
    weighed: torch.Tensor,
    drawable: torch.Tensor,
    kept: torch.Tensor | None,
    replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's children tested at once, one sibling rank per step (``K`` steps, each ~18 tensor ops).

    At rank ``k``, a node none of whose earlier children was accepted tests its ``k``-th child ``c`` if it is
    drawable: accepted iff ``weighed < r(c)``; a rejection sets ``r <- max(r - q_c, 0)`` renormalised (left as is
    when that mass is 0), ``q_c`` being the distribution ``c`` was drawn from (without replacement: q with the
    earlier siblings' tokens removed, divided by ``kept``).

    Args:
        p (torch.Tensor): ``[B, S, V]`` float64 target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` float64 distribution each slot's token was drawn from.
        table (torch.Tensor): ``[B, S, K]`` int64, each node's child slot by rank, ``S`` where it has none.
        tokens (torch.Tensor): ``[B, S, K]`` int64, the children's tokens.
        weighed (torch.Tensor): ``[B, S, K]`` float64, each child's uniform times ``q_c(c)``.
        drawable (torch.Tensor): ``[B, S, K]`` bool, the children tested (real, inside q's support).
        kept (torch.Tensor | None): ``[B, S, K]`` float64, 1 minus q's mass on the earlier siblings' tokens (read
            only without replacement; None allowed with it).
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``r [B, S, V]`` float64, each node's target distribution reduced by its
        rejected children (``p`` where none was), and ``nxt [B, S]`` int64, each node's accepted child (the node
        itself where none was).
    """
    batch, slots, vocab = p.shape
    tiny = torch.finfo(p.dtype).tiny
    width = table.shape[-1]
    index = table.clamp(max=slots - 1)
    node = torch.arange(slots, device=p.device).expand(batch, -1)
    nxt = node  # each node's accepted child, itself while none is
    r = p  # each node's target distribution, reduced by its rejected children
    for k in range(width):
        qk = q.gather(1, index[..., k, None].expand(-1, -1, vocab))  # [B, S, V]: the distribution c was drawn from
        if not replacement:
            qk = (qk.scatter(2, tokens[..., :k], 0.0) if k else qk) / kept[..., k, None]
        live = drawable[..., k] & (nxt == node)
        accept = live & (weighed[..., k] < r.gather(2, tokens[..., k, None])[..., 0])
        residual = (r - qk).clamp(min=0.0)
        mass = residual.sum(-1, keepdim=True)
        correct = (live & ~accept)[..., None] & (mass > 0)
        r = torch.where(correct, residual / mass.clamp(min=tiny), r)
        nxt = torch.where(accept, table[..., k], nxt)
    return r, nxt
