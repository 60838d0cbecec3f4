"""``tree_accept`` references: the tree round's attention mask and acceptance walk as plain tensor ops.

They are the specification of the Triton kernels in ``triton.py`` and what runs off CUDA; like the kernels they
read nothing on the host, so they can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from specdec.types import AcceptRow, TreeRow

__all__ = ["accept_path_reference", "accept_walk", "ancestor_mask", "tree_mask_reference"]


def ancestor_mask(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """Boolean ``[N, N]`` mask, ``mask[i, j]`` = node j is node i or one of its ancestors, by pointer jumping.

    Round t joins each row with the row of the ancestor ``2**t`` levels up, so ``bit_length(max_depth)`` rounds
    cover every node of depth <= ``max_depth``: tensor ops on the parents' device, no host read. Nodes with parent
    -1 are roots (several are allowed; a padding slot that is its own root sees only itself).

    Args:
        parents (torch.Tensor): ``[N]`` int64 parent array (``parents[i] < i``, -1 for a root).
        max_depth (int | None): an upper bound on the nodes' depth; None = ``N - 1`` (any tree).
    """
    n = parents.numel()
    mask = torch.eye(n, dtype=torch.bool, device=parents.device)  # distances [0, 2**t)
    jump = parents.long()  # the ancestor 2**t levels up, -1 above the root
    for _ in range((n - 1 if max_depth is None else max_depth).bit_length()):
        has = (jump >= 0).unsqueeze(-1)
        hop = jump.clamp(min=0)
        mask = mask | (mask[hop] & has)
        jump = torch.where(jump >= 0, jump[hop], -1)
    return mask


def tree_mask_reference(
    parents: torch.Tensor,
    valid: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The round's mask as tensor ops: :func:`ancestor_mask`, then a gather per key column.

    Args:
        parents (torch.Tensor): ``[S]`` int64; ``parents[0] = -1``, ``parents[i] < i``, padding holds -1.
        valid (torch.Tensor): ``[S]`` bool, True for the real nodes (a prefix of the slots).
        prefix (torch.Tensor): 0-d int64 on the tree's device, the key slot of node 0 (never read on the host).
        capacity (int): key slots, the mask's last dim.
        max_depth (int): an upper bound on the depth of the real nodes, >= 0 (ancestors are followed up to
            ``2**bit_length(max_depth) - 1`` levels, the reach of ``ancestor_mask``).
        dtype (torch.dtype): float dtype of the mask.

    Returns:
        torch.Tensor: ``[1, 1, S, capacity]`` of ``dtype``, 0 where visible, ``torch.finfo(dtype).min`` elsewhere.
    """
    slots = parents.numel()
    ancestors = ancestor_mask(parents, max_depth)
    keys = torch.arange(capacity, device=parents.device)
    rel = keys[None] - prefix
    in_tree = (rel >= 0) & (rel < slots)
    tree_cols = ancestors.gather(1, rel.clamp(0, slots - 1).expand(slots, -1))
    visible = ((rel < 0) & valid[:, None]) | (in_tree & tree_cols)
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def accept_path_reference(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    valid: torch.Tensor,
    choices: torch.Tensor,
    max_depth: int,
) -> AcceptRow:
    """:func:`accept_walk` over the tree's :func:`ancestor_mask`.

    Args:
        tokens (torch.Tensor): ``[S]`` int64 node tokens.
        parents (torch.Tensor): ``[S]`` int64; ``parents[0] = -1``, ``parents[i] < i``, padding holds -1.
        depth (torch.Tensor): ``[S]`` int64 node depths (consistent with ``parents``; padding holds 0).
        valid (torch.Tensor): ``[S]`` bool, True for the real nodes (a prefix of the slots).
        choices (torch.Tensor): ``[S]`` int64, the target's token at each slot.
        max_depth (int): an upper bound on the depth of the real nodes, >= 0; sets ``P = max_depth + 1``.

    Returns:
        AcceptRow: ``(path [P], num_path 0-d, tokens [P])``: the accepted nodes root first (then the last one
        repeated), their count, and the accepted draft tokens followed by the bonus (then 0).
    """
    # accept_walk does not read num_nodes: a placeholder view, no kernel
    tree = TreeRow(tokens=tokens, parents=parents, depth=depth, valid=valid, num_nodes=parents[0])
    return accept_walk(tree, choices, ancestor_mask(parents, max_depth), max_depth=max_depth)


def accept_walk(tree: TreeRow, choices: torch.Tensor, ancestors: torch.Tensor, *, max_depth: int) -> AcceptRow:
    """Walk the tree along the target's choices: the greedy / sample-and-match acceptance, as device ops.

    A node is accepted when it and every non-root ancestor carry their parent's choice (among siblings with
    equal tokens only the first counts); padding never is.

    Args:
        tree (TreeRow): ``S`` slots.
        choices (torch.Tensor): ``[S]`` int64, the target's token at each slot .
        ancestors (torch.Tensor): ``[S, S]`` bool from :func:`ancestor_mask`.
        max_depth (int): an upper bound on the depth of the real nodes, >= 0; sets ``P = max_depth + 1``.

    Returns:
        AcceptRow: the path, its length and the new tokens (accepted drafts + bonus).
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth={max_depth!r}: pass a Python int >= 0 (the deepest node's depth).")
    slots = tree.tokens.numel()
    device = tree.tokens.device
    index = torch.arange(slots, device=device)
    parent = tree.parents.clamp(min=0)
    same = (tree.parents.unsqueeze(-1) == tree.parents) & (tree.tokens.unsqueeze(-1) == tree.tokens) & tree.valid
    first = ~(same & (index < index.unsqueeze(-1))).any(-1)  # no earlier sibling with the same token
    good = (tree.tokens == choices[parent]) & first & (index > 0) | (index == 0)
    accepted = tree.valid & ~(ancestors & ~good).any(-1)  # [S]: a chain from the root
    num_path = accepted.sum()
    steps = max_depth + 1
    spot = torch.where(accepted, tree.depth.clamp(max=steps), steps)  # slot `steps` collects the rest
    path = torch.zeros(steps + 1, dtype=torch.long, device=device).scatter_(0, spot, index * accepted)
    path = path[:steps].cummax(0).values  # accepted indices increase with depth: repeat the last one
    last = path[-1]
    j = torch.arange(steps, device=device)
    drafts = tree.tokens[path[(j + 1).clamp(max=steps - 1)]]
    bonus = choices.gather(0, last.view(1))  # a 0-d index would read it on the host
    tokens = torch.where(j < num_path - 1, drafts, torch.where(j == num_path - 1, bonus, 0))
    return AcceptRow(path=path, num_path=num_path, tokens=tokens)
