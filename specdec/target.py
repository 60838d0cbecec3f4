"""Adapter over an HF causal LM: model facts, one forward with explicit positions, mask and cache, hidden-state taps.

Works with any HF causal LM whose layers are attention (``sdpa`` or ``eager``) through an additive float 4D
mask and explicit position ids; recurrent layers go through the adapters of ``specdec.state``. The round runs it
over specdec's static storage (``specdec.state.storage``).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Iterable, Sequence

import torch

from specdec.attention import KV_FLAT, KV_LENGTHS
from specdec.runtime import OnModel
from specdec.state import cache_kwarg, manager_for
from specdec.state.storage import StaticKVCache
from specdec.state.windows import WindowLayout, keep_every_key, window_layout

__all__ = ["TargetModel", "check_causal_lm", "weights_signature", "weights_state"]

logger = logging.getLogger(__name__)

_TREE_ATTN = ("sdpa", "eager")


def check_causal_lm(model, name: str = "target") -> None:
    """Refuse what is not an HF causal LM with an LM head (a path, None, a base model such as ``LlamaModel``),
    naming ``name``, what was given and the fix, before anything reads its weights."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        raise TypeError(
            f"{name}={str(model)!r} is a path, not a model: load it first, e.g. "
            f"AutoModelForCausalLM.from_pretrained({str(model)!r})."
        )
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(
            f"{name} must be an HF causal LM (a *ForCausalLM, e.g. AutoModelForCausalLM.from_pretrained(path)); "
            f"got {type(model).__name__}."
        )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if getattr(head, "weight", None) is None:
        raise TypeError(
            f"{name} is a {type(model).__name__}, which has no LM head (no output embeddings): pass the causal LM "
            "that holds it (a *ForCausalLM, e.g. AutoModelForCausalLM.from_pretrained(path)), not its base model."
        )


# model -> (what its wrapper was made from, the wrapper): ``TargetModel.wrap`` makes a model's wrapper once; kept on
# the model, so that the wrapper (which holds the model) is freed with it
_WRAPPED = OnModel("_specdec_wrapper")


def weights_state(modules: Iterable[torch.nn.Module]) -> tuple[tuple, int]:
    """``(weights_signature(modules), the sum of their in-place update counters)`` in one pass over the tensors.

    Every call reads it (a cast or an update between calls makes the kept state stale), so it walks the modules'
    own parameter and buffer dicts rather than through ``Module.parameters()``, which builds every name: the same
    tensors (each once; each module's parameters, then its buffers, depth first) in about a third of the time."""
    signature, versions = [], 0
    seen_modules: set[int] = set()
    seen: set[int] = set()
    stack = list(reversed(list(modules)))
    while stack:
        module = stack.pop()
        if id(module) in seen_modules:
            continue
        seen_modules.add(id(module))
        for tensors in (module._parameters, module._buffers):
            for t in tensors.values():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                signature.append((_address(t), t.dtype, t.device))
                versions += t._version
        stack.extend(reversed([child for child in module._modules.values() if child is not None]))
    return tuple(signature), versions


def weights_signature(modules: Iterable[torch.nn.Module]) -> tuple:
    """(address, dtype, device) of every parameter and buffer of ``modules``, in order.

    The static storage takes the weights' dtype and device; captured graphs and compiled rounds read their addresses.
    A cast or move (``model.to(torch.bfloat16)``, ``.double()``, ``.to("cuda")``, and back) changes the signature,
    which makes the state built for the old one stale; in-place updates of the values (``copy_``) do not.
    """
    return weights_state(modules)[0]


def _address(t: torch.Tensor) -> int:
    try:
        return t.data_ptr()
    except RuntimeError:  # a tensor subclass without storage of its own: its identity
        return id(t)


