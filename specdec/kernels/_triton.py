"""Whether a kernel's Triton module imports (Triton installed and the module compiles its definitions)."""

from __future__ import annotations

import functools
import importlib
import os

import torch

__all__ = ["importable", "pick_impl"]


@functools.cache
def importable(module: str) -> bool:
    """True when ``module`` (e.g. ``"specdec.kernels.tree_gdn.triton"``) imports."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def pick_impl(impl: str, device: torch.device, module: str, *, fits: bool = True) -> str:
    """``"torch"`` or ``"triton"`` for a kernel's ``impl`` argument on ``device``.

    ``"auto"`` is Triton on CUDA (or under ``TRITON_INTERPRET=1``) when ``module`` imports and the call ``fits``
    the kernel, else the PyTorch reference; ``"triton"`` off a GPU (without the interpreter) is an error.
    """
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"impl={impl!r}: choose 'auto', 'torch' or 'triton'.")
    on_device = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if impl == "triton" and not on_device:
        raise ValueError("impl='triton' needs tensors on a GPU (or Triton's interpreter); use impl='torch'.")
    if impl == "auto":
        return "triton" if on_device and fits and importable(module) else "torch"
    return impl
