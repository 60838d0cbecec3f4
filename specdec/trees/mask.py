"""Ancestor masks and positions for verifying a parent-array tree in one forward."""

from __future__ import annotations

import torch

__all__ = ["ancestor_mask", "tree_attention_bias", "tree_position_ids"]


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


def tree_position_ids(depth: torch.Tensor, prefix_len: int, device: torch.device | str) -> torch.Tensor:
    """Position ids ``[1, N]``: node i sits at ``prefix_len + depth[i]``."""
    return (depth + prefix_len).to(device).unsqueeze(0)


def tree_attention_bias(
    parents: torch.Tensor, prefix_len: int, *, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """Additive float mask ``[1, 1, N, prefix_len + N]``: 0 where visible, ``finfo(dtype).min`` elsewhere.

    Every node sees the whole committed prefix, its ancestors and itself. Float (not bool) because HF's eager
    attention adds the mask to the scores.
    """
    allowed = ancestor_mask(parents.to(device))
    n = allowed.shape[0]
    bias = torch.zeros(1, 1, n, prefix_len + n, dtype=dtype, device=device)
    bias[0, 0, :, prefix_len:].masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias
