"""``kv_write`` reference: an attention layer's new keys and values written into the round's static storage at
their slots, in plain tensor ops (what runs off CUDA, and what the Triton kernel in ``triton.py`` is tested
against)."""

from __future__ import annotations

import torch

__all__ = ["kv_write_reference", "write_slots"]


def write_slots(store: torch.Tensor, index: torch.Tensor, states: torch.Tensor) -> None:
    """Write ``states [B, H, N, D]`` into ``store [B, H, capacity, D]`` at the slots ``index [B, N]`` of each row
    (one ``index_copy_`` for one row, one ``index_put_`` for several)."""
    states = states.to(store.dtype)
    if store.shape[0] == 1:
        store.index_copy_(2, index.reshape(-1), states)
        return
    rows = torch.arange(store.shape[0], device=index.device)[:, None]
    store[rows, :, index] = states.transpose(1, 2)  # [B, N, H, D] at (row, :, slot)


def kv_write_reference(
    keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor, key_states: torch.Tensor,
    value_states: torch.Tensor,
) -> None:  # fmt: skip
    """``keys[b, :, index[b, n]] = key_states[b, :, n]`` and the same for values, for every row ``b`` and new row
    ``n`` (``keys`` / ``values [B, H, capacity, D]``, ``index [B, N]`` int64, ``*_states [B, H, N, D]``)."""
    write_slots(keys, index, key_states)
    write_slots(values, index, value_states)
