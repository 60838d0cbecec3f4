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
    """Recursive rejection sampling as its definition reads: from the root, test the current node's children one
    at a time in slot order (accept ``c`` when ``u q_c(c) < r(c)``; a rejection sets ``r <- norm(max(0, r - q_c))``
    and, without replacement, removes ``c``'s token from the next siblings' q; an acceptance moves to ``c`` with
    ``r = p_c``); when no child is left the bonus is drawn from ``r``. Children come after their parent, so one pass
    over the slots visits every test in order. Arguments and result as ``recursive_rejection``'s."""
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
