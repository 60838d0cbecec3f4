"""``kv_write``: an attention layer's new keys and values written into the round's static storage
(``specdec.state.storage``) at their slots, in one launch.

Every attention layer of every forward the round runs (the target's verify, the drafters' steps) writes its new
rows before attending over them. The reference (``reference.py``) is one ``index_copy_`` per tensor (for several
sequences, ``index_put_`` with the row numbers it needs); the Triton version (``triton.py``) copies both in one
launch. ``Backends.kv_write`` (``SPECDEC_KV_WRITE``): ``auto`` (Triton on CUDA outside ``torch.compile``, which
fuses the copies itself), ``triton`` or ``torch``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.kv_write.reference import kv_write_reference, write_slots

__all__ = ["fits_triton", "kv_write", "kv_write_reference", "write_slots"]

_MODULE = "specdec.kernels.kv_write.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.kv_write`` (``SPECDEC_KV_WRITE``): what a call without ``impl`` uses
IMPL = env_default("kv_write")


def fits_triton(keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor, key_states: torch.Tensor,
                value_states: torch.Tensor) -> bool:  # fmt: skip
    """Whether the Triton version takes the call: 4-D stores of one shape ``[B, H, capacity, D]`` and states of one
    shape ``[B, H, N, D]``, ``index [B, N]`` int64, every tensor of one dtype (no cast on the way)."""
    return (
        keys.dim() == 4
        and keys.shape == values.shape
        and key_states.dim() == 4
        and key_states.shape == value_states.shape
        and key_states.shape[:2] == keys.shape[:2]
        and key_states.shape[3] == keys.shape[3]
        and index.shape == (key_states.shape[0], key_states.shape[2])
        and index.dtype == torch.int64
        and keys.dtype == values.dtype == key_states.dtype == value_states.dtype
    )


@torch.no_grad()  # storage for inference: the rows written carry no autograd history
def kv_write(
    keys: torch.Tensor,
    values: torch.Tensor,
    index: torch.Tensor,
    key_states: torch.Tensor,
    value_states: torch.Tensor,
    *,
    impl: Impl | None = None,
) -> None:
    """Write ``key_states`` / ``value_states [B, H, N, D]`` into ``keys`` / ``values [B, H, capacity, D]`` at the
    slots ``index [B, N]`` of each row (in place). Slots must be distinct within a row.

    Args:
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold),
            ``"torch"`` (the reference) or ``"auto"``: Triton where it runs and the call fits, outside
            ``torch.compile``; None: ``Backends.kv_write``.
    """
    impl = IMPL if impl is None else impl
    if impl == "auto" and torch.compiler.is_compiling():  # the compiler fuses the copies itself
        impl = "torch"
    fits = fits_triton(keys, values, index, key_states, value_states)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes stores [B, H, capacity, D] and states [B, H, N, D] of one dtype "
                         f"with index [B, N] int64; got keys {keys.dtype} {list(keys.shape)}, states "
                         f"{key_states.dtype} {list(key_states.shape)}, index {index.dtype} {list(index.shape)}: use "
                         "impl='torch'.")  # fmt: skip
    if pick_impl(impl, keys.device, _MODULE, fits=fits) == "torch":
        kv_write_reference(keys, values, index, key_states, value_states)
        return
    from specdec.kernels.kv_write.triton import kv_write_triton

    kv_write_triton(keys, values, index, key_states, value_states)
