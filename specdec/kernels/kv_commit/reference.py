"""``kv_commit`` reference: the accepted path's key / value rows moved to the committed slots in plain tensor ops
(what runs off CUDA, and what the Triton kernel in ``triton.py`` is tested against)."""

from __future__ import annotations

import torch

from specdec.runtime import constant

__all__ = ["kv_commit_reference"]


def kv_commit_reference(kv: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor) -> None:
    """One gather and one scatter for every layer (arguments as ``kv_commit``): the rows ``prefix[b] + path[b, p]``
    read first, then written to ``prefix[b] + p``."""
    path = path.reshape(kv.shape[2], -1)
    prefix = prefix.reshape(-1, 1)
    length = path.shape[1]
    steps = constant(("arange", str(path.device), length), lambda: torch.arange(length, device=path.device))
    dst = steps + prefix  # [B, P] (the steps made once)
    if kv.shape[2] == 1:
        src = kv.index_select(4, (path + prefix)[0])
        kv.index_copy_(4, dst[0], src)
        return
    rows = torch.arange(kv.shape[2], device=path.device)[:, None]
    kv[:, :, rows, :, dst] = kv[:, :, rows, :, path + prefix]  # [B, P, L, 2, H, D]
