"""``silu_mul``: a gated MLP's ``silu(gate) * up`` in one launch, and the routing of the target's and the drafters'
gated MLP modules through it while the round runs their uncompiled forwards.

HF's gated MLPs (Llama, Qwen2 / 3, Qwen3.5, Mistral and their kin) compute ``down(act(gate(x)) * up(x))``: the
activation and the product are two launches per layer and forward on CUDA. The Triton version (``triton.py``) is
one; the reference (``reference.py``) is the formula verbatim. A module is routed only if a probe finds its
forward equal, bit for bit, to ``down(silu_mul_reference(gate(x), up(x)))`` on a shallow copy holding small random
projections (once per module type, activation, dtype and device), so another activation or formula keeps its own
forward.

``Backends.silu_mul`` (``SPECDEC_SILU_MUL``): ``auto`` (Triton on CUDA outside ``torch.compile`` and autograd, and
the modules routed there), ``triton`` (routed everywhere: the kernel runs where Triton does, the reference
elsewhere) or ``torch`` (never).
"""

from __future__ import annotations

import types
from typing import Literal

import torch
from torch import nn

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.silu_mul.reference import silu_mul_reference
from specdec.state.forwards import hook_free_copy, swappable, swapped_forwards

__all__ = ["IMPL", "fits_triton", "mlp_forward", "mlp_kernel_for", "mlp_modules", "routed", "silu_mul",
           "silu_mul_reference"]  # fmt: skip

_MODULE = "specdec.kernels.silu_mul.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.silu_mul`` (``SPECDEC_SILU_MUL``): what a call without ``impl`` uses, and whether scopes route MLPs
IMPL = env_default("silu_mul")

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fits_triton(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Whether the Triton version takes the call: one shape, fp32 / bf16 / fp16, a contiguous last dim, no
    autograd history to keep."""
    return (
        gate.dim() >= 1
        and gate.shape == up.shape
        and gate.dtype in _DTYPES
        and up.dtype in _DTYPES
        and (gate.numel() == 0 or (gate.stride(-1) == 1 and up.stride(-1) == 1))
        and not (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad))
    )


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, impl: Impl | None = None) -> torch.Tensor:
    """``F.silu(gate) * up`` (:func:`silu_mul_reference`).

    Args:
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold),
            ``"torch"`` (the reference) or ``"auto"``: Triton where it runs and the call fits, outside
            ``torch.compile``; None: ``Backends.silu_mul``.
    """
    impl = IMPL if impl is None else impl
    if impl == "auto" and torch.compiler.is_compiling():  # the compiler fuses them itself
        impl = "torch"
    fits = fits_triton(gate, up)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes gate and up of one shape (fp32 / bf16 / fp16, the last dim contiguous, "
                         f"no autograd); got {gate.dtype} {list(gate.shape)} and {up.dtype} {list(up.shape)}: use "
                         "impl='torch'.")  # fmt: skip
    if pick_impl(impl, gate.device, _MODULE, fits=fits) == "torch":
        return silu_mul_reference(gate, up)
    from specdec.kernels.silu_mul.triton import silu_mul_triton

    return silu_mul_triton(gate, up)


def mlp_kernel_for(device: torch.device | str) -> bool:
    """Whether uncompiled forwards on ``device`` route their gated MLP modules through :func:`mlp_forward`."""
    if IMPL != "auto":
        return IMPL == "triton"
    return pick_impl("auto", torch.device(device), _MODULE) == "triton"


_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# (module type, its act_fn's type, dtype, device) -> whether its forward is down(silu(gate(x)) * up(x)) (probed once)
_PROBED: dict[tuple, bool] = {}


def _candidate(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, name, None), nn.Linear) for name in _PROJECTIONS) and swappable(module)


@torch.no_grad()
def _computes_the_formula(module: nn.Module) -> bool:
    weight = module.gate_proj.weight
    act = getattr(module, "act_fn", None)  # instances of one class may hold different activations (hidden_act)
    act = type(act) if isinstance(act, nn.Module) else act
    key = (type(module), act, weight.dtype, weight.device)
    if key not in _PROBED:
        gen = torch.Generator().manual_seed(0)
        kind = dict(dtype=weight.dtype, device=weight.device)

        def linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
            layer = nn.Linear(n_in, n_out, bias=bias, **kind)
            layer.weight.copy_(torch.randn(n_out, n_in, generator=gen).to(**kind) / 2)
            if bias:
                layer.bias.copy_(torch.randn(n_out, generator=gen).to(**kind))
            return layer

        shapes = ((16, 24), (16, 24), (24, 16))
        clone = hook_free_copy(module, **{name: linear(n_in, n_out, getattr(module, name).bias is not None)
                                          for name, (n_in, n_out) in zip(_PROJECTIONS, shapes, strict=True)})
        x = (torch.randn(3, 16, generator=gen) * 3).to(**kind)
        try:
            got = clone(x)
            want = clone.down_proj(silu_mul_reference(clone.gate_proj(x), clone.up_proj(x)))
            found = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        except Exception:  # noqa: BLE001 - a module the probe cannot call keeps its own forward
            found = False
        _PROBED[key] = found
    return _PROBED[key]


def mlp_modules(*models) -> list[nn.Module]:
    """The gated MLP modules of ``models`` (None skipped) whose forward is ``down(silu(gate(x)) * up(x))``, each
    once."""
    seen: dict[int, nn.Module] = {}
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if _candidate(module) and _computes_the_formula(module):
                seen[id(module)] = module
    return list(seen.values())


def mlp_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` with its activation and product in one :func:`silu_mul` (its projections' own forwards)."""
    return module.down_proj(silu_mul(module.gate_proj(x), module.up_proj(x)))


def routed(modules: list[nn.Module]):
    """A context manager that routes ``modules`` through :func:`mlp_forward` while active."""
    return swapped_forwards((m, types.MethodType(mlp_forward, m)) for m in modules)
