"""Committing an accepted tree path into HF attention KV caches.

The verify forward appends one K/V entry per tree node after the ``prefix_len`` committed entries. Commit
gathers the accepted node entries (increasing node order) to the front of that window and crops the rest;
rollback drops the whole window. Works on any HF ``Cache`` whose attention layers expose ``keys``/``values``
``[B, H_kv, T, K]`` (``DynamicLayer``). See ``docs/trees.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from specdec.types import DraftTree

__all__ = ["KVState", "gather_kv_window", "truncate_kv"]


def _attention_layers(cache) -> Iterator:
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4:
            yield layer


def gather_kv_window(layer, prefix_len: int, path: Sequence[int]) -> None:
    """Keep ``prefix_len`` entries plus the window entries at ``path`` (node indices) in one attention layer."""
    n = len(path)
    if list(path) != list(range(n)):  # a chain prefix needs no copy, only the crop below
        idx = torch.as_tensor(path, device=layer.keys.device) + prefix_len
        layer.keys[:, :, prefix_len : prefix_len + n] = layer.keys.index_select(2, idx)
        layer.values[:, :, prefix_len : prefix_len + n] = layer.values.index_select(2, idx)
    layer.keys = layer.keys[:, :, : prefix_len + n]
    layer.values = layer.values[:, :, : prefix_len + n]


def truncate_kv(layer, length: int) -> None:
    layer.keys = layer.keys[:, :, :length]
    layer.values = layer.values[:, :, :length]


class KVState:
    """State manager of attention-only targets (every layer a ``DynamicLayer``).

    Protocol shared by all state managers (``specdec.state.manager_for`` picks one per model):

    - ``verify_scope(model, cache, tree, prefix_len)``: context manager wrapped around the target's tree
      forward (hybrid managers take over recurrent mixers there; attention needs nothing).
    - ``commit(cache, prefix_len, path)``: keep the accepted nodes' state, as if the path had been run causally.
    - ``rollback(cache, prefix_len)``: undo a verify forward (used when a round fails).
    """

    name = "kv"

    @contextmanager
    def verify_scope(self, model, cache, tree: DraftTree, prefix_len: int) -> Iterator[None]:
        yield

    def commit(self, cache, prefix_len: int, path: Sequence[int]) -> None:
        for layer in _attention_layers(cache):
            gather_kv_window(layer, prefix_len, path)

    def rollback(self, cache, prefix_len: int) -> None:
        for layer in _attention_layers(cache):
            if layer.keys.shape[2] > prefix_len:
                truncate_kv(layer, prefix_len)
