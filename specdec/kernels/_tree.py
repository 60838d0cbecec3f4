"""Host-side helpers shared by the tree kernels' PyTorch references (parent checks, nodes grouped by depth)."""

from __future__ import annotations

import torch

__all__ = ["check_parents", "nodes_by_depth"]


def check_parents(parents: torch.Tensor, n: int) -> list[int]:
    """The parent array as a list (a host read: reference path only); raises unless ``-1 <= parents[i] < i``."""
    parent_list = [int(p) for p in parents.tolist()]
    bad = [i for i, p in enumerate(parent_list) if not -1 <= p < i]
    if len(parent_list) != n or bad:
        raise ValueError(f"parents must be [N={n}] with -1 <= parents[i] < i; got {parent_list}.")
    return parent_list


def nodes_by_depth(parents: list[int]) -> list[list[int]]:
    """Node indices grouped by depth (a parent of -1 starts a root at depth 0), each group in index order."""
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    groups: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for i, d in enumerate(depth):
        groups[d].append(i)
    return groups
