"""HF's ``apply_rotary_pos_emb`` through ``rotary`` while the round runs its uncompiled forwards.

HF's attention layers call their modeling module's ``apply_rotary_pos_emb(q, k, cos, sin)``, looked up in that
module when called; while a scope built here is active that name is bound to :func:`fused`, which runs ``rotary``
(one launch on CUDA) where the call fits it (bf16, the full head dim rotated, the default ``unsqueeze_dim``)
and the module's own function otherwise, and the original is put back on exit. A module is routed only if a probe
finds its function equal, bit for bit, to ``rotary_reference`` on random half-precision inputs, so a variant
(interleaved pairs, another formula) keeps its own. Compiled forwards are left to the compiler.

``Backends.target_rotary`` (``SPECDEC_TARGET_ROTARY``): ``auto`` (default: routed where the Triton kernel runs,
i.e. CUDA), ``torch`` (never) or ``triton`` (routed everywhere: ``rotary`` takes its reference off CUDA).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator

import torch

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.rotary.reference import rotary_reference

__all__ = ["KERNEL", "NAME", "fused", "rotary_kernel_for", "rotary_modules", "routed"]

# "torch" (default), "auto" or "triton"; read when a scope is built.
KERNEL = env_default("target_rotary")
_KERNELS = ("torch", "auto", "triton")
NAME = "apply_rotary_pos_emb"

# modeling module name -> whether its function is the reference's (probed once)
_PROBED: dict[str, bool] = {}


def rotary_kernel_for(device: torch.device | str) -> bool:
    """Whether uncompiled forwards on ``device`` route their modules' ``apply_rotary_pos_emb`` to :func:`fused`."""
    if KERNEL not in _KERNELS:
        raise ValueError(f"SPECDEC_TARGET_ROTARY={KERNEL!r}: use 'torch', 'auto' or 'triton'.")
    if KERNEL != "auto":
        return KERNEL == "triton"
    return pick_impl("auto", torch.device(device), "specdec.kernels.rotary.triton") == "triton"


def _probe(function: Callable, rotated: int = 16) -> bool:
    """Whether ``function(q, k, cos, sin)`` equals ``rotary_reference`` bit for bit on random half-precision inputs
    of head dim 16 whose ``cos`` / ``sin`` cover ``rotated`` dims (16: the whole head; fewer: partial rotary)."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        # [B, H, N, D] views of [B, N, H, D] buffers, as the attention layers pass them
        q = (torch.randn(2, 3, 4, 16, generator=gen) * 3).to(dtype).transpose(1, 2)
        k = (torch.randn(2, 3, 1, 16, generator=gen) * 3).to(dtype).transpose(1, 2)
        angle = torch.rand(2, 3, rotated // 2, generator=gen) * 50
        angle = torch.cat([angle, angle], dim=-1)
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        try:
            got = function(q, k, cos, sin)
        except Exception:  # noqa: BLE001 - a function the probe cannot call keeps its place
            return False
        want = rotary_reference(q, k, cos, sin)
        if not (isinstance(got, tuple) and len(got) == 2):
            return False
        if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
            return False
    return True


def rotary_modules(*models) -> list[types.ModuleType]:
    """The modeling modules of ``models``' layers (None skipped) whose ``apply_rotary_pos_emb`` is the reference's."""
    found: dict[str, types.ModuleType] = {}
    for model in models:
        if model is None:
            continue
        for name in {type(m).__module__ for m in model.modules()}:
            module = sys.modules.get(name)
            function = getattr(module, NAME, None)
            if module is None or not callable(function) or name in found:
                continue
            known = _PROBED.get(name)
            if known is None:
                known = _PROBED[name] = _probe(function)
            if known:
                found[name] = module
    return list(found.values())


# function -> whether it rotates a partial ``cos`` / ``sin`` as the reference does (probed on first such call)
_PARTIAL: dict[Callable, bool] = {}


def _partial(function: Callable) -> bool:
    known = _PARTIAL.get(function)
    if known is None:
        known = _PARTIAL[function] = _probe(function, rotated=8)
    return known


def fused(original: Callable) -> Callable:
    """``apply_rotary_pos_emb`` through ``rotary`` where the call fits it, ``original`` otherwise. A call with a
    partial ``cos`` / ``sin`` (narrower than the head) is routed only if ``original`` is probed to rotate the first
    dims and pass the rest as the reference does (Qwen3-Next / Qwen3.5); elsewhere it stays the original's."""
    from specdec.kernels.rotary import fits_triton, rotary

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze = args[0] if args else kwargs.get("unsqueeze_dim", 1)
        if (
            unsqueeze != 1
            or len(args) > 1
            or set(kwargs) - {"unsqueeze_dim"}
            or not fits_triton(q, k, cos, sin)
            or (cos.shape[-1] != q.shape[-1] and not _partial(original))
        ):
            return original(q, k, cos, sin, *args, **kwargs)
        return rotary(q, k, cos, sin)

    apply_rotary_pos_emb.specdec_original = original
    return apply_rotary_pos_emb


@contextlib.contextmanager
def routed(modules: list[types.ModuleType]) -> Iterator[None]:
    """Bind each module's ``apply_rotary_pos_emb`` to :func:`fused` while active; always restored on exit."""
    saved = []
    try:
        for module in modules:
            original = getattr(module, NAME)
            if getattr(original, "specdec_original", None) is not None:  # already routed by an enclosing scope
                continue
            saved.append((module, original))
            setattr(module, NAME, fused(original))
        yield
    finally:
        for module, original in reversed(saved):
            setattr(module, NAME, original)
