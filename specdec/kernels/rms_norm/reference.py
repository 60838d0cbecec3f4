"""``rms_norm`` reference: the specification in plain tensor ops (what runs off CUDA, and what the Triton
kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch

__all__ = ["add_rms_norm_reference", "rms_norm_cat_reference", "rms_norm_reference"]


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, period: int = 1, unit_offset: bool = False
) -> torch.Tensor:
    """The drafter"s ``_RMSNorm`` as tensor ops; a ``[G, D]`` weight is gathered row by row.

    Args:
        x (torch.Tensor): ``[..., D]`` float (fp32, bf16, fp16 or fp64), any leading shape; read as ``x.reshape(-1,
            D)``, rows ``r = 0, 1, ...``.
        weight (torch.Tensor): ``[D]``, or ``[G, D]``: row ``r`` of ``x`` is scaled by ``weight[(r // period) % G]``
            (``x [R, L, H, D]`` with per-layer weights ``[L, D]`` takes ``period=H``).
        eps (float): added to the mean square.
        period (int): consecutive rows of ``x`` sharing a weight row, >= 1 (only read when ``G > 1``).
        unit_offset (bool): the Gemma / Qwen3-Next formula instead: ``(x / rms) * (1 + weight)`` all in fp32,
            rounded once to ``x.dtype``.

    Returns:
        torch.Tensor: ``x``"s shape, dtype ``torch.promote_types(x.dtype, weight.dtype)``: ``weight * (x / rms)``
        with ``x / rms`` computed in fp32 and rounded to ``x.dtype`` first (``unit_offset``: ``x.dtype``).
    """
    norm = _unit_offset_norm if unit_offset else _rms_norm
    if weight.dim() == 2 and weight.shape[0] > 1:
        rows = x.reshape(-1, x.shape[-1])
        index = (torch.arange(rows.shape[0], device=x.device) // period) % weight.shape[0]
        return norm(rows, weight[index], eps).view(x.shape)
    return norm(x, weight.reshape(-1), eps)  # [1, D] -> [D]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``_RMSNorm.forward`` verbatim, ``weight`` broadcast against ``x``."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _unit_offset_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Gemma / Qwen3-Next RMSNorm: normalised in fp32, times ``1 + weight`` in fp32, rounded to ``x``'s dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual add and the RMSNorm after it, as a pre-norm layer runs them: ``s = residual + x`` (the tensor
    add, in ``x``'s dtype) and ``rms_norm_reference(s, weight, eps)``. Returns ``(s, norm of s)``."""
    total = residual + x
    return total, rms_norm_reference(total, weight, eps)


def rms_norm_cat_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    eps_a: float,
    eps_b: float,
    *,
    rows: torch.Tensor | None = None,
    row_map: torch.Tensor | None = None,
    unit_offset: bool = False,
) -> torch.Tensor:
    """Two RMSNorms written side by side, as a head that normalises a token embedding and a hidden state and
    concatenates them (EAGLE-3's layer input, an MTP head's ``fc`` input) runs them: ``torch.cat([rms_norm_reference(
    a, weight_a, eps_a), rms_norm_reference(b, weight_b, eps_b)], -1)``.

    ``rows`` (integer, ``b``'s leading shape): ``a`` is a table ``[N, D]`` and the first half normalises its rows
    ``a[rows]`` (an embedding lookup), or ``a[row_map[rows]]`` with ``row_map`` (e.g. a draft-to-target id map)."""
    if rows is not None:
        a = a[rows if row_map is None else row_map[rows]]
    return torch.cat([rms_norm_reference(a, weight_a, eps_a, unit_offset=unit_offset),
                      rms_norm_reference(b, weight_b, eps_b, unit_offset=unit_offset)], dim=-1)  # fmt: skip
