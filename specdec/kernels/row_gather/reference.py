"""``row_gather`` reference: rows of a table picked by an index tensor, as ``index_select``."""

from __future__ import annotations

import torch

__all__ = ["row_gather_reference"]


def row_gather_reference(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]``: ``[*index.shape, *table.shape[1:]]`` (``index_select`` on the flattened index, as
    ``nn.Embedding``'s lookup)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])
