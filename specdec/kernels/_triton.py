"""Whether a kernel's Triton module imports (Triton installed and the module compiles its definitions)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import torch

from specdec.backends import env_default

__all__ = [
    "KERNEL_MODULES",
    "check_draft_q",
    "check_uniforms",
    "describe",
    "device_property",
    "importable",
    "pick_impl",
    "power_of_two_block",
    "prime_imports",
]

# The Triton modules the library's kernels dispatch to: every ``specdec/kernels/<name>/triton.py``.
KERNEL_MODULES = tuple(
    f"specdec.kernels.{path.parent.name}.triton" for path in sorted(Path(__file__).parent.glob("*/triton.py"))
)

# module -> whether it imports. A plain dict, not ``functools.cache``: torch.compile traces through a cache wrapper
# into ``importlib.import_module``, but reads a filled dict as a constant.
_IMPORTABLE: dict[str, bool] = {}

# Under torch.compile, each kernel dispatch ends the compiled region and the kernel launches outside it ("split",
# the default), or the whole round is one graph with the Triton kernels inside ("whole"). On an H200 the split
# rounds measured faster (docs/kernels.md).
COMPILE_GRAPH = env_default("compile_graph")


# (device index, property name) -> value, read once; a plain dict, which a compiled caller reads as a constant.
_DEVICE_PROPERTIES: dict[tuple[int, str], int] = {}


def device_property(device: torch.device, name: str, default: int) -> int:
    """``torch.cuda.get_device_properties(device).<name>`` of a CUDA ``device`` (read once per device), for launch
    plans (e.g. ``multi_processor_count``, ``shared_memory_per_block_optin``); ``default`` elsewhere."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return default
    index = device.index if device.index is not None else torch.cuda.current_device()
    value = _DEVICE_PROPERTIES.get((index, name))
    if value is None:
        value = _DEVICE_PROPERTIES[(index, name)] = getattr(torch.cuda.get_device_properties(index), name)
    return value


def importable(module: str) -> bool:
    """True when ``module`` (e.g. ``"specdec.kernels.tree_gdn.triton"``) imports; tried once per process."""
    if COMPILE_GRAPH == "split" and torch.compiler.is_compiling():
        torch._dynamo.graph_break()
    known = _IMPORTABLE.get(module)
    if known is None:
        try:
            importlib.import_module(module)
            known = True
        except ImportError:
            known = False
        _IMPORTABLE[module] = known
    return known


def prime_imports() -> None:
    """Try every kernel module now, so that code compiled later reads ``importable`` without importing."""
    for module in KERNEL_MODULES:
        importable(module)


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


def power_of_two_block(name: str, given: int | None, extent: int, most: int) -> int:
    """A launch's block size: ``given`` if a power of two (else refused, naming the argument ``name``); when None,
    ``min(most, next power of two >= extent)``."""
    if given is None:
        return min(1 << max(extent - 1, 0).bit_length(), most)
    if given < 1 or given & (given - 1):
        raise ValueError(f"{name}={given!r}: pass a power of two.")
    return given


def describe(tensor) -> str:
    """A tensor's dtype and shape (or a non-tensor's type name), for argument errors."""
    return f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__


def check_draft_q(q, p: torch.Tensor, q_by_depth: bool) -> None:
    """A rule kernel's draft distribution ``q`` beside ``p [B, S, V]``: ``[B, S, V]`` as ``p``, or with ``q_by_depth``
    one row per depth, ``[B, D >= 1, V]``; ``p``'s dtype.

    Raises:
        ValueError: naming the shape or dtype expected.
    """
    if not isinstance(q_by_depth, bool):
        raise ValueError(f"q_by_depth={q_by_depth!r}: pass a Python bool.")
    if q_by_depth:
        batch, _, vocab = p.shape
        if (not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[0] != batch or q.shape[1] < 1
                or q.shape[2] != vocab or q.dtype != p.dtype):  # fmt: skip
            raise ValueError(f"q_by_depth=True: q must be [B, D, V] = [{batch}, D >= 1, {vocab}] {p.dtype} (one row "
                             f"per depth); got {describe(q)}.")  # fmt: skip
    elif not isinstance(q, torch.Tensor) or q.shape != p.shape or q.dtype != p.dtype:
        raise ValueError(f"q must be [B, S, V] = {list(p.shape)} {p.dtype}, as p (or pass q_by_depth=True with one "
                         f"row per depth); got {describe(q)}.")  # fmt: skip


def check_uniforms(name: str, u, batch: int, slots: int, pair: bool | None = None) -> None:
    """A rule kernel's uniforms ``u``: ``[B, S]`` float64 or their ``[B, S, 2]`` float32 halves (``pair`` None:
    either; True / False: that form only, as another argument's).

    Raises:
        ValueError: naming both forms.
    """
    if pair is None:
        pair = isinstance(u, torch.Tensor) and u.dim() == 3
    want = (batch, slots, 2) if pair else (batch, slots)
    if not isinstance(u, torch.Tensor) or u.shape != want or u.dtype != (torch.float32 if pair else torch.float64):
        raise ValueError(f"{name} must be [{batch}, {slots}] float64 uniforms or their [{batch}, {slots}, 2] float32 "
                         f"halves{', in the same form as test' if name == 'final' else ''}; got {describe(u)}.")
