"""``tree_attention``: a few query rows (a decode step, or a draft tree of up to ~128 nodes) of each of ``B``
sequences attending over a long key / value span of a static cache, with grouped-query heads, an arbitrary per-row
visibility mask and, optionally, each sequence's length (the slots it may read: its committed prefix and the call's
own rows), so that a call reads each K / V row it needs once and nothing of the static capacity past it.

The reference (the specification and the CPU path) expands K / V per query head and takes an fp32 softmax, as HF's
eager / SDPA attention does. The Triton version (``triton.py``) never expands K / V: the ``rep = H // H_kv`` query
heads of a group are stacked along the row axis so every K / V tile it loads serves all of them, and the key axis
is split into chunks run by separate programs (split-KV, "flash-decoding"), whose fp32 partial softmax states a
second launch combines. It reads nothing on the host, so it can be captured in a CUDA graph.

Every query row must see at least one key slot (the caller's guarantee, as in any causal or tree mask): for a row
that sees none, the reference and the kernel may return anything (no error is raised).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from specdec.kernels._triton import importable, pick_impl
from specdec.kernels.tree_attention.reference import tree_attention_reference

__all__ = [
    "FLOAT_DTYPES",
    "TRITON_DTYPES",
    "TRITON_HEAD_DIMS",
    "fits_triton",
    "tree_attention",
    "tree_attention_reference",
    "triton_picked",
]

_MODULE = "specdec.kernels.tree_attention.triton"

Impl = Literal["auto", "torch", "triton"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The dtypes query / key / value may have (all three the same)."""

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes the Triton version takes; with others ``impl="auto"`` uses the reference."""

TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)
"""The head dims the Triton version takes (a power of two, whole in one tile); others fall back in ``"auto"``."""


def tree_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    lengths: torch.Tensor | None = None,
    *,
    impl: Impl = "auto",
    flat: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked grouped-query attention of ``Q`` query rows over ``S`` key slots, per sequence. Arguments as
    :func:`tree_attention_reference` (``lengths``: ``[B]`` int32 / int64 on query's device, each in ``[1, S]``:
    the caller's guarantee, not checked, since checking would read the device; ``flat``: ``[B]`` likewise, the
    flat prefix of each sequence, whose mask the Triton version does not read past slot 0).

    Args:
        impl (str): ``"triton"`` (split-KV: CUDA or Triton's interpreter; fp32 / bf16 / fp16 and a head dim in
            ``TRITON_HEAD_DIMS``), ``"torch"`` (the reference) or ``"auto"``: Triton on CUDA (or under
            ``TRITON_INTERPRET=1``) when it imports and the call fits it, else the reference.

    Returns:
        torch.Tensor: ``[B, Q, H, D]`` contiguous, query's dtype (the layout of HF's attention functions).
    """
    _check_args(query, key, value, mask, scale, impl, lengths)
    _check_lengths("flat", flat, query)
    if pick_impl(impl, query.device, _MODULE, fits=_fits_triton(query)) == "torch":
        return tree_attention_reference(query, key, value, mask, scale, lengths, flat)
    from specdec.kernels.tree_attention.triton import tree_attention_triton

    return tree_attention_triton(query, key, value, mask, scale, lengths, flat=flat)


def _triton_available() -> bool:
    return importable(_MODULE)


def _fits_triton(query: torch.Tensor) -> bool:
    """Whether the Triton version takes the call: its dtype and a head dim held whole in one tile."""
    return fits_triton(query.dtype, query.shape[-1])


def fits_triton(dtype: torch.dtype | None = None, head_dim: int | None = None) -> bool:
    """Whether the Triton version takes queries of ``dtype`` and ``head_dim`` (None: not known yet, not held
    against it)."""
    return (dtype is None or dtype in TRITON_DTYPES) and (head_dim is None or head_dim in TRITON_HEAD_DIMS)


def triton_picked(device: torch.device, dtype: torch.dtype | None = None, head_dim: int | None = None) -> bool:
    """Whether ``impl="auto"`` runs the Triton version for queries of ``dtype`` / ``head_dim`` on ``device``. When it
    does on CUDA, the device's shared-memory limit is read now (the launch plans depend on it), so that calls traced
    by ``torch.compile`` later find it cached."""
    picked = pick_impl("auto", device, _MODULE, fits=fits_triton(dtype, head_dim)) == "triton"
    if picked and device.type == "cuda" and not torch.compiler.is_compiling():
        from specdec.kernels.tree_attention.triton import shared_limit

        shared_limit(device)
    return picked


def _describe(t) -> str:
    return f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_lengths(name: str, lengths, query: torch.Tensor) -> None:
    batch = query.shape[0]
    if lengths is not None and (
        not isinstance(lengths, torch.Tensor)
        or lengths.dtype not in (torch.int32, torch.int64)
        or tuple(lengths.shape) != (batch,)
        or lengths.device != query.device
    ):
        what = "readable slots (prefix + the call's rows)" if name == "lengths" else "flat prefix (slots)"
        raise ValueError(f"{name} must be None or a [B] = [{batch}] int32 / int64 tensor on {query.device}; got "
                         f"{_describe(lengths)}: pass each sequence's {what}.")  # fmt: skip


def _check_args(query, key, value, mask, scale, impl: str = "auto", lengths=None) -> None:
    names = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.dtype not in FLOAT_DTYPES:
            layout = "[B, H, Q, D]" if name == "query" else "[B, H_kv, S, D]"
            raise ValueError(f"{name} must be a 4-d {layout} tensor of {names}; got {_describe(t)}: pass the "
                             "(batch, heads, positions, head dim) tensor, in a float dtype.")  # fmt: skip
    batch, heads, rows, dim = query.shape
    for name, t in (("key", key), ("value", value)):
        if t.shape[0] != batch:
            raise ValueError(f"{name} has batch {t.shape[0]}, query {batch}: pass one K / V row per sequence.")
    _, kv_heads, slots, kv_dim = key.shape
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"query, key and value must share a dtype; got {query.dtype}, {key.dtype}, {value.dtype}: "
                         "convert key and value to query's dtype.")  # fmt: skip
    if value.shape != key.shape:
        raise ValueError(f"value must have key's shape {list(key.shape)}; got {list(value.shape)}: pass the value "
                         "cache span matching the key span.")  # fmt: skip
    if kv_dim != dim:
        raise ValueError(f"key's head dim {kv_dim} differs from query's {dim}: pass matching heads.")
    if heads == 0 or kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"query's H = {heads} heads must be a positive multiple of key's H_kv = {kv_heads}: "
                         "pass the key / value heads of the query's layer (grouped-query attention).")  # fmt: skip
    if slots == 0:
        raise ValueError("key has S = 0 slots: every query row must see at least one key slot.")
    if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
        raise ValueError(f"mask must be a bool (True = visible) or additive float tensor; got {_describe(mask)}: "
                         "convert it (e.g. mask.bool()).")  # fmt: skip
    if mask.dim() != 4 or mask.shape[0] not in (1, batch) or tuple(mask.shape[1:]) != (1, rows, slots):
        raise ValueError(f"mask must be [B, 1, Q, S] = [{batch}, 1, {rows}, {slots}] (or [1, 1, Q, S] for every "
                         f"sequence; one for all heads); got {list(mask.shape)}: slice it to the key span "
                         "(mask[..., :S]), or pass mask[:, :1].")  # fmt: skip
    _check_lengths("lengths", lengths, query)
    for name, t in (("key", key), ("value", value), ("mask", mask)):
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, query on {query.device}: move them to one device.")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r}: pass a finite Python float (a tensor would be read on the host).")
    if impl == "triton" and not _fits_triton(query):
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in TRITON_DTYPES)
        raise ValueError(f"impl='triton' takes {dtypes} with a head dim D in {TRITON_HEAD_DIMS}; got {query.dtype} "
                         f"and D = {dim}: use impl='torch' (or 'auto', which falls back to it).")  # fmt: skip
