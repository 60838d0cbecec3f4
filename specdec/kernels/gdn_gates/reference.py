"""``gdn_gates`` reference: the Gated DeltaNet adapter's per-node inputs of the recurrence in plain tensor ops (what
runs off CUDA, and what the Triton kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gdn_gates_reference", "l2norm"]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the layer's own ``l2norm``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_gates_reference(
    x: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys, write strengths and log decays of ``T`` nodes from their post-conv projections.

    Args:
        x (torch.Tensor): ``[T, C]`` post-conv ``q | k | v`` (model dtype), ``C >= 2 * num_k_heads * head_k_dim``;
            only the ``q`` and ``k`` columns are read.
        b (torch.Tensor): ``[T, HV]`` the ``in_proj_b`` output (model dtype).
        a (torch.Tensor): ``[T, HV]`` the ``in_proj_a`` output (model dtype).
        a_log (torch.Tensor): ``[HV]`` the layer's ``A_log``.
        dt_bias (torch.Tensor): ``[HV]`` the layer's ``dt_bias``.
        num_k_heads (int): key heads ``H``; value head ``h`` reads key head ``h // (HV // H)``.
        head_k_dim (int): ``K``.
        num_v_heads (int): ``HV``, a multiple of ``H``.

    Returns:
        tuple: ``q [T, HV, K]`` fp32 (L2-normalised, repeated per value head, divided by ``sqrt(K)``), ``k [T, H,
        K]`` fp32 (L2-normalised), ``beta [T, HV]`` fp32 (``sigmoid(b)`` in ``b``'s dtype, widened), ``g [T, HV]``
        fp32 (``-exp(A_log) * softplus(a + dt_bias)``, <= 0).
    """
    total = x.shape[0]
    key_dim = num_k_heads * head_k_dim
    q, k = x[:, :key_dim], x[:, key_dim : 2 * key_dim]
    rep = num_v_heads // num_k_heads
    q = l2norm(q.float().reshape(total, num_k_heads, head_k_dim)).repeat_interleave(rep, dim=1)
    q = q / (head_k_dim**0.5)
    k = l2norm(k.float().reshape(total, num_k_heads, head_k_dim))
    beta = b.reshape(total, -1).sigmoid().float()
    g = -a_log.float().exp() * F.softplus(a.reshape(total, -1).float() + dt_bias)
    return q, k, beta, g
