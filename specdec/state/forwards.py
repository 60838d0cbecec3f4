"""Swapping module forwards for the duration of a block (the recurrent adapters' tree forwards, the round's
linear-layer routing), hook-safe and always restored."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["swappable", "swapped_forwards"]


def swappable(module: nn.Module) -> bool:
    """Whether :func:`swapped_forwards` can route ``module`` without dropping a forward set on the instance: it has
    none, or an accelerate hook's (which keeps the class forward in ``_old_forward`` and calls it)."""
    return "forward" not in module.__dict__ or "_old_forward" in module.__dict__


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
