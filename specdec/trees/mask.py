"""Ancestor masks and positions for verifying a parent-array tree in one forward."""

from __future__ import annotations

import torch

from specdec.kernels.tree_accept.reference import ancestor_mask

__all__ = ["ancestor_mask", "tree_attention_bias", "tree_position_ids"]




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
