"""``tree_conv`` reference: the depthwise causal conv of every tree node over its own ancestor path, in plain tensor
ops (what runs off CUDA, and what the Triton kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["tree_conv_reference"]


def tree_conv_reference(
    inputs: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    activation: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Depthwise causal conv of every node of a batch of trees over its ancestor path (arguments as
    :func:`specdec.kernels.tree_conv.tree_conv`): gather each node's taps from ``cat(window, inputs)``, multiply by
    the kernel in fp32, sum over the taps, add the bias, apply ``activation`` in fp32, round to ``inputs``' dtype.
    Returns ``[B, N, C]`` (a transposed view)."""
    rows, n, channels = inputs.shape
    src = torch.cat([window, inputs.transpose(1, 2)], dim=2).float()  # [B, C, S + N]
    taps = index.reshape(rows, 1, -1).expand(rows, channels, -1)  # [B, C, N * W]: row b gathers from row b only
    taps = src.gather(2, taps).reshape(rows, channels, n, -1)  # [B, C, N, W]
    out = (taps * weight.float()[None, :, None, :]).sum(-1)  # [B, C, N]
    if bias is not None:
        out = out + bias.float()[None, :, None]
    return activation(out).transpose(1, 2).to(inputs.dtype)
