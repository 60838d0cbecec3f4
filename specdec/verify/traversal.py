"""Traversal verification (Weng et al., NeurIPS 2025): a sampled tree verified leaf to root, whole paths at once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.types import Accept, DeviceTree, SamplingParams
from specdec.verify.draws import WeighsQ, accept_at, categorical, uniforms
from specdec.verify.multidraft import check_sampled_policy
from specdec.verify.rules import register_rule

__all__ = ["TraversalVerification", "postorder", "traversal_verify"]


def _ancestors(tree: DeviceTree, max_depth: int) -> torch.Tensor:
    """``[B, S, max_depth + 1]``: the ancestor ``s`` levels above each slot (the slot itself at ``s = 0``; the root,
    or a padding slot itself, past the top)."""
    up = [torch.arange(tree.num_slots, device=tree.tokens.device).expand_as(tree.tokens)]
    for _ in range(max_depth):
        parent = tree.parents.gather(1, up[-1])
        up.append(torch.where(parent >= 0, parent, up[-1]))
    return torch.stack(up, -1)


def postorder(tree: DeviceTree, max_depth: int) -> torch.Tensor:
    """``[B, S]`` slots in depth-first post-order, children in slot order (each subtree contiguous, a node after
    its subtree): the real non-root nodes, then the root, then the padding.

    The reverse of a post-order is the pre-order with children in reverse order, i.e. the lexicographic order of
    the root-to-node slot sequences with each slot ``j >= 1`` keyed ``S + 1 - j`` (a prefix first); it is built
    with stable sorts, one per depth, least significant first.
    """
    slots = tree.num_slots
    up = _ancestors(tree, max_depth)  # [B, S, D + 1]
    d = torch.arange(max_depth + 1, device=up.device)
    steps = tree.depth[..., None] - d  # levels from the node up to its depth-d ancestor
    at_depth = up.gather(2, steps.clamp(min=0))  # [B, S, D + 1]: the ancestor at depth d
    keys = torch.where(steps >= 0, slots + 1 - at_depth, 0)
    order = torch.arange(slots, device=up.device).expand_as(tree.tokens)
    for level in reversed(range(max_depth + 1)):
        key = keys[..., level].gather(1, order)
        order = order.gather(1, torch.sort(key, dim=1, stable=True).indices)
    return order.flip(1)


def _sibling_proposals(tree: DeviceTree, q: torch.Tensor, replacement: bool) -> torch.Tensor:
    """The distribution each node was drawn from as a sibling, ``[B, S, V]``: its depth's q, or (without
    replacement) q with the tokens of its earlier siblings removed, renormalised."""
    if replacement:
        return q
    slots = tree.num_slots
    index = torch.arange(slots, device=q.device)
    earlier = (
        (tree.parents[:, :, None] == tree.parents[:, None, :])
        & (index[None, None, :] < index[None, :, None])
        & tree.valid[:, None, :]
        & (tree.depth[:, :, None] > 0)
    )  # [B, S, S]: j is an earlier sibling of i
    onehot = (tree.tokens[..., None] == torch.arange(q.shape[-1], device=q.device)).to(q.dtype)  # [B, S, V]
    drawn = torch.bmm(earlier.to(q.dtype), onehot) > 0
    kept = q.masked_fill(drawn, 0.0)
    return kept / kept.sum(-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny)


def traversal_verify(tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor, max_depth: int,
                     replacement: bool) -> Accept:  # fmt: skip
    """Traversal verification over ``tree``, nodes visited in post-order (``postorder``).

    Each node ``a`` with parent ``b`` carries a weight, set when its subtree is entered (its earlier siblings'
    subtrees all rejected): ``w_a = min(1, w_b P_b(x_a) / Q_a(x_a))``, the capped likelihood ratio of the path
    (``w_root = 1``; ``P_b`` the parent's current target distribution, ``Q_a`` the distribution ``a`` was drawn
    from). A node is tested once its children are all rejected: accepted with probability ``w_a`` (then the path
    root..a is accepted and the bonus drawn from ``P_a``), else it is removed and its parent corrected:
    ``P_b <- norm(max(0, w_b P_b - Q_a))``, ``w_b <- |.| / (|.| + 1 - w_b)``. If every node is rejected the
    bonus is drawn from the root's corrected ``P``. On a chain this is block verification.

    Args:
        tree (DeviceTree): ``[B, S]``.
        p (torch.Tensor): ``[B, S, V]`` float32 (or float64) target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` draft distribution of each node's depth, p's dtype (read at real non-root
            nodes only).
        noise (torch.Tensor): ``[B, S, >= 4]`` uniforms (``draws.uniform`` 0: the node's test, 1: the final draw).
        max_depth (int): the deepest node; the result has ``max_depth + 1`` slots.
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).
    """
    batch, slots, vocab = p.shape
    rows = torch.arange(batch, device=p.device)
    tiny = torch.finfo(p.dtype).tiny
    u = uniforms(noise, 2)
    test, final = u[..., 0], u[..., 1]
    drawn_from = _sibling_proposals(tree, q, replacement)  # [B, S, V]
    q_tok = drawn_from.gather(2, tree.tokens[..., None])[..., 0]  # [B, S]
    live = tree.valid & (tree.depth > 0) & (q_tok > 0)
    parent = tree.parents.clamp(min=0)
    target = p.clone()
    p_tok = p.gather(1, parent[..., None].expand(-1, -1, vocab)).gather(2, tree.tokens[..., None])[..., 0]
    up = _ancestors(tree, max_depth)  # [B, S, D + 1]
    order = postorder(tree, max_depth)
    touched = torch.zeros(batch, slots, dtype=torch.bool, device=p.device)  # a node of its subtree was visited
    w = torch.ones(batch, slots, dtype=p.dtype, device=p.device)

    def enter(w: torch.Tensor) -> torch.Tensor:
        """Weights of the subtrees not entered yet, from their parents' current state (top-down, max_depth sweeps)."""
        for _ in range(max_depth):
            fresh = torch.where(live, (w.gather(1, parent) * p_tok / q_tok.clamp(min=tiny)).clamp(max=1.0), 0.0)
            w = torch.where(~touched & (tree.depth > 0), fresh, w)
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
        fresh_tok = target[rows, above].gather(1, tree.tokens)  # the corrected P_b at every node's token
        p_tok = torch.where(tree.parents == above[:, None], fresh_tok, p_tok)
        w = enter(w)
    bonus = categorical(target[rows, end], final.gather(1, end[:, None])[:, 0])
    return accept_at(tree, end, bonus, max_depth)


@dataclass(frozen=True)
class TraversalVerification(WeighsQ):
    """Traversal verification: leaf-to-root over the whole tree (``traversal_verify``); a node is accepted on the
    capped likelihood ratio of its whole path, and a rejected subtree corrects its parent instead of ending the
    round, so deep candidates under a doubtful parent still count. On a chain it is :class:`BlockVerification`.

    ``replacement=False`` (default): siblings are a sample without replacement (a sibling repeating an earlier
    one's token has probability 0 and is skipped with its subtree); exact for ``SampledChain`` and
    ``SampledTrees`` (merged or not). ``replacement=True``: siblings are i.i.d. draws; exact for ``SampledChain``
    and ``SampledTrees(merge=False)``, not for the merged trie (refused). The rule reads rejected siblings'
    subtrees, so every node's children must be drawn independently of the other nodes' at its depth:
    ``GumbelTopKTree`` and ``StochasticDDTree`` (one draw per depth) are refused. At ``do_sample=False`` it is
    :class:`~specdec.verify.Greedy`.

    Args:
        replacement (bool): the siblings' law, as above.
    """

    replacement: bool = False
    name = "traversal"

    def check(self, sampling: SamplingParams, tree) -> None:
        if tree is None:  # plain decoding: the root alone
            return
        name = type(tree).__name__
        if name == "SampledTrees" and self.replacement and getattr(tree, "merge", True):
            raise ValueError(
                "TraversalVerification(replacement=True) is not exact for SampledTrees(merge=True): merged "
                "duplicate siblings are a sample without replacement; use replacement=False or merge=False."
            )
        if name in ("GumbelTopKTree", "StochasticDDTree"):
            raise ValueError(
                f"TraversalVerification is not exact for {name}: the tree shares one draw per depth between "
                "all nodes of that depth, and traversal reads the subtrees of rejected siblings; use "
                f"SampledTrees, or MultiDraftRejection(replacement=False) with {name}."
            )
        merge = "merge=False" if self.replacement else ""
        check_sampled_policy(f"TraversalVerification(replacement={self.replacement})", sampling, tree,
                             {"SampledChain": "", "SampledTrees": merge})  # fmt: skip

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise, max_depth: int) -> Accept:
        return traversal_verify(tree, p, q, noise, max_depth, self.replacement)


register_rule("traversal", TraversalVerification)
