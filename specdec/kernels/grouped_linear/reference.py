"""``grouped_linear`` references: what the Triton kernels in ``triton.py`` compute, in plain tensor ops (what runs off
CUDA, and what the kernels are tested against)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from specdec.kernels.silu_mul.reference import silu_mul_reference

__all__ = ["gated_linear_reference", "grouped_linear_reference"]


def grouped_linear_reference(x: torch.Tensor, weights: Sequence[torch.Tensor],
                             biases: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor]:  # fmt: skip
    """``[F.linear(x, w_i, b_i) for each weight]``: the projections of one input (a layer's q / k / v)."""
    biases = [None] * len(weights) if biases is None else biases
    return [F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)]


def gated_linear_reference(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    b_gate: torch.Tensor | None = None,
    b_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """``silu(x W_gate^T + b_gate) * (x W_up^T + b_up)``: a gated MLP's input side, each product rounded to ``x``'s
    dtype before the activation (as the layer's own ``gate_proj`` / ``up_proj`` and ``silu_mul`` compute it)."""
    return silu_mul_reference(F.linear(x, w_gate, b_gate), F.linear(x, w_up, b_up))
