"""The target's RMSNorm layers through ``rms_norm`` while the round runs its uncompiled forwards.

An HF RMSNorm (Llama, Qwen2 / 3, Mistral, Phi-3 and their kin) is ~7 small kernels per call on CUDA (cast, square,
mean, add, rsqrt, multiply, cast and scale), four calls per decoder layer of a Qwen3 model (input, post-attention,
query and key norms): ~1000 launches in a captured 8 B decode step, each a few microseconds however small its
tensor. ``rms_norm``'s Triton kernel does one. Under ``torch.compile`` the compiler fuses them itself, so only
uncompiled forwards are routed.

Which modules: every module of the models whose computation is one of the reference's two formulas (Llama's
``weight * (x / rms(x))`` with ``x / rms`` in fp32 rounded to ``x``'s dtype, or Gemma's / Qwen3-Next's
``(x / rms(x)) * (1 + weight)`` in fp32 rounded once), decided per module type by a probe — the module's own
forward and ``rms_norm_reference`` on a random input with a random weight in the module's dtype and device must
agree exactly — so a norm of another formula (a norm with a bias, a gated norm) keeps its own forward.

``Backends.target_norm`` (``SPECDEC_TARGET_NORM``): ``auto`` (default: routed where the Triton kernel runs, i.e.
CUDA), ``triton`` (routed everywhere: ``rms_norm`` takes its reference off CUDA) or ``torch`` (never). The switch
is made by :class:`specdec.attention.AttentionScope` (``norms=True``) through the hook-safe forward swap
(``specdec.state.forwards``); the user's model is left as it was.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.rms_norm.reference import rms_norm_reference
from specdec.state.forwards import hook_free_copy, swappable, swapped_forwards

__all__ = ["KERNEL", "norm_cat_routed", "norm_forward", "norm_kernel_for", "norm_modules", "routed"]

# "auto" (default), "torch" or "triton"; read when a scope is built (rounds and prefills build theirs once).
KERNEL = env_default("target_norm")
_KERNELS = ("auto", "torch", "triton")

# (module type, dtype, device) -> the reference formula the type computes: "plain", "unit_offset" or None (probed once)
_PROBED: dict[tuple[type, torch.dtype, torch.device], str | None] = {}
_FORMULAS = {"plain": False, "unit_offset": True}  # formula -> rms_norm's unit_offset


def norm_kernel_for(device: torch.device | str) -> bool:
    """Whether uncompiled forwards on ``device`` route their RMSNorm layers through :func:`norm_forward`."""
    if KERNEL not in _KERNELS:
        raise ValueError(f"SPECDEC_TARGET_NORM={KERNEL!r}: use 'auto', 'torch' or 'triton'.")
    if KERNEL != "auto":
        return KERNEL == "triton"
    return pick_impl("auto", torch.device(device), "specdec.kernels.rms_norm.triton") == "triton"


def _eps(module: nn.Module) -> float | None:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None


def _candidate(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        "RMSNorm" in type(module).__name__
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and getattr(module, "bias", None) is None
        and _eps(module) is not None
        and swappable(module)
    )


@torch.no_grad()
def _computes_the_reference(module: nn.Module) -> bool:
    """The probe: the module's forward equals ``rms_norm_reference`` (either formula) on a random input."""
    return _formula(module) is not None


def _formula(module: nn.Module) -> str | None:
    """The formula of ``rms_norm_reference`` the module's forward equals on a random input with a random weight
    (its dtype and device): "plain", "unit_offset" or None."""
    weight = module.weight
    key = (type(module), weight.dtype, weight.device)
    if key not in _PROBED:
        gen = torch.Generator().manual_seed(0)
        x = (torch.randn(3, weight.shape[0], generator=gen) * 3).to(device=weight.device, dtype=weight.dtype)
        found = None
        try:
            # a copy with a random weight (the norms' own, often ones or zeros at init, could hide 1 + w): the user's
            # module is never touched
            clone = hook_free_copy(module, weight=torch.randn(weight.shape, generator=gen).to(device=weight.device,
                                                                                          dtype=weight.dtype))
            got = clone(x)
            for name, offset in _FORMULAS.items():
                want = rms_norm_reference(x, clone.weight, _eps(clone), unit_offset=offset)
                if isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want):
                    found = name
                    break
        except Exception:  # noqa: BLE001 - a module the probe cannot call keeps its own forward
            found = None
        _PROBED[key] = found
    return _PROBED[key]


def norm_modules(*models) -> list[nn.Module]:
    """The RMSNorm modules of ``models`` (None skipped) that compute the reference's formula, each once."""
    seen: dict[int, nn.Module] = {}
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if _candidate(module) and _computes_the_reference(module):
                seen[id(module)] = module
    return list(seen.values())


def norm_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through ``rms_norm`` with the module's formula (its Triton kernel on CUDA, its reference
    elsewhere)."""
    from specdec.kernels.rms_norm import rms_norm

    return rms_norm(x, module.weight, _eps(module), unit_offset=_formula(module) == "unit_offset")


def norm_cat_routed(module_a: nn.Module, a: torch.Tensor, module_b: nn.Module, b: torch.Tensor):
    """``torch.cat([module_a(a), module_b(b)], -1)`` in one ``rms_norm_cat`` launch when both modules are routed
    right now (inside :func:`routed`, with one formula): the same values as their routed forwards, bit for bit.
    None otherwise (the caller runs the modules)."""
    bound = [getattr(m.__dict__.get("forward"), "__func__", None) for m in (module_a, module_b)]
    formula = _PROBED.get((type(module_a), module_a.weight.dtype, module_a.weight.device))
    if bound != [norm_forward, norm_forward] or type(module_a) is not type(module_b) or formula is None:
        return None
    from specdec.kernels.rms_norm import rms_norm_cat

    return rms_norm_cat(a, b, module_a.weight, module_b.weight, _eps(module_a), _eps(module_b),
                        unit_offset=formula == "unit_offset")  # fmt: skip


def routed(modules: list[nn.Module]):
    """A context manager that routes ``modules`` through :func:`norm_forward` while active."""
    return swapped_forwards((m, types.MethodType(norm_forward, m)) for m in modules)
