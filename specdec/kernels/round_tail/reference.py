"""``round_tail`` reference: the end of a decode round in plain tensor ops (what runs off CUDA, and what the Triton
kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch

__all__ = ["round_tail_reference"]


def round_tail_reference(out, tokens, active, root, prefix, num_path=None, num_nodes=None) -> None:
    """Arguments as ``round_tail``: the output row, then the next roots and lengths."""
    width = tokens.shape[1]
    out[:, :width].copy_(tokens)
    if num_path is None:
        choice = tokens[:, 0]
        root.copy_(torch.where(active, choice, root))
        prefix.add_(active)  # bool into int64: +1 where active
        return
    out[:, width] = num_path
    if num_nodes is not None:
        out[:, width + 1] = num_nodes
    choice = tokens.gather(1, (num_path - 1)[:, None])[:, 0]
    root.copy_(torch.where(active, choice, root))
    prefix.add_(num_path * active)
