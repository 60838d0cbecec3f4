"""Small tree constructors: root-only, chains, and tries built from token paths."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.types import DraftTree, TreeRow

__all__ = ["chain_tree", "paths_to_tree", "prune_depth", "root_tree"]


def root_tree(root_token: int, device: torch.device | str = "cpu") -> DraftTree:
    """The one-node tree of plain autoregressive decoding."""
    return DraftTree(torch.tensor([root_token], device=device), torch.tensor([-1]))


def chain_tree(root_token: int, drafts: Sequence[int], device: torch.device | str = "cpu") -> DraftTree:
    """A chain ``root -> drafts[0] -> drafts[1] ...`` (``parents = [-1, 0, 1, ...]``)."""
    tokens = torch.tensor([root_token, *drafts], dtype=torch.long, device=device)
    return DraftTree(tokens, torch.arange(-1, len(drafts), dtype=torch.long))


def paths_to_tree(
    root_token: int, paths: Sequence[Sequence[int]], *, budget: int, device: torch.device | str = "cpu"
) -> DraftTree:
    """Merge token paths below the root into a trie, in path order, keeping at most ``budget`` non-root nodes.

    Earlier paths win: nodes are added path by path, token by token, until the budget is spent.
    """
    tokens, parents = [root_token], [-1]
    children: dict[tuple[int, int], int] = {}
    for path in paths:
        node = 0
        for tok in path:
            key = (node, int(tok))
            if key not in children:
                if len(tokens) - 1 >= budget:
                    break
                children[key] = len(tokens)
                tokens.append(int(tok))
                parents.append(node)
            node = children[key]
    return DraftTree(torch.tensor(tokens, dtype=torch.long, device=device), torch.tensor(parents, dtype=torch.long))


def prune_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """Drop the nodes deeper than ``max_depth`` (the tree stays prefix-closed; node order is kept)."""
    if tree.max_depth <= max_depth:
        return tree
    keep = (tree.depth <= max_depth).nonzero().squeeze(-1)  # [M], increasing
    remap = torch.full((tree.num_nodes,), -1, dtype=torch.long)
    remap[keep] = torch.arange(keep.numel())
    parents = tree.parents[keep]
    parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], parents)
    return DraftTree(tree.tokens[keep.to(tree.tokens.device)], parents)


def to_draft_tree(tree: TreeRow) -> DraftTree:
    """The real nodes as a :class:`~specdec.types.DraftTree` (reads ``num_nodes`` on the host: not for graphs).

    Args:
        tree (TreeRow): ``S`` slots.

    Returns:
        DraftTree: ``tokens [n]`` on the tree's device, ``parents [n]`` on CPU.
    """
    n = int(tree.num_nodes)
    return DraftTree(tree.tokens[:n], tree.parents[:n].cpu())
