"""``topk_mask`` reference: HF's ``TopKLogitsWarper`` formula verbatim (what runs off CUDA, and what the Triton kernel
in ``triton.py`` is tested against, besides HF's warper itself)."""

from __future__ import annotations

import torch

__all__ = ["topk_mask_reference"]


def topk_mask_reference(scores: torch.Tensor, k: int, filter_value: float = float("-inf")) -> torch.Tensor:
    """``scores`` with every entry strictly below its row's ``k``-th largest value set to ``filter_value``: HF's
    ``scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], filter_value)``, a new tensor.
    ``1 <= k <= scores.shape[-1]``."""
    indices_to_remove = scores < torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(indices_to_remove, filter_value)
