"""The target's linear layers through the split-K kernel of ``specdec.kernels.skinny_linear`` (opt-in).

A fast-path round multiplies 1-64 rows (a decode step, a padded draft tree) by every weight of the target. At the
Qwen3-8B shape on an H200 the best products inductor's autotuning found for 16 and 32 rows ran at 0.5-2.7 TB/s, under
half the copy bandwidth (docs/performance.md): a grid over the output columns alone leaves most SMs idle. The
skinny kernel also splits the reduction axis across programs.

``SPECDEC_LINEAR_KERNEL`` says where it is used: ``torch`` (default: the layers' own ``F.linear``) or ``triton``
(every ``nn.Linear`` of the target, and of a small-LM drafter, while the fast path runs their forwards, for inputs of
at most ``MAX_ROWS`` rows in the weight's dtype; ``skinny_linear`` picks its torch reference off CUDA). The switch
is made by :class:`specdec.fast.attention.AttentionScope` (``linear=True``): it sets an instance ``forward`` on each
such module while the engine runs the forward (warm-up, capture, compilation, uncaptured calls) and removes it
afterwards, so the user's model is left as it was and graph replays pay nothing. Opt-in until it has been timed on
a GPU.
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["KERNEL", "linear_kernel_for", "linear_modules", "skinny_forward"]

# "torch" (default) or "triton"; read when a scope is built (rounds and prefills build theirs once).
KERNEL = os.environ.get("SPECDEC_LINEAR_KERNEL", "torch")
_KERNELS = ("torch", "triton")


def linear_kernel_for() -> bool:
    """Whether the fast path's forwards route their ``nn.Linear`` layers through :func:`skinny_forward`."""
    if KERNEL not in _KERNELS:
        raise ValueError(f"SPECDEC_LINEAR_KERNEL={KERNEL!r}: use 'torch' or 'triton'.")
    return KERNEL == "triton"


def skinny_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through ``skinny_linear`` when ``x`` has at most ``MAX_ROWS`` rows in the weight's dtype (and
    bias), through ``F.linear`` otherwise. Decided from shapes and dtypes only."""
    from specdec.kernels.skinny_linear import MAX_ROWS, skinny_linear

    weight, bias = module.weight, module.bias
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else MAX_ROWS + 1
    same_dtype = x.dtype == weight.dtype and (bias is None or bias.dtype == weight.dtype)
    if rows <= MAX_ROWS and same_dtype and weight.dim() == 2 and x.device == weight.device:
        return skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_modules(*models) -> list[nn.Linear]:
    """Every module of ``models`` (None skipped) whose type is exactly ``nn.Linear`` (subclasses such as quantized
    linears keep their own forward), each once."""
    seen: dict[int, nn.Linear] = {}
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if type(module) is nn.Linear:
                seen[id(module)] = module
    return list(seen.values())


def route(modules: list[nn.Linear]) -> list[nn.Linear]:
    """Give each module without an instance ``forward`` of its own one bound to :func:`skinny_forward`; returns
    the modules switched (for :func:`unroute`)."""
    switched = [m for m in modules if "forward" not in m.__dict__]
    for module in switched:
        module.forward = types.MethodType(skinny_forward, module)
    return switched


def unroute(switched: list[nn.Linear]) -> None:
    """Undo :func:`route`."""
    for module in switched:
        module.__dict__.pop("forward", None)