class TargetModel:
    """Wraps an HF ``*ForCausalLM`` for speculative verification (batch of one sequence).

    Args:
        model: the HF causal LM (eval mode is set by the caller; weights are never modified).
        hybrid_mode (str): ``"exact"`` (default) or ``"snapshot"`` (a name the round refuses), passed to
            ``specdec.state.manager_for``.
    """

    def __init__(self, model, *, hybrid_mode: str = "exact") -> None:
        self.model = model
        self.config = model.config
        text_cfg = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        self.text_config = text_cfg
        impl = getattr(self.config, "_attn_implementation", None) or "eager"
        if impl not in _TREE_ATTN:
            raise ValueError(
                f"Target attention implementation {impl!r} cannot take a tree mask; load the target with "
                'attn_implementation="sdpa" (or "eager").'
            )
        self.state = manager_for(model, hybrid_mode=hybrid_mode)
        self.hybrid_mode = hybrid_mode
        params = inspect.signature(type(model).forward).parameters
        self.cache_kw = cache_kwarg(model)
        self._has_logits_to_keep = "logits_to_keep" in params
        self._passes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.cache = None
        self.length = 0  # tokens held in the cache
        # the weights' state when last wrapped (``wrap``; None: read it when needed)
        self.signature: tuple | None = None
        self.versions: int | None = None

    @classmethod
    def wrap(cls, target, **kwargs) -> TargetModel:
        """``target`` itself if it is a ``TargetModel``, else the wrapper of the HF model ``target``: made once per
        model and reused while what it was made from holds (the weights' addresses, dtypes and devices, the config
        object and its attention implementation, ``kwargs``), since making one walks every module. Each call
        refreshes ``signature`` and ``versions`` (the weights' state at this call, read once for the engine)."""
        if isinstance(target, TargetModel):
            target.signature, target.versions = weights_state([target.model])
            return target
        check_causal_lm(target)
        signature, versions = weights_state([target])
        key = (signature, id(target.config), getattr(target.config, "_attn_implementation", None),
               tuple(sorted(kwargs.items())))  # fmt: skip
        hit = _WRAPPED.get(target)
        if hit is not None and hit[0] == key:
            wrapped = hit[1]
        else:
            wrapped = cls(target, **kwargs)
            _WRAPPED[target] = (key, wrapped)
        wrapped.signature, wrapped.versions = signature, versions
        return wrapped

    # -- model facts -------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size

    @property
    def max_length(self) -> int | None:
        """Longest sequence the target can position (``max_position_embeddings``). Sliding-window layers keep every
        key and mask the ones out of their window (``specdec.state.windows``); only a model whose masks specdec
        cannot build that way is also capped by its sliding window."""
        limits = [getattr(self.text_config, "max_position_embeddings", None)]
        if self._sliding_window_layers() and self._window_layout.reason is not None:
            limits.append(self.text_config.sliding_window)
        limits = [x for x in limits if x]
        return min(limits) if limits else None

    def _sliding_window_layers(self) -> bool:
        window = getattr(self.text_config, "sliding_window", None)
        if not window:
            return False
        types = getattr(self.text_config, "layer_types", None)
        return types is None or any("sliding" in t for t in types)

    @functools.cached_property
    def _window_layout(self) -> WindowLayout:
        """How the attention layers see their keys (``specdec.state.windows.window_layout``)."""
        return window_layout(self.model)

    # -- forwards ----------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids,
        *,
        position_ids=None,
        attention_mask=None,
        taps=None,
        last_only=False,
        cache=None,
        rows=None,
        batched=False,
        kv_lengths=None,
        kv_flat=None,
    ):
        """One forward on ``cache`` (default this wrapper's); returns (logits ``[N, V]``, taps or None).

        ``kv_lengths`` (``[B]`` int32 or int64, the slots each sequence may read) reaches the attention layers as the
        keyword argument ``specdec.attention.KV_LENGTHS`` where the model's forward passes keyword arguments down;
        ``kv_flat`` (``[B]`` int32 or int64, each sequence's flat prefix) as ``KV_FLAT``, the caller's guarantee that
        every query row's mask is, in slots ``[0, kv_flat[b])``, its value at slot 0 in every attention layer.
        ``last_only`` keeps the last row's logits, ``rows`` (a ``[R]`` int64 device tensor) the logits of those
        rows (``[R, V]``; graph-safe: no host read). ``batched``: logits of every sequence, ``[B, N, V]``.
        """
        cache = self.cache if cache is None else cache
        windows = self._window_layout
        if windows.slides and not isinstance(cache, StaticKVCache):  # StaticModel passes its masks ready
            # an HF cache: its sliding layers keep every key; past keys sit at positions 0 .. K - N - 1, in order,
            # followed by this forward's N keys at their position ids
            keep_every_key(cache)
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4 and position_ids is not None:
                query = position_ids.reshape(-1)
                past = torch.arange(attention_mask.shape[-1] - query.numel(), device=query.device)
                attention_mask = windows.masks(attention_mask, query, torch.cat([past, query]))
        kwargs = {self.cache_kw: cache, "use_cache": True}
        if taps:
            kwargs["output_hidden_states"] = True
        if kv_lengths is not None and self._passes_kwargs:
            kwargs[KV_LENGTHS] = kv_lengths
        if kv_flat is not None and self._passes_kwargs:
            kwargs[KV_FLAT] = kv_flat
        if rows is not None and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = rows
        elif last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, **kwargs)
        hidden = None
        if taps:
            hidden = torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1)  # [1, N, L*H]
        logits = out.logits
        if rows is not None and not self._has_logits_to_keep:
            logits = logits.index_select(1, rows)
        return (logits if batched else logits[0]), hidden

    @torch.no_grad()
    def prefill_into(self, cache, input_ids: torch.Tensor, taps: Sequence[int] | None = None):
        """Run the prompt into ``cache`` (an empty HF cache) with the model's own forward; this wrapper's cache is
        left alone. Returns (logits ``[V]`` at the last position, taps ``[1, T, L*H]`` or None)."""
        logits, hidden = self.forward(input_ids, taps=taps, last_only=True, cache=cache)
        return logits[-1], hidden
