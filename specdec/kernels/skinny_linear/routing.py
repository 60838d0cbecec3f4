"""The target's linear layers through the split-K kernel of ``specdec.kernels.skinny_linear`` (opt-in).

A round multiplies 1-64 rows (a decode step, a padded draft tree) by every weight of the target; the
skinny kernel splits the reduction axis across programs as well as the output columns. On an H200 at the Qwen3-8B
shapes cuBLAS was faster at 16-64 rows (graph-replayed, 3.2-4.1 TB/s against the kernel's 0.38-0.93 x its speed;
docs/kernels.md), so the routing is opt-in.

``SPECDEC_LINEAR_KERNEL`` says where it is used: ``torch`` (default: the layers' own ``F.linear``) or ``triton``
(every ``nn.Linear`` of the target, and of a small-LM drafter, while the round runs their forwards;
``skinny_linear`` takes its kernel on CUDA for at most ``MAX_ROWS`` rows and ``F.linear`` otherwise). The switch is
made by :class:`specdec.attention.AttentionScope` (``linear=True``) through the hook-safe forward swap the
recurrent adapters use (``specdec.state.forwards``), while the engine runs the forward (warm-up, capture,
compilation, uncaptured calls); the user's model is left as it was and graph replays pay nothing.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from specdec.backends import env_default
from specdec.state.forwards import swappable, swapped_forwards

__all__ = ["KERNEL", "linear_kernel_for", "linear_modules", "routed", "skinny_forward"]

# "torch" (default) or "triton"; read when a scope is built (rounds and prefills build theirs once).
KERNEL = env_default("linear_kernel")
_KERNELS = ("torch", "triton")


def linear_kernel_for() -> bool:
    """Whether the round's forwards route their ``nn.Linear`` layers through :func:`skinny_forward`."""
    if KERNEL not in _KERNELS:
        raise ValueError(f"SPECDEC_LINEAR_KERNEL={KERNEL!r}: use 'torch' or 'triton'.")
    return KERNEL == "triton"


def skinny_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through ``skinny_linear``, whose ``impl="auto"`` takes its Triton kernel on CUDA for at most
    ``MAX_ROWS`` rows and ``F.linear`` (its reference) otherwise."""
    from specdec.kernels.skinny_linear import skinny_linear

    return skinny_linear(x, module.weight, module.bias)


def linear_modules(*models) -> list[nn.Linear]:
    """Every module of ``models`` (None skipped) whose type is exactly ``nn.Linear`` (subclasses such as quantized
    linears keep their own forward) and whose forward can be swapped without dropping one the user set
    (``specdec.state.forwards.swappable``: accelerate's hooks are kept), each once."""
    seen: dict[int, nn.Linear] = {}
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if type(module) is nn.Linear and swappable(module):
                seen[id(module)] = module
    return list(seen.values())


def routed(modules: list[nn.Linear]):
    """A context manager that routes ``modules`` through :func:`skinny_forward` while active."""
    return swapped_forwards((m, types.MethodType(skinny_forward, m)) for m in modules)
