"""Static K/V storage for the round: one preallocated tensor for every attention layer, owned by specdec.

All layers live in a single tensor ``kv [L, 2, 1, H_kv, capacity, D]`` so that a commit moves the accepted rows
of every layer with one gather and one scatter. HF attention layers reach it through ``StaticKVCache`` (an HF
``Cache`` whose ``update`` writes the new keys/values at the slots held in ``write_index``, a device tensor
filled before each forward, and returns the first ``span`` slots, set per forward). The attention mask decides
which of those slots a query sees, so stale rows past the committed length are never read. Sliding-window layers
keep every key too: their mask also hides the keys out of the window (``windows.py``). Recurrent layers keep their
conv window and state in static tensors read by specdec's adapters; a "hybrid" layer (attention and a recurrent
mixer in one decoder layer, FalconH1, Zamba2) holds both. Works the same on transformers 5.17 and newer: nothing
here relies on HF's own static-cache bookkeeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin

from specdec.state.hybrid import _state_tensor
from specdec.state.windows import window_layout

if TYPE_CHECKING:
    from specdec.target import TargetModel

__all__ = ["StaticKV", "StaticKVCache", "StaticModel", "commit_rows", "commit_rows_reference", "static_reason"]


class StaticKV:
    """Preallocated K/V rows for ``num_layers`` attention layers of identical shape.

    Args:
        num_layers (int), num_kv_heads (int), head_dim (int): attention shape.
        capacity (int): slots per layer (prompt + new tokens + the largest tree).
        dtype, device: of the rows.
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, dtype, device) -> None:
        self.capacity = capacity
        self.kv = torch.zeros(num_layers, 2, 1, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        # Slots written by the next forward; replaced by a tensor of the forward's length before each call.
        self.write_index = torch.zeros(1, dtype=torch.long, device=device)
        # Slots the next forward attends over (``[0, span)``); set before each call, fixed inside a captured graph.
        self.span = capacity


class _StaticLayer(CacheLayerMixin):
    """One attention layer's view of ``StaticKV`` (HF layer protocol)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, storage: StaticKV, layer: int) -> None:
        super().__init__()
        self.storage = storage
        self.keys = storage.kv[layer, 0]
        self.values = storage.kv[layer, 1]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # storage is allocated up front
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        index, span = self.storage.write_index, self.storage.span
        self.keys.index_copy_(2, index, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, index, value_states.to(self.values.dtype))
        return self.keys[:, :, :span], self.values[:, :, :span]

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        return self.storage.span, 0

    def get_seq_length(self) -> int:
        return 0  # positions and masks are always passed explicitly

    def get_max_length(self) -> int:
        return self.storage.capacity

    def reset(self) -> None:
        return None


class _StaticRecurrentLayer:
    """A recurrent (conv + state) layer's static tensors, read and written only by specdec's adapters."""

    is_compileable = True
    is_sliding = False
    is_initialized = True
    supports_early_init = False

    def __init__(self, conv_states: torch.Tensor, recurrent_states: torch.Tensor) -> None:
        self.conv_states = conv_states
        self.recurrent_states = recurrent_states


class _StaticHybridLayer(_StaticLayer):
    """A decoder layer with both attention rows in ``StaticKV`` and a recurrent mixer's static tensors (HF's
    "hybrid" cache layers: FalconH1, Zamba2's shared-attention layers)."""

    def __init__(self, storage: StaticKV, layer: int, conv_states: torch.Tensor, recurrent_states: torch.Tensor):
        super().__init__(storage, layer)
        self.conv_states = conv_states
        self.recurrent_states = recurrent_states


class StaticKVCache(Cache):
    """HF ``Cache`` over a ``StaticKV``: pass it as the model's cache kwarg with an explicit 4D mask and positions.

    Args:
        storage (StaticKV): the attention layers' rows.
        layers (list | None): per model layer, an attention slot index (int) or a layer object
            (``_StaticRecurrentLayer``, ``_StaticHybridLayer``, a stateless layer); None = every layer is attention,
            in order.
    """

    def __init__(self, storage: StaticKV, layers: list | None = None) -> None:
        layout = list(range(storage.kv.shape[0])) if layers is None else layers
        super().__init__(layers=[_StaticLayer(storage, x) if isinstance(x, int) else x for x in layout])
        self.storage = storage


def commit_rows(kv: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor) -> None:
    """Move the rows of the accepted nodes in place for every layer at once (one gather, one scatter).

    The verify forward wrote node i at slot ``prefix + i``; afterwards the path's nodes must sit at
    ``prefix, prefix + 1, ...`` as if run causally. Rows past the path's real length are copied too (the path is
    padded by repeating its last node) and land in free slots, which the next forward overwrites.

    Args:
        kv (torch.Tensor): ``[L, 2, 1, H, capacity, D]`` storage.
        prefix (torch.Tensor): 0-d int64, slot of the tree's root.
        path (torch.Tensor): ``[P]`` int64 node indices, root first, increasing.
    """
    src = kv.index_select(4, path + prefix)
    kv.index_copy_(4, torch.arange(path.shape[0], device=path.device) + prefix, src)


def commit_rows_reference(kv: torch.Tensor, prefix: int, path: list[int]) -> None:
    """Plain per-layer, per-row loop with the same effect as :func:`commit_rows` (the test oracle)."""
    rows = [kv[:, :, :, :, prefix + p].clone() for p in path]
    for j, row in enumerate(rows):
        kv[:, :, :, :, prefix + j] = row


class StaticModel:
    """An HF causal LM over its own ``StaticKV`` (``capacity`` slots): fixed-shape forwards at explicit slots.

    Args:
        target (TargetModel): the wrapped model (attention layers of one shape).
        capacity (int): slots.
    """

    def __init__(self, target: TargetModel, capacity: int) -> None:
        self.target, self.capacity = target, capacity
        probe = DynamicCache(config=target.config)
        ids = torch.zeros(1, 1, dtype=torch.long, device=target.device)
        target.model(input_ids=ids, **{target.cache_kw: probe, "use_cache": True})
        attention = [i for i, layer in enumerate(probe.layers) if _state_tensor(layer, "keys") is not None]
        shapes = {tuple(probe.layers[i].keys.shape[1:]) for i in attention}
        if len(shapes) > 1:
            raise ValueError(f"attention layers of different shapes {sorted(shapes)}")
        heads, _, head_dim = next(iter(shapes)) if shapes else (1, 1, 1)  # a pure SSM has no attention rows
        self.storage = StaticKV(
            num_layers=len(attention),
            num_kv_heads=heads,
            head_dim=head_dim,
            capacity=capacity,
            dtype=target.dtype,
            device=target.device,
        )
        layout: list = []
        # model layer -> its static conv window and recurrent state (a _StaticRecurrentLayer or _StaticHybridLayer)
        self.recurrent: dict[int, _StaticRecurrentLayer | _StaticHybridLayer] = {}
        for i, layer in enumerate(probe.layers):
            conv, rec = _state_tensor(layer, "conv_states"), _state_tensor(layer, "recurrent_states")
            if conv is None and rec is None:  # attention, or a layer that keeps no state (e.g. an MLP-only block)
                layout.append(attention.index(i) if i in attention else layer)
                continue
            if conv is None or rec is None:
                raise ValueError(f"cache layer {i} ({type(layer).__name__}) is neither attention nor conv + state")
            conv, rec = torch.zeros_like(conv), torch.zeros_like(rec)
            if i in attention:  # attention and a recurrent mixer in one layer
                self.recurrent[i] = _StaticHybridLayer(self.storage, attention.index(i), conv, rec)
            else:
                self.recurrent[i] = _StaticRecurrentLayer(conv, rec)
            layout.append(self.recurrent[i])
        self.attention_layers = attention
        self.cache = StaticKVCache(self.storage, layout)
        self.keys = torch.arange(capacity, device=target.device)
        self.windows = window_layout(target.model)
        if self.windows.reason is not None:
            raise ValueError(f"{type(target.model).__name__}: {self.windows.reason}")

    def load(self, cache, length: int) -> None:
        """Copy an HF cache that holds ``length`` prefilled tokens into the static storage (slots ``0 .. length-1``)."""
        for slot, i in enumerate(self.attention_layers):
            layer = cache.layers[i]
            self.storage.kv[slot, 0, :, :, :length].copy_(layer.keys[:, :, :length])
            self.storage.kv[slot, 1, :, :, :length].copy_(layer.values[:, :, :length])
        for i, static in self.recurrent.items():
            static.conv_states.copy_(_state_tensor(cache.layers[i], "conv_states"))
            static.recurrent_states.copy_(_state_tensor(cache.layers[i], "recurrent_states"))

    def causal_mask(
        self, positions: torch.Tensor, visible: torch.Tensor | None = None, span: int | None = None
    ) -> torch.Tensor:
        """Additive mask ``[1, 1, Q, span]``: query q sees the slots ``<= positions[q]`` (where ``visible``).

        Args:
            positions (torch.Tensor): ``[Q]`` int64 slot (= position) of each query.
            visible (torch.Tensor | None): ``[Q, span]`` bool restricting it further (None: no restriction).
            span (int | None): slots attended over, ``[0, span)``; None = the whole capacity.
        """
        seen = self.keys[: span or self.capacity][None] <= positions[:, None]
        return self.additive_mask(seen if visible is None else seen & visible)

    def additive_mask(self, seen: torch.Tensor) -> torch.Tensor:
        """``[Q, capacity]`` bool (True = visible) -> the float mask ``[1, 1, Q, capacity]`` HF attention adds."""
        dtype = self.target.dtype
        mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
        return mask.masked_fill_(~seen, torch.finfo(dtype).min)[None, None]

    def forward(self, ids, positions, mask, write_index, taps=None, *, last_only=False, rows=None, span=None):
        """Logits ``[N, V]`` (``[R, V]`` for ``rows``, see ``TargetModel.forward``) and taps ``[1, N, K*H]``
        (or None) of one forward writing K/V at ``write_index`` and attending over slots ``[0, span)`` (None: the
        whole capacity; ``mask`` is ``[1, 1, N, span]``, the full-attention mask: sliding-window layers also lose
        the keys out of their window, the key of each slot being at the position last written there, ``positions``
        for the slots of ``write_index``, the slot's own index elsewhere)."""
        self.storage.write_index = write_index
        self.storage.span = span or self.capacity
        if self.windows.slides:
            query = positions.reshape(-1)
            key = self.keys[: self.storage.span].index_copy(0, write_index, query)
            mask = self.windows.masks(mask, query, key)
        return self.target.forward(
            ids,
            position_ids=positions,
            attention_mask=mask,
            taps=taps,
            last_only=last_only,
            cache=self.cache,
            rows=rows,
        )


def static_reason(target: TargetModel) -> str | None:
    """None when ``StaticModel`` runs the attention layers of ``target`` (a ``TargetModel``) exactly, else why not:
    masks it does not build (chunked attention, sliding layers of different windows, bidirectional sliding
    layers, sliding and full layers in a model that takes no per-type masks). Sliding-window layers and hybrid
    (attention + recurrent) layers are run; whether the recurrent layers have a device path is
    ``specdec.state.recurrent.hybrid_reason``'s to say."""
    return window_layout(target.model).reason
