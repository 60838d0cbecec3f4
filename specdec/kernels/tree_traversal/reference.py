"""``tree_traversal`` reference: a round of traversal verification as plain tensor ops.

``traversal_round_reference`` visits the tree's nodes in post-order (``postorder``, stable sorts), one step of
~25 tensor ops per slot, each step on the whole batch; like the kernel it reads nothing on the host, so it can be
captured in a CUDA graph. It is the specification of the Triton kernels in ``triton.py`` and what runs off CUDA.
"""

from __future__ import annotations

import torch

__all__ = ["ancestors", "postorder", "sibling_proposals", "traversal_round_reference"]


def ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``[B, S, max_depth + 1]``: the ancestor ``s`` levels above each slot (the slot itself at ``s = 0``; the root,
    or a padding slot itself, past the top). ``parents``: ``[B, S]`` int64, -1 at the root and padding."""
    up = [torch.arange(parents.shape[1], device=parents.device).expand_as(parents)]
    for _ in range(max_depth):
        parent = parents.gather(1, up[-1])
        up.append(torch.where(parent >= 0, parent, up[-1]))
    return torch.stack(up, -1)


def postorder(parents: torch.Tensor, depth: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``[B, S]`` slots in depth-first post-order, children in slot order (each subtree contiguous, a node after
    its subtree): the real non-root nodes, then the root, then the padding.

    The reverse of a post-order is the pre-order with children in reverse order, i.e. the lexicographic order of
    the root-to-node slot sequences with each slot ``j >= 1`` keyed ``S + 1 - j`` (a prefix first); it is built
    with stable sorts, one per depth, least significant first.
    """
    slots = parents.shape[1]
    up = ancestors(parents, max_depth)  # [B, S, D + 1]
    d = torch.arange(max_depth + 1, device=up.device)
    steps = depth[..., None] - d  # levels from the node up to its depth-d ancestor
    at_depth = up.gather(2, steps.clamp(min=0))  # [B, S, D + 1]: the ancestor at depth d
    keys = torch.where(steps >= 0, slots + 1 - at_depth, 0)
    order = torch.arange(slots, device=up.device).expand_as(parents)
    for level in reversed(range(max_depth + 1)):
        key = keys[..., level].gather(1, order)
        order = order.gather(1, torch.sort(key, dim=1, stable=True).indices)
    return order.flip(1)


def sibling_proposals(tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor,
                      q: torch.Tensor, replacement: bool) -> torch.Tensor:  # fmt: skip
    """The distribution each node was drawn from as a sibling, ``[B, S, V]``: its depth's q, or (without
    replacement) q with the tokens of its earlier siblings removed, renormalised."""
    if replacement:
        return q
    slots = tokens.shape[1]
    index = torch.arange(slots, device=q.device)
    earlier = (
        (parents[:, :, None] == parents[:, None, :])
        & (index[None, None, :] < index[None, :, None])
        & valid[:, None, :]
        & (depth[:, :, None] > 0)
    )  # [B, S, S]: j is an earlier sibling of i
    onehot = (tokens[..., None] == torch.arange(q.shape[-1], device=q.device)).to(q.dtype)  # [B, S, V]
    drawn = torch.bmm(earlier.to(q.dtype), onehot) > 0
    kept = q.masked_fill(drawn, 0.0)
    return kept / kept.sum(-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny)


