"""Snapshot / restore of a whole HF cache (attention KV, conv windows, recurrent states, layer flags).

The always-correct fallback for hybrid targets and the oracle of the exact tree commit: snapshot before a
verify forward, restore afterwards, re-run the accepted tokens. Works on any ``transformers`` cache whose
state lives in ``cache.layers`` (``DynamicLayer``, ``LinearAttentionLayer``, their combinations, static layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LayerSnapshot", "Snapshot", "restore", "snapshot"]

_ATTENTION = ("clone", "length")


@dataclass(frozen=True)
class LayerSnapshot:
    """Saved attributes of one cache layer.

    Args:
        tensors (dict[str, torch.Tensor]): cloned tensor attributes (attention ``keys``/``values`` in clone mode).
        linear (dict[str, Any]): dict attributes (``conv_states``, ``recurrent_states``, flags), tensors cloned.
        scalars (dict[str, Any]): every other attribute (lengths, flags, device, dtype), as is.
        lengths (dict[str, int]): ``keys``/``values`` lengths in ``attention="length"`` mode.
    """

    tensors: dict[str, torch.Tensor]
    linear: dict[str, Any]
    scalars: dict[str, Any]
    lengths: dict[str, int]


@dataclass(frozen=True)
class Snapshot:
    """A copy of a cache's state; ``restore(cache, snap)`` puts it back (any number of times)."""

    layers: tuple[LayerSnapshot, ...]
    attention: str

    @property
    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            total += sum(t.numel() * t.element_size() for t in layer.tensors.values())
            for value in layer.linear.values():
                if isinstance(value, dict):
                    total += sum(t.numel() * t.element_size() for t in value.values() if isinstance(t, torch.Tensor))
        return total


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _is_append_only(layer) -> bool:
    # Sliding-window and static layers rewrite old positions, so their length alone cannot restore them.
    return type(layer).__name__ in ("DynamicLayer", "LinearAttentionAndFullAttentionLayer")


def snapshot(cache, *, attention: str = "clone") -> Snapshot:
    """Copy every layer's state of ``cache``.

    Args:
        cache: an HF ``Cache`` (e.g. ``DynamicCache(config=...)``).
        attention (str): ``"clone"`` (default) copies attention ``keys``/``values``; ``"length"`` records only
            their length on append-only layers (``DynamicLayer``), valid while positions below that length are
            never rewritten, as in specdec's verify + commit. Conv and recurrent states are always cloned.

    Returns:
        Snapshot.
    """
    if attention not in _ATTENTION:
        raise ValueError(f"attention={attention!r}: choose one of {_ATTENTION}.")
    layers = []
    for layer in cache.layers:
        tensors, linear, scalars, lengths = {}, {}, {}, {}
        for name, value in vars(layer).items():
            if isinstance(value, torch.Tensor):
                if attention == "length" and name in ("keys", "values") and _is_append_only(layer) and value.dim() == 4:
                    lengths[name] = value.shape[-2]
                else:
                    tensors[name] = _clone(value)
            elif isinstance(value, dict):
                linear[name] = _clone(value)
            else:
                scalars[name] = value
        layers.append(LayerSnapshot(tensors=tensors, linear=linear, scalars=scalars, lengths=lengths))
    return Snapshot(layers=tuple(layers), attention=attention)


def _copied_in_place(current, saved) -> bool:
    """Write ``saved`` into ``current`` when shapes agree (keeps static addresses); False if it cannot."""
    if not (isinstance(saved, torch.Tensor) and isinstance(current, torch.Tensor)):
        return False
    if current.shape != saved.shape or current.dtype != saved.dtype or current.device != saved.device:
        return False
    current.copy_(saved)
    return True


def restore(cache, snap: Snapshot) -> None:
    """Put ``cache`` back into the state of ``snap`` (taken from this same cache)."""
    if len(cache.layers) < len(snap.layers):
        raise ValueError(f"Snapshot has {len(snap.layers)} layers but the cache only {len(cache.layers)}.")
    del cache.layers[len(snap.layers) :]
    for layer, saved in zip(cache.layers, snap.layers, strict=True):
        for name, value in saved.scalars.items():
            setattr(layer, name, value)
        for name, value in saved.tensors.items():
            if not _copied_in_place(getattr(layer, name, None), value):
                setattr(layer, name, _clone(value))
        for name, length in saved.lengths.items():
            current = getattr(layer, name)
            if current.shape[-2] < length:
                raise ValueError(
                    f"Cannot restore {name} of {length} positions from a cache holding {current.shape[-2]}."
                )
            setattr(layer, name, current[..., :length, :])
        for name, value in saved.linear.items():
            current = getattr(layer, name, None)
            if not isinstance(current, dict):
                setattr(layer, name, _clone(value))
                continue
            for key in [k for k in current if k not in value]:
                del current[key]
            for key, item in value.items():
                if not _copied_in_place(current.get(key), item):
                    current[key] = _clone(item)
