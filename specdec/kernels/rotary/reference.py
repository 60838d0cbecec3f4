"""``rotary`` reference: HF's ``apply_rotary_pos_emb`` as tensor ops (the specification, the CPU path, and what the
Triton kernel in ``triton.py`` must equal bit for bit)."""

from __future__ import annotations

import torch

__all__ = ["rotary_reference"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)`` with ``cos`` / ``sin`` broadcast over
    the heads, each product and the sum rounded to the inputs' dtype (PyTorch's elementwise semantics). Partial
    rotary (``cos`` narrower than the head, as Qwen3-Next / Qwen3.5 layers have): the first ``R = cos.shape[-1]``
    dims are rotated so and the rest pass unchanged, ``cat(rotated, rest)``.

    Args:
        q (torch.Tensor): ``[B, H, N, D]`` queries (any strides), ``D`` even.
        k (torch.Tensor): ``[B, H_kv, N, D]`` keys, q's dtype.
        cos, sin (torch.Tensor): ``[B, N, R]`` (or ``[1, N, R]``), q's dtype, ``R <= D`` even.

    Returns:
        (torch.Tensor, torch.Tensor): the rotated ``q`` and ``k``, their shapes and dtype.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = cos.shape[-1]
    if rot == q.shape[-1]:
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    out = []
    for x in (q, k):
        part = x[..., :rot]
        out.append(torch.cat((part * cos + _rotate_half(part) * sin, x[..., rot:]), dim=-1))
    return out[0], out[1]
