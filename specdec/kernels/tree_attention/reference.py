"""``tree_attention`` reference: the specification in plain tensor ops (what runs off CUDA, and what the Triton
kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch

__all__ = ["tree_attention_reference"]


def tree_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    lengths: torch.Tensor | None = None,
    flat: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention as HF's eager path computes it: K / V repeated per query head, fp32 scores plus the additive mask,
    softmax, weighted sum of V, rounded to query's dtype.

    Args:
        query (torch.Tensor): ``[B, H, Q, D]`` float (fp32, bf16, fp16 or fp64); any strides.
        key (torch.Tensor): ``[B, H_kv, S, D]``, query's dtype, ``H % H_kv == 0``: query head ``h`` reads key /
            value head ``h // (H // H_kv)``. May be a view of a longer cache (``buf[:, :, :S]``).
        value (torch.Tensor): ``[B, H_kv, S, D]`` like ``key``.
        mask (torch.Tensor): ``[B, 1, Q, S]`` (or ``[1, 1, Q, S]`` for every sequence), shared by all heads: bool
            (True = visible) or an additive float mask (0 = visible, a very negative value such as
            ``torch.finfo(dtype).min`` = hidden). Every row must see at least one slot; for a row that sees none
            the output is unspecified.
        scale (float): the softmax scale (usually ``D ** -0.5``).
        lengths (torch.Tensor | None): ``[B]`` integer: sequence ``b`` reads only slots ``[0, lengths[b])``
            (its committed prefix and this call's rows); slots past it are hidden whatever the mask says and their
            K / V are never used. None = all ``S``.
        flat (torch.Tensor | None): ``[B]`` integer: the flat prefix of sequence ``b``, slots ``[0, flat[b])``,
            where every query row's mask is its value at slot 0 (what the mask holds at the prefix's other slots
            is not read): for a committed prefix that every row sees, or does not see, whole, so that the kernel
            reads no mask there. None = no flat prefix.

    Returns:
        torch.Tensor: ``[B, Q, H, D]`` contiguous, query's dtype.
    """
    rep = query.shape[1] // key.shape[1]
    acc = torch.promote_types(query.dtype, torch.float32)
    k = key.repeat_interleave(rep, dim=1).to(acc)
    v = value.repeat_interleave(rep, dim=1).to(acc)
    if mask.dtype == torch.bool:
        additive = torch.zeros(mask.shape, dtype=acc, device=mask.device)
        additive.masked_fill_(~mask, torch.finfo(acc).min)
    else:
        additive = mask.to(acc)
    if flat is not None:
        prefix = torch.arange(key.shape[2], device=key.device)[None, :] < flat.to(key.device)[:, None]  # [B, S]
        additive = torch.where(prefix[:, None, None], additive[..., :1], additive)
    if lengths is not None:
        slots = torch.arange(key.shape[2], device=key.device)
        past = (slots[None, :] >= lengths.to(key.device)[:, None])[:, None, None]  # [B, 1, 1, S]
        additive = additive.masked_fill(past, torch.finfo(acc).min)
        k = k.masked_fill(past.transpose(-1, -2), 0)  # whatever the storage holds there is never read
        v = v.masked_fill(past.transpose(-1, -2), 0)
    scores = torch.matmul(query.to(acc), k.transpose(-1, -2)) * scale + additive
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v).to(query.dtype)
    return out.transpose(1, 2).contiguous()
