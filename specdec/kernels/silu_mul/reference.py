"""``silu_mul`` reference: the gated MLP's activation, ``silu(gate) * up``, in plain tensor ops (what runs off CUDA,
and what the Triton kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["silu_mul_reference"]


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up``: the SiLU in ``gate``'s dtype (computed in fp32 and rounded once, as PyTorch does),
    then the product in the dtype the two promote to."""
    return F.silu(gate) * up
