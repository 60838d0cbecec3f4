"""``categorical_draws`` reference: ``m`` inverse-CDF draws per row from the round's noise, as tensor ops."""

from __future__ import annotations

import torch

__all__ = ["categorical_draws_reference"]


def categorical_draws_reference(probs: torch.Tensor, noise: torch.Tensor, num: int) -> torch.Tensor:
    """``num`` draws per row of ``probs [B, L, V]`` (non-negative, any positive total), draw ``j`` by inverse CDF at
    the float64 uniform made of the float32 pair ``noise[..., 2j : 2j + 2]`` (``specdec.verify.draws.uniforms``):
    ``categorical(probs, uniforms(noise, num), draws=True)``, ``[B, L, num]`` int64 (one float64 cumulative sum per
    row, five launches on CUDA)."""
    from specdec.verify.draws import categorical, uniforms

    return categorical(probs, uniforms(noise, num), draws=True)
