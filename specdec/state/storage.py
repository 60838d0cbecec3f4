"""Static K/V storage for the round: one preallocated tensor for every attention layer, owned by specdec.

All layers live in a single tensor ``kv [L, 2, B, H_kv, capacity, D]`` (``B`` sequences, each with its own slots
from 0) so that a commit moves the accepted rows of every layer with one gather and one scatter. HF attention layers
reach it through ``StaticKVCache`` (an HF ``Cache`` whose ``update`` writes the new keys/values at the slots held in
``write_index``, a device tensor ``[B, N]`` filled before each forward, and returns the first ``span`` slots, set
per forward). The attention mask decides
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

from specdec.kernels.kv_commit import kv_commit
from specdec.kernels.kv_write import kv_write
from specdec.runtime import constant
from specdec.state.hybrid import _state_tensor
from specdec.state.rope import RopeTables
from specdec.state.windows import window_layout

if TYPE_CHECKING:
    from specdec.target import TargetModel

__all__ = [
    "StaticKV",
    "StaticKVCache",
    "StaticModel",
    "commit_rows",
    "commit_rows_reference",
    "mask_values",
    "static_reason",
]


class StaticKV:
    """Preallocated K/V rows for ``num_layers`` attention layers of identical shape.

    Args:
        num_layers (int), num_kv_heads (int), head_dim (int): attention shape.
        capacity (int): slots per layer and sequence (prompt + new tokens + the largest tree).
        dtype, device: of the rows.
        batch (int): sequences held (each has its own ``capacity`` slots). Default 1.
    """

    def __init__(
        self, *, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, dtype, device, batch: int = 1
    ) -> None:
        self.capacity, self.batch = capacity, batch
        self.kv = torch.zeros(num_layers, 2, batch, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        # Slots written by the next forward, ``[B, N]`` (row b's queries write row b's slots); replaced by a tensor of
        # the forward's length before each call.
        self.write_index = torch.zeros(batch, 1, dtype=torch.long, device=device)
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
        kv_write(self.keys, self.values, index, key_states, value_states)  # one launch on CUDA
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


def mask_values(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """0-d ``(0, finfo(dtype).min)`` on ``device``, made once: ``torch.where(seen, *mask_values(...))`` builds an
    additive mask in one kernel (visible 0, hidden the dtype's lowest value)."""

    def make():
        return torch.zeros((), dtype=dtype, device=device), torch.full((), torch.finfo(dtype).min, dtype=dtype,
                                                                        device=device)  # fmt: skip

    return constant(("mask_values", str(device), dtype), make)


def commit_rows(kv: torch.Tensor, prefix: torch.Tensor, path: torch.Tensor) -> None:
    """Move the rows of the accepted nodes in place for every layer at once (``specdec.kernels.kv_commit``: one
    launch on CUDA; elsewhere one gather, one scatter).

    The verify forward wrote node i of sequence b at slot ``prefix[b] + i``; afterwards the path's nodes must sit
    at ``prefix[b], prefix[b] + 1, ...`` as if run causally. Rows past the path's real length are copied too (the
    path is padded by repeating its last node) and land in free slots, which the next forward overwrites.

    Args:
        kv (torch.Tensor): ``[L, 2, B, H, capacity, D]`` storage.
        prefix (torch.Tensor): ``[B]`` (or 0-d for one sequence) int64, slot of each tree's root.
        path (torch.Tensor): ``[B, P]`` (or ``[P]``) int64 node indices, root first, increasing.
    """
    kv_commit(kv, prefix, path)


def commit_rows_reference(kv: torch.Tensor, prefix, path) -> None:
    """Plain per-sequence, per-row loop with the same effect as :func:`commit_rows` (the test oracle): ``prefix``
    an int or a list of ints (one per sequence), ``path`` a list of ints or a list of lists."""
    prefixes = [prefix] if isinstance(prefix, int) else list(prefix)
    paths = [path] if path and isinstance(path[0], int) else list(path)
    for b, (start, nodes) in enumerate(zip(prefixes, paths, strict=True)):
        rows = [kv[:, :, b, :, start + p].clone() for p in nodes]
        for j, row in enumerate(rows):
            kv[:, :, b, :, start + j] = row


class StaticModel:
    """An HF causal LM over its own ``StaticKV`` (``capacity`` slots): fixed-shape forwards at explicit slots.

    Args:
        target (TargetModel): the wrapped model (attention layers of one shape).
        capacity (int): slots per sequence.
        batch (int): sequences held (rows of every forward). Default 1.
    """

    def __init__(self, target: TargetModel, capacity: int, batch: int = 1) -> None:
        self.target, self.capacity, self.batch = target, capacity, batch
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
            batch=batch,
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
            conv, rec = conv.new_zeros((batch, *conv.shape[1:])), rec.new_zeros((batch, *rec.shape[1:]))
            if i in attention:  # attention and a recurrent mixer in one layer
                self.recurrent[i] = _StaticHybridLayer(self.storage, attention.index(i), conv, rec)
            else:
                self.recurrent[i] = _StaticRecurrentLayer(conv, rec)
            layout.append(self.recurrent[i])
        self.attention_layers = attention
        self.cache = StaticKVCache(self.storage, layout)
        self.keys = torch.arange(capacity, device=target.device)
        # the rotary modules' (cos, sin) at every slot: one gather per forward instead of HF's ~9 ops
        self.rope = RopeTables(target.model, capacity, target.dtype)
        self.windows = window_layout(target.model)
        if self.windows.reason is not None:
            raise ValueError(f"{type(target.model).__name__}: {self.windows.reason}")
        self.position_cap = learned_position_cap(target)

    def load(self, cache, length: int, row: int = 0) -> None:
        """Copy an HF cache of one sequence that holds ``length`` prefilled tokens into sequence ``row`` of the static
        storage (slots ``0 .. length-1``)."""
        for slot, i in enumerate(self.attention_layers):
            layer = cache.layers[i]
            self.storage.kv[slot, 0, row, :, :length].copy_(layer.keys[0, :, :length])
            self.storage.kv[slot, 1, row, :, :length].copy_(layer.values[0, :, :length])
        for i, static in self.recurrent.items():
            static.conv_states[row].copy_(_state_tensor(cache.layers[i], "conv_states")[0])
            static.recurrent_states[row].copy_(_state_tensor(cache.layers[i], "recurrent_states")[0])

    def causal_mask(
        self, positions: torch.Tensor, visible: torch.Tensor | None = None, span: int | None = None
    ) -> torch.Tensor:
        """Additive mask ``[1, 1, Q, span]`` (``[B, 1, Q, span]`` for ``[B, Q]`` positions): query q sees the slots
        ``<= positions[q]`` (where ``visible``).

        Args:
            positions (torch.Tensor): ``[Q]`` or ``[B, Q]`` int64 slot (= position) of each query.
            visible (torch.Tensor | None): ``[Q, span]`` (or ``[B, Q, span]``) bool restricting it further (None: no
                restriction).
            span (int | None): slots attended over, ``[0, span)``; None = the whole capacity.
        """
        seen = self.keys[: span or self.capacity] <= positions[..., None]
        return self.additive_mask(seen if visible is None else seen & visible)

    def additive_mask(self, seen: torch.Tensor) -> torch.Tensor:
        """``[Q, K]`` (or ``[B, Q, K]``) bool (True = visible) -> the float mask ``[1, 1, Q, K]`` (``[B, 1, Q, K]``)
        HF attention adds."""
        mask = torch.where(seen, *mask_values(self.target.dtype, seen.device))  # one kernel
        return mask[None, None] if seen.dim() == 2 else mask[:, None]

    def forward(self, ids, positions, mask, write_index, taps=None, *, last_only=False, rows=None, span=None,
                flat=None, lengths=None):  # fmt: skip
        """Logits ``[B, N, V]`` (``[B, 1, V]`` for ``last_only``; for ``rows`` ``[B]``, one query per sequence:
        ``[B, 1, V]``) and taps ``[B, N, K*H]`` (or None) of one forward of ``ids [B, N]`` writing K/V at
        ``write_index`` (``[B, N]``, or ``[N]`` shared by every sequence) and attending over slots ``[0, span)`` (None:
        the whole capacity; ``mask`` is ``[B or 1, 1, N, span]``, the full-attention mask: sliding-window layers also
        lose the keys out of their window, the key of each slot being at the position last written there,
        ``positions`` for the slots of ``write_index``, the slot's own index elsewhere). ``flat`` (``[B]``, or None):
        the caller's guarantee that each row of ``mask`` is, in slots ``[0, flat[b])``, its value at slot 0 (the
        committed prefix, seen whole by a tree's nodes, unseen by its padding): the attention kernel then reads
        no mask there (dropped for models with sliding-window layers, whose masks differ per layer). ``lengths``
        (``[B]`` int32 or int64, or None: computed from ``write_index``): the caller's ``write_index.amax(1) + 1``."""
        batch = self.storage.batch
        write_index = write_index.reshape(-1, write_index.shape[-1]).expand(batch, -1)
        self.storage.write_index = write_index
        self.storage.span = span or self.capacity
        # the slots each sequence may read: every visible key is committed (below this forward's first slot) or
        # written now, so nothing past the last written slot is read (the attention kernel's lengths)
        if lengths is None:
            lengths = (write_index.amax(1) + 1).to(torch.int32)
        if self.position_cap is not None:
            # a learned position table ends at the target's last position: rows past it (tree nodes past the call's
            # last token, prompt padding) are never committed, and only they are moved onto it
            positions = positions.clamp(max=self.position_cap)
        if self.windows.slides:
            query = positions.reshape(batch, -1)
            key = self.keys[: self.storage.span].expand(batch, -1).scatter(1, write_index, query)
            mask = self.windows.masks(mask, query, key)
        logits, hidden = self.target.forward(
            ids,
            position_ids=positions,
            attention_mask=mask,
            taps=taps,
            last_only=last_only,
            cache=self.cache,
            rows=rows,
            batched=True,
            kv_lengths=lengths,
            kv_flat=None if flat is None or self.windows.slides else flat,
        )
        if rows is not None and batch > 1:  # each sequence's own row: the diagonal of [B, R = B, V]
            pick = torch.arange(batch, device=logits.device)
            logits = logits[pick, pick][:, None]
        return logits, hidden


_LEARNED_POSITIONS = ("wpe", "embed_positions", "position_embeddings")


def learned_position_cap(target: TargetModel) -> int | None:
    """The last position ``target`` can embed when it looks positions up in a learned table (GPT-2's ``wpe``,
    OPT's ``embed_positions``, ...): its ``max_length - 1``; None for rotary and other schemes that take any
    position. A call never commits a token past ``max_length`` (``generate`` refuses such a call), so a row
    positioned past the table is one whose output no committed token depends on."""
    limit = target.max_length
    if not limit:
        return None
    learned = any(name.rsplit(".", 1)[-1] in _LEARNED_POSITIONS for name, _ in target.model.named_modules())
    return limit - 1 if learned else None


def static_reason(target: TargetModel) -> str | None:
    """None when ``StaticModel`` runs the attention layers of ``target`` (a ``TargetModel``) exactly, else why not:
    masks it does not build (chunked attention, sliding layers of different windows, bidirectional sliding
    layers, sliding and full layers in a model that takes no per-type masks). Sliding-window layers and hybrid
    (attention + recurrent) layers are run; whether the recurrent layers have a device path is
    ``specdec.state.recurrent.hybrid_reason``'s to say."""
    return window_layout(target.model).reason
