"""Sliding-window attention over caches that keep every key.

specdec's caches (the static storage of ``storage.py``, and the HF ``DynamicCache`` of the eager path once
``keep_every_key`` has run on it) hold the whole sequence, so a sliding-window layer differs from a full-attention
layer only by its mask: a query at position ``q`` also loses the keys at positions ``k <= q - window`` (HF's
``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``). ``WindowLayout`` turns the one
explicit additive mask specdec builds (causal + tree) into what the model takes: the sliding mask itself when every
attention layer slides, else the ``{layer_type: mask}`` mapping that recent HF models accept in place of their own
``causal_mask_mapping``. Key positions come from the caller: a static slot holds the key of the position written
there (``StaticModel``), an HF cache holds its past keys in order followed by the forward's own keys.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

__all__ = ["WindowLayout", "keep_every_key", "sliding_visible", "window_layout"]

_FULL = "full_attention"
_SLIDING = "sliding_attention"
_FULL_TYPES = (_FULL, "hybrid")  # layer types with full attention (and recurrent state for "hybrid")
# A base model that takes a prepared ``{layer_type: mask}`` mapping (HF's idiom: ``if not isinstance(causal_mask_mapping
# := attention_mask, dict): ...build it...``).
_TAKES_MAPPING = re.compile(r"isinstance\(\s*(?:\w+\s*:=\s*)?attention_mask\s*,\s*dict\s*\)")


@dataclass(frozen=True)
class WindowLayout:
    """How one model's attention layers see their keys.

    Args:
        window (int | None): the sliding window of the sliding layers (None: no layer slides).
        mapping (bool): some attention layers slide and some do not: the model gets ``{layer_type: mask}``.
        full_types (tuple[str, ...]), sliding_types (tuple[str, ...]): the layer types of the mapping.
        reason (str | None): why explicit masks over a cache that keeps every key cannot run this model (then
            ``masks`` must not be used); None when they can.
    """

    window: int | None = None
    mapping: bool = False
    full_types: tuple[str, ...] = ()
    sliding_types: tuple[str, ...] = ()
    reason: str | None = None

    @property
    def slides(self) -> bool:
        """Some attention layer slides and ``masks`` handles it."""
        return self.window is not None and self.reason is None

    def masks(self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
        """The attention mask(s) to pass to the model for a full-attention additive mask.

        Args:
            mask (torch.Tensor): ``[B or 1, 1, Q, K]`` mask of the full-attention layers: additive float
                (0 = visible) or bool (True = visible).
            query_positions (torch.Tensor): ``[Q]`` (or ``[B, Q]``, one row per sequence) int64 position of each
                query.
            key_positions (torch.Tensor): ``[K]`` (or ``[B, K]``) int64 position of the key each column holds
                (columns the mask hides may hold anything).

        Returns:
            ``mask`` itself (no sliding layer), the sliding mask ``[1, 1, Q, K]`` (every attention layer slides), or
            ``{layer_type: mask}``.
        """
        if not self.slides:
            return mask
        near = sliding_visible(query_positions, key_positions, self.window)
        hidden = torch.finfo(mask.dtype).min if mask.is_floating_point() else False  # bool masks: True = visible
        sliding = mask.masked_fill(~near, hidden)
        if not self.mapping:
            return sliding
        return {**dict.fromkeys(self.full_types, mask), **dict.fromkeys(self.sliding_types, sliding)}


def sliding_visible(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """``[Q, K]`` bool (``[B, 1, Q, K]`` for ``[B, Q]`` / ``[B, K]`` positions): the key is inside the query's window
    (``k > q - window``, as HF's sliding overlay); causality is the full mask's business."""
    if query_positions.dim() == 2:
        return (key_positions[:, None, :] > query_positions[:, :, None] - window)[:, None]
    return key_positions[None, :] > query_positions[:, None] - window


def _text_config(model):
    config = model.config
    if hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except TypeError:  # an older signature
            return config.get_text_config()
    return config


def _layer_types(config) -> list[tuple[str, int | None]]:
    """``(layer type, sliding window or None)`` per layer, as HF's ``DynamicCache(config=...)`` lays them out."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:
        get_layer_types_and_kwargs = None
    if get_layer_types_and_kwargs is not None:
        types, kwargs = get_layer_types_and_kwargs(config)
        # one dict per layer (5.24), or one for all layers (5.17)
        windows = (
            [k.get("sliding_window") for k in kwargs]
            if isinstance(kwargs, list)
            else [kwargs.get("sliding_window")] * len(types)
        )
        return [(t, w if "sliding" in t else None) for t, w in zip(types, windows, strict=True)]
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types is None:
        if window is not None:
            types = [_SLIDING] * config.num_hidden_layers
        elif getattr(config, "attention_chunk_size", None) is not None:
            types = ["chunked_attention"] * config.num_hidden_layers
        else:
            types = [_FULL] * config.num_hidden_layers
    return [(t, window if "sliding" in t else None) for t in types]


@functools.cache
def _class_takes_mapping(cls: type) -> bool:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return bool(_TAKES_MAPPING.search(source))


def _takes_mapping(model) -> bool:
    """Whether a module of ``model`` builds its per-layer-type masks only when not handed a mapping."""
    return any(_class_takes_mapping(type(module)) for module in model.modules())


def window_layout(model) -> WindowLayout:
    """The ``WindowLayout`` of an HF causal LM (read from its config; the forward's source says whether it takes a
    mask mapping)."""
    config = _text_config(model)
    layers = _layer_types(config)
    types = {t for t, _ in layers}
    if "chunked_attention" in types or getattr(config, "attention_chunk_size", None):
        return WindowLayout(reason="chunked attention layers (a mask specdec does not build)")
    windows = {w for t, w in layers if "sliding" in t}
    if not windows:
        return WindowLayout()
    if None in windows or len(windows) > 1:
        return WindowLayout(reason=f"sliding layers of different windows {sorted(map(str, windows))}")
    (window,) = windows
    if getattr(config, "use_bidirectional_attention", False):
        return WindowLayout(window=window, reason="bidirectional attention")
    sliding = tuple(sorted(t for t in types if "sliding" in t))
    full = tuple(sorted(t for t in types if t in _FULL_TYPES))
    if not full:  # every attention layer slides: one mask, whatever else the model builds from it
        return WindowLayout(window=window, sliding_types=sliding)
    unknown = sorted(types - set(sliding) - set(full) - {"dummy"})
    if sliding != (_SLIDING,) or full != (_FULL,) or unknown:
        named = sorted(set(sliding) | set(full) | set(unknown))
        return WindowLayout(window=window, reason=f"sliding and full attention layers among layer types {named}")
    if not _takes_mapping(model):
        reason = "sliding and full attention layers but the model takes no per-type masks"
        return WindowLayout(window=window, reason=reason)
    return WindowLayout(window=window, mapping=True, full_types=full, sliding_types=sliding)


def keep_every_key(cache) -> None:
    """Turn the sliding layers of an HF ``DynamicCache`` into full ``DynamicLayer``s (in place) before they drop a
    key: the sliding masks of ``WindowLayout`` then hide the keys out of the window, and specdec's commit and
    rollback see every layer as a plain list of keys.

    Raises:
        ValueError: a sliding layer already dropped keys (it was run past its window before).
    """
    layers = getattr(cache, "layers", None)
    if not layers:
        return
    for i, layer in enumerate(layers):
        if type(layer) is not DynamicSlidingWindowLayer:
            continue
        full = DynamicLayer()
        if layer.is_initialized:
            held = layer.keys.shape[-2]
            if held != layer.cumulative_length:
                raise ValueError(
                    f"cache layer {i} slid past its window ({layer.cumulative_length} tokens, {held} kept): "
                    "specdec needs every key of a sliding layer (run the prompt into a fresh cache)."
                )
            full.lazy_initialization(layer.keys, layer.values)
            full.keys, full.values = layer.keys, layer.values
        layers[i] = full
