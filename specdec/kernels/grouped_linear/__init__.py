"""``grouped_linear``: the products of one input by several weights in one launch (a layer's ``q_proj`` /
``k_proj`` / ``v_proj``), and ``gated_linear``: a gated MLP's ``silu(gate(x)) * up(x)`` in one launch, for the few
rows of a decode step or a draft tree (at most 64).

A decode step of an 8 B target runs seven products per layer, and cuBLAS splits the small ones along ``K`` with a
reduction launch each: at the Qwen3-8B shape the step's 36 layers launch about 430 product kernels, ``k_proj`` and
``v_proj`` read their 8 MB at about half the copy bandwidth, and each launch costs a graph node. HF's layers call
their projections one by one, and stacked copies of a target's weights would cost most of its size again, so the
Triton versions (``triton.py``) read the layers' own weights where they are: the column blocks of all weights of a
group form one grid, split along ``K`` as ``skinny_linear``'s (one reduction launch for the group), and the gated
form reads the gate's and the up projection's columns in the same program and applies the activation where the
sums are complete.

The references (``reference.py``) are ``F.linear`` per weight and ``silu_mul_reference`` of the two products.
``Backends.grouped_linear`` (``SPECDEC_GROUPED_LINEAR``) decides where the round's forwards use them
(``routing.py``).

Precision: fp32 accumulation, IEEE dots for fp32 inputs, one rounding per product; the sum order differs from
cuBLAS's, so a bf16 / fp16 product may differ from ``F.linear``'s by an ulp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch

from specdec.backends import env_default
from specdec.kernels._triton import importable, pick_impl
from specdec.kernels.grouped_linear.reference import gated_linear_reference, grouped_linear_reference

__all__ = ["IMPL", "MAX_ROWS", "MAX_WEIGHTS", "gated_linear", "gated_linear_reference", "grouped_linear",
           "grouped_linear_reference"]  # fmt: skip

_MODULE = "specdec.kernels.grouped_linear.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.grouped_linear`` (``SPECDEC_GROUPED_LINEAR``): whether the round's scopes route projection groups
IMPL = env_default("grouped_linear")

MAX_ROWS = 64
"""The most rows ``M = prod(x.shape[:-1])`` the Triton versions take."""

MAX_WEIGHTS = 4
"""The most weights one ``grouped_linear`` call takes."""

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def fits_triton(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> bool:
    """Whether the Triton versions take ``x`` and ``weights``: fp32 / bf16 / fp16 of one dtype, at most
    ``MAX_ROWS`` rows, contiguous weights, no autograd history to keep."""
    return (
        x.dtype in _DTYPES
        and _rows(x) <= MAX_ROWS
        and all(w.dtype == x.dtype and w.is_contiguous() for w in weights)
        and not (torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)))
    )


def _describe(t) -> str:
    return f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check(x, weights, biases, impl: str, name: str) -> None:
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"{name}: impl={impl!r}: choose 'auto', 'torch' or 'triton'.")
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.is_floating_point():
        raise ValueError(f"{name}: x must be a float [..., K] tensor; got {_describe(x)}.")
    k = x.shape[-1]
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] != k:
            raise ValueError(f"{name}: weight {i} must be a 2-d [N, K = {k}] tensor (nn.Linear.weight: out x in); "
                             f"got {_describe(w)}.")  # fmt: skip
        if w.dtype != x.dtype or w.device != x.device:
            raise ValueError(f"{name}: weight {i} is {w.dtype} on {w.device}, x {x.dtype} on {x.device}: convert "
                             "them to one dtype and device.")  # fmt: skip
    if biases is not None:
        if len(biases) != len(weights):
            raise ValueError(f"{name}: {len(biases)} biases for {len(weights)} weights: give one per weight or None.")
        given = [b is not None for b in biases]
        if any(given) and not all(given):
            raise ValueError(f"{name}: biases {given}: give a bias for every weight or for none.")
        for i, (b, w) in enumerate(zip(biases, weights, strict=True)):
            if b is not None and (not isinstance(b, torch.Tensor) or b.shape != (w.shape[0],) or b.dtype != x.dtype
                                  or b.device != x.device):  # fmt: skip
                raise ValueError(f"{name}: bias {i} must be a [{w.shape[0]}] tensor of x's dtype and device; got "
                                 f"{_describe(b)}.")  # fmt: skip
    if impl == "triton" and not fits_triton(x, weights):
        raise ValueError(f"{name}: impl='triton' takes fp32 / bf16 / fp16 of one dtype, at most {MAX_ROWS} rows, "
                         f"contiguous weights and no autograd; got x {_describe(x)}: use impl='torch' (or 'auto', "
                         "which falls back to it).")  # fmt: skip


def grouped_linear(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None] | None = None,
    *,
    impl: Impl = "auto",
) -> list[torch.Tensor]:
    """``[F.linear(x, w_i, b_i) for each weight]`` (:func:`grouped_linear_reference`) for 1 to ``MAX_WEIGHTS``
    weights ``[N_i, K]`` of ``x``'s dtype and device.

    Args:
        impl (str): ``"triton"`` (CUDA or Triton's interpreter; ``fits_triton`` must hold), ``"torch"`` (the
            reference) or ``"auto"``: Triton where it runs and the call fits, else the reference.

    Returns:
        list[torch.Tensor]: ``[..., N_i]`` (``x``'s leading dims), ``x``'s dtype.
    """
    if not 1 <= len(weights) <= MAX_WEIGHTS:
        raise ValueError(f"grouped_linear takes 1 to {MAX_WEIGHTS} weights; got {len(weights)}: split the group.")
    _check(x, weights, biases, impl, "grouped_linear")
    if pick_impl(impl, x.device, _MODULE, fits=fits_triton(x, weights)) == "torch":
        return grouped_linear_reference(x, weights, biases)
    from specdec.kernels.grouped_linear.triton import grouped_linear_triton

    outs = grouped_linear_triton(x.reshape(_rows(x), x.shape[-1]), list(weights),
                                 None if biases is None else list(biases))  # fmt: skip
    return [o.view(*x.shape[:-1], o.shape[-1]) for o in outs]


def gated_linear(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, b_gate: torch.Tensor | None = None,
                 b_up: torch.Tensor | None = None, *, impl: Impl = "auto") -> torch.Tensor:  # fmt: skip
    """``silu(x W_gate^T + b_gate) * (x W_up^T + b_up)`` (:func:`gated_linear_reference`), the weights of one shape.

    Args:
        impl (str): as :func:`grouped_linear`'s.

    Returns:
        torch.Tensor: ``[..., N]`` (``x``'s leading dims), ``x``'s dtype.
    """
    _check(x, [w_gate, w_up], [b_gate, b_up], impl, "gated_linear")
    if w_gate.shape != w_up.shape:
        raise ValueError(f"gated_linear: w_gate {list(w_gate.shape)} and w_up {list(w_up.shape)} must have one shape "
                         "(a gated MLP's gate_proj and up_proj).")  # fmt: skip
    if pick_impl(impl, x.device, _MODULE, fits=fits_triton(x, [w_gate, w_up])) == "torch":
        return gated_linear_reference(x, w_gate, w_up, b_gate, b_up)
    from specdec.kernels.grouped_linear.triton import gated_linear_triton

    out = gated_linear_triton(x.reshape(_rows(x), x.shape[-1]), w_gate, w_up, b_gate, b_up)
    return out.view(*x.shape[:-1], w_gate.shape[0])


def _triton_available() -> bool:
    return importable(_MODULE)
