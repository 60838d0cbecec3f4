"""``gated_rms_norm``: the gated RMSNorm of Qwen3.5 / Qwen3-Next Gated DeltaNet layers (``weight * rmsnorm(x) *
silu(gate)``) in one launch.

The layer's own norm (``Qwen3_5RMSNormGated``, ``Qwen3NextRMSNormGated``) is ~12 small kernels per call on CUDA
(casts, square, mean, add, rsqrt, three products, silu), plus the cast of the recurrence's fp32 output before it:
a few microseconds each however small the tensor, 24 layers per step of a Qwen3.5-style 8 B hybrid. The Triton
version (``triton.py``) is one launch that reads the fp32 output directly; the reference (``reference.py``) is the
layer's formula verbatim.

:func:`gated_norm` is what the Gated DeltaNet adapter (``specdec.state.gdn``) calls with the layer's norm module:
the kernel where it runs and the module computes the reference's formula (decided per module type, dtype and device
by a probe: the module's own forward and the reference on a random input with a random weight must agree exactly),
else the module's own forward. ``Backends.gated_norm`` (``SPECDEC_GATED_NORM``) picks: ``auto`` (Triton on CUDA),
``triton`` or ``torch``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.gated_rms_norm.reference import gated_rms_norm_reference

__all__ = ["fits_triton", "gated_norm", "gated_rms_norm", "gated_rms_norm_reference", "probe"]

_MODULE = "specdec.kernels.gated_rms_norm.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.gated_norm`` (``SPECDEC_GATED_NORM``): what a call without ``impl`` uses
IMPL = env_default("gated_norm")

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fits_triton(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the Triton version takes the call: ``x`` and ``gate`` of one shape, each flattening to rows with a
    contiguous last dim, ``weight [D]``, fp32 / bf16 / fp16 everywhere (``dtype`` included)."""
    return (
        x.dim() >= 1
        and x.shape == gate.shape
        and weight.shape == x.shape[-1:]
        and all(t.dtype in _DTYPES for t in (x, gate, weight))
        and dtype in _DTYPES
        and (x.numel() == 0 or (x.stride(-1) == 1 and gate.stride(-1) == 1))
    )


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    dtype: torch.dtype | None = None,
    impl: Impl | None = None,
) -> torch.Tensor:
    """``weight * rmsnorm(x) * silu(gate)`` over the last dim. Arguments and result as
    :func:`gated_rms_norm_reference`.

    Args:
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold),
            ``"torch"`` (the reference) or ``"auto"``: Triton where it runs and the call fits, else the reference;
            None: ``Backends.gated_norm`` (default ``"auto"``).
    """
    impl = IMPL if impl is None else impl
    dtype = x.dtype if dtype is None else dtype
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps={eps!r}: pass a finite Python float >= 0 (a tensor would be read on the host).")
    fits = fits_triton(x, gate, weight, dtype)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes x and gate [..., D] of one shape with a contiguous last dim, weight "
                         f"[D], fp32 / bf16 / fp16; got x {x.dtype} {list(x.shape)}, gate {gate.dtype} "
                         f"{list(gate.shape)}, weight {weight.dtype} {list(weight.shape)}, dtype {dtype}: use "
                         "impl='torch'.")  # fmt: skip
    if pick_impl(impl, x.device, _MODULE, fits=fits) == "torch":
        return gated_rms_norm_reference(x, gate, weight, eps, dtype=dtype)
    from specdec.kernels.gated_rms_norm.triton import gated_rms_norm_triton

    dim = x.shape[-1]
    out = gated_rms_norm_triton(x.reshape(-1, dim), gate.reshape(-1, dim), weight, eps, dtype)
    return out.reshape(x.shape)


# (module type, dtype) -> whether the type's forward computes the reference (probed once, on the host)
_PROBED: dict[tuple[type, torch.dtype], bool] = {}


def _eps(module: nn.Module) -> float | None:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None


@torch.no_grad()
def probe(module: nn.Module) -> bool:
    """Whether ``module(x, gate)`` computes :func:`gated_rms_norm_reference` with its ``weight`` and eps: its forward
    on a random input, gate and weight (its dtype, on the host; on a shallow copy, the module is not touched) equals
    the reference exactly. Once per module type and dtype, on the host; a norm of another formula (gate before the norm,
    grouped, with a bias) keeps its own forward."""
    weight = getattr(module, "weight", None)
    eps = _eps(module)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or eps is None:
        return False
    if getattr(module, "bias", None) is not None or getattr(module, "group_size", None) not in (None, weight.shape[0]):
        return False
    # on the host, in the module's dtype: the formula does not depend on the device, and the probe may first run
    # inside a round's forward (a device comparison there would be a host read)
    key = (type(module), weight.dtype)
    if key not in _PROBED:
        from specdec.state.forwards import hook_free_copy  # (specdec.state imports this module)

        gen = torch.Generator().manual_seed(0)

        def draw(*shape):
            return (torch.randn(*shape, generator=gen) * 3).to(weight.dtype)

        x, gate = draw(3, weight.shape[0]), draw(3, weight.shape[0])
        try:
            clone = hook_free_copy(module, weight=draw(weight.shape[0]))
            got = clone(x, gate)
            want = gated_rms_norm_reference(x, gate, clone.weight, eps)
            found = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        except Exception:  # noqa: BLE001 - a module the probe cannot call keeps its own forward
            found = False
        _PROBED[key] = found
    return _PROBED[key]


def gated_norm(module: nn.Module, x: torch.Tensor, gate: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A Gated DeltaNet layer's norm ``module`` on the recurrence's output ``x`` (any float dtype, rounded to
    ``dtype`` first, as the layer does) and ``gate``: one launch where ``Backends.gated_norm`` picks Triton and the
    module computes the reference's formula (:func:`probe`), else ``module(x.to(dtype), gate)``."""
    weight, eps = getattr(module, "weight", None), _eps(module)
    if IMPL == "torch" or not isinstance(weight, torch.Tensor) or eps is None:
        return module(x.to(dtype), gate)
    fits = fits_triton(x, gate, weight, dtype)
    if pick_impl(IMPL, x.device, _MODULE, fits=fits) == "torch" or not probe(module):
        return module(x.to(dtype), gate)
    return gated_rms_norm(x, gate, weight, eps, dtype=dtype, impl="triton")
