"""Swapping module forwards for the duration of a block (the recurrent adapters' tree forwards, the round's
linear-layer routing), hook-safe and always restored."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["hook_free_copy", "swappable", "swapped_forwards"]


def swappable(module: nn.Module) -> bool:
    """Whether :func:`swapped_forwards` can route ``module`` without dropping a forward set on the instance: it has
    none, or an accelerate hook's (which keeps the class forward in ``_old_forward`` and calls it)."""
    return "forward" not in module.__dict__ or "_old_forward" in module.__dict__


def hook_free_copy(module: nn.Module, **replace) -> nn.Module:
    """A shallow copy of ``module`` for probing its forward without side effects: no hooks, no instance forward, its
    own parameter and submodule dicts, with ``replace``'s entries (a parameter or a submodule by name) swapped in.
    The user's module is never touched."""
    clone = copy.copy(module)
    clone._parameters, clone._modules = dict(module._parameters), dict(module._modules)
    clone._forward_hooks, clone._forward_pre_hooks = {}, {}
    clone.__dict__.pop("forward", None)
    clone.__dict__.pop("_old_forward", None)
    for name, value in replace.items():
        if isinstance(value, nn.Module):
            clone._modules[name] = value
        else:
            clone._parameters[name] = nn.Parameter(value, requires_grad=False)
    return clone


@contextmanager
def swapped_forwards(pairs: Iterable[tuple[nn.Module, Callable]]) -> Iterator[None]:
    """Route each ``module``'s forward to its ``forward`` while the block runs; always restored on exit.

    An accelerate hook keeps the original forward in ``_old_forward`` and calls it from an instance ``forward``;
    swapping ``_old_forward`` keeps such hooks (device placement) in the call chain.
    """
    saved = []
    try:
        for module, forward in pairs:
            attr = "_old_forward" if "_old_forward" in module.__dict__ else "forward"
            saved.append((module, attr, module.__dict__.get(attr)))
            setattr(module, attr, forward)
        yield
    finally:
        for module, attr, old in reversed(saved):
            if old is None:
                delattr(module, attr)
            else:
                setattr(module, attr, old)
