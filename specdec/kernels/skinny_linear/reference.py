"""``skinny_linear`` reference: the specification in plain tensor ops (what runs off CUDA, and what the Triton
kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch

__all__ = ["skinny_linear_reference"]


def skinny_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear``: the specification.

    Args:
        x (torch.Tensor): ``[..., K]`` float (fp32, bf16, fp16 or fp64), any leading shape (``M`` = the product of
            the leading dims) and strides.
        weight (torch.Tensor): ``[N, K]``, ``x``"s dtype, on ``x``"s device; any strides (a contiguous weight is
            what the Triton version reads at full speed).
        bias (torch.Tensor | None): ``[N]``, ``x``"s dtype, or None.

    Returns:
        torch.Tensor: ``[..., N]``, ``x``"s dtype.
    """
    return torch.nn.functional.linear(x, weight, bias)