def traversal_round_reference(
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
    return_target: bool = False,
):
    """Traversal verification over a batch of trees, nodes visited in post-order (``postorder``).

    Each node ``a`` with parent ``b`` carries a weight, set when its subtree is entered (its earlier siblings'
    subtrees all rejected): ``w_a = min(1, w_b P_b(x_a) / Q_a(x_a))``, the capped likelihood ratio of the path
    (``w_root = 1``; ``P_b`` the parent's current target distribution, ``Q_a`` the distribution ``a`` was drawn
    from, ``sibling_proposals``). A node is tested once its children are all rejected: accepted iff its uniform is
    below ``w_a`` (then the path root..a is accepted and the bonus drawn from ``P_a``), else it is removed and its
    parent corrected: ``P_b <- norm(max(0, w_b P_b - Q_a))`` (kept when that mass is 0), ``w_b <- |.| / (|.| + 1 -
    w_b)`` (1 while ``w_b`` is 1). If every node is rejected the bonus is drawn from the root's corrected ``P``.

    Args:
        tokens, parents, depth, valid (torch.Tensor): the tree, ``[B, S]`` (int64; ``valid`` bool).
        p (torch.Tensor): ``[B, S, V]`` float32 (or float64) target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` draft distribution of each node's depth, p's dtype (read at real non-root
            nodes only).
        test (torch.Tensor): ``[B, S]`` float64 uniform of each node's test (or its ``[B, S, 2]`` float32 halves,
            ``draws.slot_uniform``).
        final (torch.Tensor): ``[B, S]`` float64 uniform of the bonus draw at each node (or its halves, as ``test``).
        max_depth (int): the deepest node; the result has ``max_depth + 1`` slots.
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).

        return_target (bool): also return the end node's distribution (the bonus's).

    Returns:
        Accept: ``path`` / ``tokens [B, max_depth + 1]`` and ``num_path [B]``, int64; with ``return_target``
        ``(Accept, target)``, ``target [B, V]`` p's dtype.
    """
    from specdec.types import DeviceTree
    from specdec.verify.draws import accept_at, categorical, slot_uniform

    test, final = slot_uniform(test), slot_uniform(final)
    batch, slots, vocab = p.shape
    rows = torch.arange(batch, device=p.device)
    tiny = torch.finfo(p.dtype).tiny
    drawn_from = sibling_proposals(tokens, parents, depth, valid, q, replacement)  # [B, S, V]
    q_tok = drawn_from.gather(2, tokens[..., None])[..., 0]  # [B, S]
    live = valid & (depth > 0) & (q_tok > 0)
    parent = parents.clamp(min=0)
    target = p.clone()
    p_tok = p.gather(1, parent[..., None].expand(-1, -1, vocab)).gather(2, tokens[..., None])[..., 0]
    up = ancestors(parents, max_depth)  # [B, S, D + 1]
    order = postorder(parents, depth, max_depth)
    touched = torch.zeros(batch, slots, dtype=torch.bool, device=p.device)  # a node of its subtree was visited
    w = torch.ones(batch, slots, dtype=p.dtype, device=p.device)

    def enter(w: torch.Tensor) -> torch.Tensor:
        """Weights of the subtrees not entered yet, from their parents' current state (top-down, max_depth sweeps)."""
        for _ in range(max_depth):
            fresh = torch.where(live, (w.gather(1, parent) * p_tok / q_tok.clamp(min=tiny)).clamp(max=1.0), 0.0)
            w = torch.where(~touched & (depth > 0), fresh, w)
        return w

    w = enter(w)
    done = torch.zeros(batch, dtype=torch.bool, device=p.device)
    end = torch.zeros(batch, dtype=torch.long, device=p.device)
    for t in range(slots - 1):
        node = order[:, t]
        active = ~done & live.gather(1, node[:, None])[:, 0]
        w_node = w.gather(1, node[:, None])[:, 0]
        accept = active & (test.gather(1, node[:, None])[:, 0] < w_node)
        reject = active & ~accept
        done = done | accept
        end = torch.where(accept, node, end)
        # correct the parent of a rejected node
        above = parent.gather(1, node[:, None])[:, 0]
        w_above = w.gather(1, above[:, None])[:, 0]
        p_above = target[rows, above]
        residual = (w_above[:, None] * p_above - drawn_from[rows, node]).clamp(min=0.0)
        mass = residual.sum(-1)
        corrected = torch.where(mass[:, None] > 0, residual / mass.clamp(min=tiny)[:, None], p_above)
        target[rows, above] = torch.where(reject[:, None], corrected, p_above)
        w_new = torch.where(w_above >= 1.0, 1.0, mass / (mass + 1.0 - w_above).clamp(min=tiny))
        w = w.scatter(1, above[:, None], torch.where(reject, w_new, w_above)[:, None])
        touched = touched.scatter(1, up.gather(1, node[:, None, None].expand(-1, 1, up.shape[-1]))[:, 0], True)
        fresh_tok = target[rows, above].gather(1, tokens)  # the corrected P_b at every node's token
        p_tok = torch.where(parents == above[:, None], fresh_tok, p_tok)
        w = enter(w)
    end_target = target[rows, end]
    bonus = categorical(end_target, final.gather(1, end[:, None])[:, 0])
    # accept_at reads the tokens, parents and depths only: valid and num_nodes are placeholder views (no kernel)
    tree = DeviceTree(tokens=tokens, parents=parents, depth=depth, valid=valid, num_nodes=end)
    accept = accept_at(tree, end, bonus, max_depth)
    return (accept, end_target) if return_target else accept
