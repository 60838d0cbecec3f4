"""State managers: committing accepted tree paths into target caches.

``manager_for(model)`` picks one per target: ``KVState`` for attention-only models, ``HybridState`` (the recurrent
adapters the round runs) for supported hybrids, and a clear ``ValueError`` for any other recurrent layer.
``snapshot`` / ``restore`` copy a whole HF cache. See ``docs/hybrid.md``.
"""

from __future__ import annotations

import re

from torch import nn

from specdec.state.gdn import GDN_ADAPTERS
from specdec.state.hybrid import HybridState, RecurrentAdapter, cache_kwarg, check_hybrid_mode
from specdec.state.kv import KVState
from specdec.state.mamba2 import MAMBA2_ADAPTERS
from specdec.state.snapshot import Snapshot, restore, snapshot

__all__ = [
    "SUPPORTED_MIXERS",
    "HybridState",
    "KVState",
    "Snapshot",
    "cache_kwarg",
    "manager_for",
    "restore",
    "snapshot",
]

_ADAPTERS: dict[str, type[RecurrentAdapter]] = {**GDN_ADAPTERS, **MAMBA2_ADAPTERS}
SUPPORTED_MIXERS: tuple[str, ...] = tuple(sorted(_ADAPTERS))

# Class names of sequence mixers that keep state across tokens (Mamba1, short convs, RWKV, xLSTM, RG-LRU, ...).
_RECURRENT_NAME = re.compile(r"Mamba\w*Mixer|DeltaNet|ShortConv|Rwkv|RWKV|[Ll]stm|Rglru|RgLru|RecurrentBlock|Lightning")


def _adapter_class(module: nn.Module) -> type[RecurrentAdapter] | None:
    cls = type(module)
    if not cls.__module__.startswith("transformers.models."):
        return None  # a user subclass may change the maths: never adapt it silently
    return _ADAPTERS.get(cls.__name__)


def _looks_recurrent(module: nn.Module) -> bool:
    if _RECURRENT_NAME.search(type(module).__name__):
        return True
    if isinstance(getattr(module, "A_log", None), nn.Parameter):
        return True
    conv = getattr(module, "conv1d", None)  # the causal depthwise short conv of SSM / linear-attention mixers
    return (
        isinstance(conv, nn.Conv1d)
        and conv.groups == conv.in_channels > 1
        and conv.padding[0] == conv.kernel_size[0] - 1
    )


def manager_for(model: nn.Module, *, hybrid_mode: str = "exact"):
    """The state manager for ``model``.

    Args:
        model (nn.Module): an HF causal LM.
        hybrid_mode (str): for hybrid targets, ``"exact"`` (default; the adapters verify any tree, the commit
            replays the accepted path) or ``"snapshot"`` (a name the round refuses with a reason). Ignored for
            attention-only models.

    Returns:
        ``KVState`` or ``HybridState``.

    Raises:
        ValueError: the model has a recurrent / stateful layer specdec has no exact adapter for.

    Examples:
        >>> manager = manager_for(model)
        >>> [type(a).__name__ for a in manager.adapters]  # a hybrid target: one adapter per recurrent mixer
        ['GatedDeltaNetAdapter', 'GatedDeltaNetAdapter', 'GatedDeltaNetAdapter']
    """
    check_hybrid_mode(hybrid_mode)
    adapters, unsupported, inside = [], {}, set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        factory = _adapter_class(module)
        if factory is not None:
            adapters.append(factory(module))
            inside.add(name)
        elif _looks_recurrent(module):
            unsupported.setdefault(type(module).__name__, name)
    if unsupported:
        found = ", ".join(f"{cls} (at {where})" for cls, where in sorted(unsupported.items()))
        raise ValueError(
            f"{type(model).__name__} has recurrent layers specdec cannot verify exactly: {found}. Supported "
            f"recurrent mixers: {', '.join(SUPPORTED_MIXERS)} (plus any attention layer). Mamba1 mixers (Jamba, "
            "Mamba, FalconMamba, Zamba), short-conv (Lfm2), RWKV, xLSTM and other stateful layers are not supported."
        )
    if adapters:
        return HybridState(adapters, mode=hybrid_mode)
    if getattr(model, "_is_stateful", False):
        raise ValueError(
            f"{type(model).__name__} keeps state across tokens (_is_stateful) but none of its layers is a supported "
            f"recurrent mixer ({', '.join(SUPPORTED_MIXERS)}); specdec cannot verify it exactly."
        )
    return KVState()
