"""The definition of recursive rejection sampling, one slot at a time (the oracle of
``specdec.verify.multidraft.recursive_rejection``, which tests every node's children at once, rank by rank): the
same uniforms give the same accepted path and bonus."""

from __future__ import annotations

import torch

from specdec.types import Accept, DeviceTree
from specdec.verify.draws import accept_at, categorical, uniform

__all__ = ["rejection_one_slot_at_a_time"]


def rejection_one_slot_at_a_time(
    tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor, max_depth: int, replacement: bool
) -> Accept:
    """Recursive rejection sampling as its definition reads: one pass over the slots in order, one test at a time.

    From the root, each child ``c`` of the current node (in slot order) is tested: accepted with probability
    ``min(1, r(c) / q_c(c))`` where ``r`` is the current node's target distribution, reduced by the children
    rejected so far, and ``q_c`` the distribution ``c`` was drawn from (its depth's q; without replacement, q with
    the earlier siblings' tokens removed, renormalised). A rejection sets ``r <- norm(max(0, r - q_c))``; an
    acceptance makes ``c`` the current node, ``r = p_c``. When no child is left, the token drawn from ``r`` is the
    bonus. Children come after their parent in slot order, so one pass over the slots visits every test in order.

    Args:
        tree (DeviceTree): ``[B, S]``.
        p (torch.Tensor): ``[B, S, V]`` float64 target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` float64 draft distribution each node was drawn from (zeros at the root).
        noise (torch.Tensor): ``[B, S, V]`` uniforms (``draws.uniform`` 0: the node's test, 1: the final draw).
        max_depth (int): the deepest node; the result has ``max_depth + 1`` slots.
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).
    """
    batch, slots, vocab = p.shape
    test, final = uniform(noise, 0), uniform(noise, 1)
    current = torch.zeros(batch, dtype=torch.long, device=p.device)
    r = p[:, 0]
    tried = torch.zeros(batch, vocab, dtype=torch.bool, device=p.device)  # tokens of the rejected siblings
    for j in range(1, slots):
        token = tree.tokens[:, j : j + 1]
        child = tree.valid[:, j] & (tree.parents[:, j] == current)
        qj = q[:, j]
        if not replacement:
            qj = qj.masked_fill(tried, 0.0)
            qj = qj / qj.sum(-1, keepdim=True).clamp(min=torch.finfo(qj.dtype).tiny)
        q_tok, r_tok = qj.gather(1, token)[:, 0], r.gather(1, token)[:, 0]
        live = child & (q_tok > 0)  # a sibling past q's support is no draw: neither tested nor subtracted
        accept = live & (test[:, j] * q_tok < r_tok)
        reject = live & ~accept
        residual = (r - qj).clamp(min=0.0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(mass.dtype).tiny), r)
        r = torch.where(reject[:, None], residual, r)
        tried = tried | (reject[:, None] & (torch.arange(vocab, device=p.device) == token))
        r = torch.where(accept[:, None], p[:, j], r)
        tried = tried & ~accept[:, None]
        current = torch.where(accept, j, current)
    bonus = categorical(r, final.gather(1, current[:, None])[:, 0])
    return accept_at(tree, current, bonus, max_depth)
