"""``kv_commit``: after a round's verify, the accepted path's key / value rows moved to the committed slots of
every attention layer at once, in one launch.

The verify forward wrote node ``i`` of sequence ``b`` at slot ``prefix[b] + i``; the accepted path's nodes must then
sit at ``prefix[b], prefix[b] + 1, ...`` as if decoded one by one. The reference (``reference.py``) is one gather
and one scatter over the round's storage ``[L, 2, B, H, capacity, D]`` (and the index arithmetic before them: four
launches); the Triton version (``triton.py``) does it in one. ``Backends.kv_write`` (``SPECDEC_KV_WRITE``) picks
both this and ``kv_write``: ``auto`` (Triton on CUDA outside ``torch.compile``), ``triton`` or ``torch``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels import kv_write as kv_write_module
from specdec.kernels._triton import pick_impl
from specdec.kernels.kv_commit.reference import kv_commit_reference

__all__ = ["fits_triton", "kv_commit", "kv_commit_reference"]

_MODULE = "specdec.kernels.kv_commit.triton"

Impl = Literal["auto", "torch", "triton"]


def fits_triton(kv: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor) -> bool:
    """Whether the Triton version takes the call: a 6-D storage with a contiguous last dim, int64 ``prefix`` with one
    entry per sequence and int64 ``path`` with one row per sequence, on the storage's device."""
    batch = kv.shape[2] if kv.dim() == 6 else -1
    return (
        kv.dim() == 6
        and kv.stride(-1) == 1
        and prefix.dtype == path.dtype == torch.int64
        and prefix.numel() == batch
        and (path.dim() == 1 and batch == 1 or path.dim() == 2 and path.shape[0] == batch)
        and prefix.device == path.device == kv.device
    )


@torch.no_grad()  # storage for inference
def kv_commit(kv: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor, *, impl: Impl | None = None) -> None:
    """Move the rows of the accepted nodes in place for every layer at once.

    Args:
        kv (torch.Tensor): ``[L, 2, B, H, capacity, D]`` storage.
        prefix (torch.Tensor): ``[B]`` (or 0-d for one sequence) int64, the slot of each tree's root.
        path (torch.Tensor): ``[B, P]`` (or ``[P]``) int64 node indices, root first, increasing (``path[b, p] >= p``);
            rows past the path's real length repeat its last node and land in free slots the next forward
            overwrites.
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold),
            ``"torch"`` (the reference) or ``"auto"``: Triton where it runs and the call fits, outside
            ``torch.compile``; None: ``Backends.kv_write``.
    """
    impl = kv_write_module.IMPL if impl is None else impl  # the shared Backends field, read at call time
    if impl == "auto" and torch.compiler.is_compiling():  # the compiler fuses the copies itself
        impl = "torch"
    fits = fits_triton(kv, prefix, path)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes a [L, 2, B, H, capacity, D] storage (last dim contiguous) with int64 "
                         f"prefix [B] and path [B, P]; got kv {list(kv.shape)}, prefix {prefix.dtype} "
                         f"{list(prefix.shape)}, path {path.dtype} {list(path.shape)}: use impl='torch'.")  # fmt: skip
    if pick_impl(impl, kv.device, _MODULE, fits=fits) == "torch":
        kv_commit_reference(kv, prefix, path)
        return
    from specdec.kernels.kv_commit.triton import kv_commit_triton

    kv_commit_triton(kv, prefix, path)
