"""A drafter's weights follow its target: a cast or move of the target between calls moves the drafter too.

``generate`` remembers each drafter's target (its dtype and device) from one call to the next (and from the
DFlash drafter's ``bind``). When the target changed, the drafter's own weights take the same change: to the new
device where they sat on the target's old device, to the new dtype where they had the target's old dtype (a
drafter kept at another dtype on purpose, e.g. fp32 under a bf16 target, stays there). A drafter with weights that
must follow but has no ``to(device=..., dtype=...)`` gets a ``ValueError`` naming the fix. See ``docs/api.md``.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

__all__ = ["drafter_modules", "follow_target", "note_target"]

logger = logging.getLogger(__name__)

# drafter -> (its target, (the target's dtype, device)) as last seen
_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hf_model(target) -> nn.Module:
    return getattr(target, "model", target) if not isinstance(target, nn.Module) else target


def _placement(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    weight = model.get_input_embeddings().weight
    return weight.dtype, weight.device


def drafter_modules(drafter) -> list[nn.Module]:
    """The ``nn.Module``\\ s a drafter holds: itself if it is one, else its attributes that are modules or wrap one in
    ``.model`` (``ModelDrafter.lm``). Modules it borrows from the target (DFlash's embedding and LM head) are
    among them."""
    if drafter is None:
        return []
    if isinstance(drafter, nn.Module):
        return [drafter]
    try:
        values = vars(drafter).values()
    except TypeError:  # no __dict__
        return []
    found = []
    for value in values:
        module = value if isinstance(value, nn.Module) else getattr(value, "model", None)
        if isinstance(module, nn.Module):
            found.append(module)
    return found


def _own_placement(drafter, model: nn.Module) -> tuple[torch.dtype, torch.device] | None:
    """dtype and device of the drafter's first floating-point weight that is not the target's; None if it has none."""
    borrowed = {id(p) for p in model.parameters()}
    for module in drafter_modules(drafter):
        for p in module.parameters():
            if id(p) not in borrowed and p.is_floating_point():
                return p.dtype, p.device
    return None


def note_target(drafter, target) -> None:
    """Remember ``target`` (an HF model or a ``TargetModel``) as ``drafter``'s, at its current dtype and device."""
    model = _hf_model(target)
    _seen[drafter] = (weakref.ref(model), _placement(model))


def follow_target(drafter, target) -> None:
    """Move ``drafter``'s own weights along with a change of ``target``'s dtype or device since it was last seen with
    this drafter (module docstring); then remember the target as it is now.

    Raises:
        ValueError: the drafter's weights must follow but it has no ``to`` method.
    """
    if drafter is None:
        return
    model = _hf_model(target)
    now = _placement(model)
    seen = _seen.get(drafter)
    if seen is not None and seen[0]() is model and seen[1] != now:
        own = _own_placement(drafter, model)
        if own is not None:
            (old_dtype, old_device), (new_dtype, new_device) = seen[1], now
            dtype = new_dtype if own[0] == old_dtype and new_dtype != old_dtype else None
            device = new_device if own[1] == old_device and new_device != old_device else None
            if dtype is not None or device is not None:
                move = getattr(drafter, "to", None)
                name = type(drafter).__name__
                if not callable(move):
                    raise ValueError(
                        f"The target moved from {old_dtype} on {old_device} to {new_dtype} on {new_device} and the "
                        f"{name} weights ({own[0]} on {own[1]}) must follow, but {name} has no to(): move its weights "
                        f"to {new_dtype} on {new_device} yourself, or give it a to(device=None, dtype=None) method."
                    )
                logger.info("specdec: %s follows the target to %s on %s", name, new_dtype, new_device)
                move(device=device, dtype=dtype)
    note_target(drafter, model)
