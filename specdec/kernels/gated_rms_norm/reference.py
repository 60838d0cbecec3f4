"""``gated_rms_norm`` reference: the gated RMSNorm of Qwen3.5 / Qwen3-Next Gated DeltaNet layers in plain tensor ops
(what runs off CUDA, and what the Triton kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gated_rms_norm_reference"]


def gated_rms_norm_reference(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``weight * rmsnorm(x) * silu(gate)`` with the roundings of the layers' own norm.

    ``x`` is first rounded to ``dtype`` (the recurrence's fp32 output meets the norm in the model's dtype), then:
    normalised in fp32 and rounded to ``dtype``; multiplied by ``weight`` (in the dtype the two promote to); times
    ``silu(gate)`` in fp32; rounded to ``dtype``.

    Args:
        x (torch.Tensor): ``[..., D]`` the recurrence's output (any float dtype).
        gate (torch.Tensor): ``[..., D]`` the gate (the layer's ``z`` projection).
        weight (torch.Tensor): ``[D]`` the norm's weight.
        eps (float): the norm's ``variance_epsilon``.
        dtype (torch.dtype | None): the model's dtype (default ``x.dtype``).

    Returns:
        torch.Tensor: ``x``'s shape, ``dtype``.
    """
    dtype = x.dtype if dtype is None else dtype
    h = x.to(dtype).to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    h = weight * h.to(dtype)
    h = h * F.silu(gate.to(torch.float32))
    return h.to(dtype)
