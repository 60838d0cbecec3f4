"""``tree_rejection`` reference: a round of recursive rejection sampling as plain tensor ops.

``tree_rejection_round_reference`` is the setup (``round_setup``: each node's children by rank, their tokens,
uniforms and draft probabilities) then the sibling-rank loop (``_rank_loop``). It is the specification of the
Triton kernel in ``triton.py`` and what runs off CUDA; like the kernel it reads nothing on the host, so it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import torch

__all__ = [
    "children_by_rank",
    "rank_width",
    "rejection_walk_reference",
    "round_setup",
    "tree_rejection_round_reference",
]


def rank_width(slots: int, max_children: int | None) -> int:
    """``K``, the sibling ranks a round tests: ``max_children`` (a bound the tree's policy states), else ``S - 1``
    (any tree); at least 1, at most ``S - 1``."""
    return max(1, slots - 1 if max_children is None else min(max_children, slots - 1))


def children_by_rank(parents: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, S, K]`` (``K = width``): the slot of each node's ``k``-th child in slot order, ``S`` where it has
    fewer children. A child is a valid slot of positive depth; its parent is ``parents``."""
    batch, slots = parents.shape
    index = torch.arange(slots, device=parents.device)
    child = valid & (depth > 0)
    earlier = (parents[:, :, None] == parents[:, None, :]) & (index[None, None] < index[None, :, None])
    rank = (earlier & child[:, None, :]).sum(-1)  # [B, S]: the node's place among its parent's children
    spot = torch.where(child & (rank < width), parents.clamp(min=0) * width + rank, slots * width)
    table = torch.full((batch, slots * width + 1), slots, dtype=torch.long, device=index.device)
    return table.scatter(1, spot, index.expand(batch, -1))[:, :-1].view(batch, slots, width)


def round_setup(
    tree_tokens: torch.Tensor,
    tree_parents: torch.Tensor,
    tree_depth: torch.Tensor,
    tree_valid: torch.Tensor,
    q: torch.Tensor,
    test: torch.Tensor,
    max_children: int | None,
    replacement: bool,
) -> dict:
    """The sibling-rank loop's ranked arguments (``table``, ``tokens``, ``weighed``, ``drawable``, ``kept``; see
    :func:`_rank_loop`) from the tree, ``q`` and each slot's uniform ``test [B, S]`` float64.

    Without replacement the ``k``-th sibling is weighed against q with the earlier siblings' tokens removed
    (renormalised by ``kept``); a sibling repeating an earlier one's token has probability 0 there: not drawable."""
    slots, vocab = q.shape[1:]
    tiny = torch.finfo(q.dtype).tiny
    table = children_by_rank(tree_parents, tree_depth, tree_valid, rank_width(slots, max_children))  # [B, S, K]
    width = table.shape[-1]
    exists = table < slots
    index = table.clamp(max=slots - 1)
    tokens = tree_tokens.gather(1, index.flatten(1)).view_as(table)  # each node's children's tokens, by rank
    tests = test.gather(1, index.flatten(1)).view_as(table)  # their uniforms (a slot's own)
    q_tok = q.flatten(1).gather(1, (index * vocab + tokens).flatten(1)).view_as(table)  # q_c(c), before removal
    kept = None
    if not replacement:  # the k-th sibling is weighed against q without the earlier siblings' tokens
        earlier = torch.ones(width, width, dtype=torch.bool, device=q.device).tril(-1)  # [k, k']: k' < k
        repeat = ((tokens[..., :, None] == tokens[..., None, :]) & earlier).any(-1)  # drawn before: no draw now
        removed = (q_tok * ~repeat).cumsum(-1) - q_tok * ~repeat  # q's mass on the earlier siblings' tokens
        kept = (1.0 - removed).clamp(min=tiny)
        q_tok = torch.where(repeat, 0.0, q_tok / kept)
    weighed = tests * q_tok  # accepted iff u q_c(c) < r(c)
    drawable = exists & (q_tok > 0)  # a sibling past q's support is no draw: neither tested nor subtracted
    return dict(table=table, tokens=tokens, weighed=weighed, drawable=drawable, kept=kept)


def tree_rejection_round_reference(
    tree_tokens: torch.Tensor,
    tree_parents: torch.Tensor,
    tree_depth: torch.Tensor,
    tree_valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    test: torch.Tensor,
    max_children: int | None,
    replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A round of recursive rejection sampling: :func:`round_setup` then :func:`_rank_loop`.

    Args:
        tree_tokens, tree_parents, tree_depth, tree_valid (torch.Tensor): ``[B, S]``, the tree's fields.
        p (torch.Tensor): ``[B, S, V]`` float32 or float64 target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` distribution each slot's token was drawn from, p's dtype.
        test (torch.Tensor): ``[B, S]`` float64, each slot's uniform (its test as a child), or its ``[B, S, 2]``
            float32 halves (``specdec.verify.draws.slot_uniform``).
        max_children (int | None): the tree's stated bound on children (``K``; ``S - 1`` when None).
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``r [B, S, V]`` (p's dtype) and ``nxt [B, S]`` int64, as
        :func:`_rank_loop`.
    """
    from specdec.verify.draws import slot_uniform

    ranked = round_setup(tree_tokens, tree_parents, tree_depth, tree_valid, q, slot_uniform(test), max_children,
                         replacement)  # fmt: skip
    return _rank_loop(p, q, **ranked, replacement=replacement)


def _rank_loop(
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
        p (torch.Tensor): ``[B, S, V]`` float32 or float64 target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` distribution each slot's token was drawn from, p's dtype.
        table (torch.Tensor): ``[B, S, K]`` int64, each node's child slot by rank, ``S`` where it has none.
        tokens (torch.Tensor): ``[B, S, K]`` int64, the children's tokens.
        weighed (torch.Tensor): ``[B, S, K]`` float64, each child's uniform times ``q_c(c)``.
        drawable (torch.Tensor): ``[B, S, K]`` bool, the children tested (real, inside q's support).
        kept (torch.Tensor | None): ``[B, S, K]`` q's dtype, 1 minus q's mass on the earlier siblings' tokens (read
            only without replacement; None allowed with it).
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``r [B, S, V]`` (p's dtype), each node's target distribution reduced by its
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


def rejection_walk_reference(
    tokens: torch.Tensor, depth: torch.Tensor, nxt: torch.Tensor, r: torch.Tensor, u: torch.Tensor, max_depth: int
):
    """The accepted path after a round: from the root along each node's accepted child ``nxt [B, S]`` (pointer
    doubling, ``specdec.verify.draws.forward_path``), then the bonus drawn from the end node's ``r [B, S, V]`` by
    inverse CDF at its uniform ``u [B, S]`` float64 (or its ``[B, S, 2]`` float32 halves, ``draws.slot_uniform``;
    ``categorical``: a float64 cumulative sum), as an
    :class:`~specdec.types.Accept` of ``max_depth + 1`` slots (``accept_path``). ``tokens`` / ``depth``: the tree's
    ``[B, S]`` int64."""
    from specdec.types import DeviceTree
    from specdec.verify.draws import accept_path, categorical, forward_path, slot_uniform

    path = forward_path(nxt, max_depth)
    current = path[:, -1:]
    end = r.gather(1, current[..., None].expand(-1, -1, r.shape[-1]))[:, 0]
    bonus = categorical(end, slot_uniform(u).gather(1, current)[:, 0])
    # accept_path reads the tokens and depths only: the other fields are placeholder views (no kernel)
    return accept_path(DeviceTree(tokens=tokens, parents=nxt, depth=depth, valid=nxt, num_nodes=nxt[:, 0]), path, bonus)
