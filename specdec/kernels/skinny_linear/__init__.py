"""``skinny_linear``: a linear layer ``y = x @ W^T (+ bias)`` of a few rows (a decode step, or a draft tree of up to
64 tokens) by a large weight (e.g. the 8 B target's 4096 x 4096 ... 151936 x 4096 projections), split along ``K``.

The reference (the specification and the CPU path) is ``torch.nn.functional.linear``. A grid over output tiles
alone is small for a skinny call: ``(M = 32, K = 12288, N = 4096)`` is 64 tiles of 64 columns for an H200's 132
SMs. The Triton version (``triton.py``) also deals the ``K`` axis out to ``SPLIT_K`` programs per column block
(split-K), about three programs per SM, whose fp32 partials a second launch sums in a fixed order (deterministic),
adding the bias; when the columns alone fill the GPU (the lm_head) it is one launch. It reads nothing on the host
(the plan comes from shapes and the SM count, read once per device), so it can be captured in a CUDA graph.
Measured on an H200 at the Qwen3-8B projections (graph-replayed), it is level with cuBLAS at 1 row and for the
output head and slower at 16-64 rows (0.38-0.93 x cuBLAS's speed; docs/kernels.md).

Precision: fp32 accumulation, IEEE dots for fp32 inputs (no TF32), one rounding to the output dtype. The sum order
differs from cuBLAS's, so bf16 / fp16 outputs may differ from ``F.linear``'s by an ulp.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from specdec.kernels._triton import importable, pick_impl
from specdec.kernels.skinny_linear.reference import skinny_linear_reference

__all__ = ["FLOAT_DTYPES", "MAX_ROWS", "TRITON_DTYPES", "skinny_linear", "skinny_linear_reference"]

_MODULE = "specdec.kernels.skinny_linear.triton"

Impl = Literal["auto", "torch", "triton"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The dtypes ``x``, ``weight`` and ``bias`` may have (all the same)."""

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes the Triton version takes; with others ``impl="auto"`` uses the reference."""

MAX_ROWS = 64
"""The most rows ``M = prod(x.shape[:-1])`` the Triton version takes; with more ``impl="auto"`` uses the reference."""


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """``x @ weight^T (+ bias)`` for a few rows of ``x``. Arguments as :func:`skinny_linear_reference`.

    Args:
        impl (str): ``"triton"`` (split-K: CUDA or Triton's interpreter; fp32 / bf16 / fp16 and ``M <= MAX_ROWS``),
            ``"torch"`` (the reference) or ``"auto"``: Triton on CUDA (or under ``TRITON_INTERPRET=1``) when it
            imports and the call fits it, else the reference.

    Returns:
        torch.Tensor: ``[..., N]`` (``x``'s leading dims), ``x``'s dtype; contiguous from the Triton version.
    """
    _check_args(x, weight, bias, impl)
    if pick_impl(impl, x.device, _MODULE, fits=_fits_triton(x)) == "torch":
        return skinny_linear_reference(x, weight, bias)
    from specdec.kernels.skinny_linear.triton import skinny_linear_triton

    out = skinny_linear_triton(x.reshape(_rows(x), x.shape[-1]), weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def _triton_available() -> bool:
    return importable(_MODULE)


def _rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def _fits_triton(x: torch.Tensor) -> bool:
    """Whether the Triton version takes the call: its dtype and at most ``MAX_ROWS`` rows."""
    return x.dtype in TRITON_DTYPES and _rows(x) <= MAX_ROWS


def _describe(t) -> str:
    return f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_args(x, weight, bias, impl: str = "auto") -> None:
    names = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be a [..., K] tensor (at least 1-d) of {names}; got {_describe(x)}: pass the "
                         "activations in a float dtype.")  # fmt: skip
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype not in FLOAT_DTYPES:
        raise ValueError(f"weight must be a 2-d [N, K] tensor of {names}; got {_describe(weight)}: pass the "
                         "layer's weight (nn.Linear.weight: out_features x in_features).")  # fmt: skip
    if weight.dtype != x.dtype:
        raise ValueError(f"weight is {weight.dtype}, x {x.dtype}: convert one to the other's dtype.")
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"x has K = {x.shape[-1]} features (last dim) but weight [N, K] = {list(weight.shape)} "
                         f"takes K = {weight.shape[1]}: pass x [..., K] and weight [N, K] with the same K (weight is "
                         "[out, in], not transposed).")  # fmt: skip
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}: move them to one device.")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must be None or a 1-d [N] = [{weight.shape[0]}] tensor; got {_describe(bias)}: "
                             "pass the layer's bias (one value per output feature).")  # fmt: skip
        if bias.dtype != x.dtype:
            raise ValueError(f"bias is {bias.dtype}, x {x.dtype}: convert it to x's dtype.")
        if bias.device != x.device:
            raise ValueError(f"bias is on {bias.device}, x on {x.device}: move them to one device.")
    if impl == "triton" and x.dtype not in TRITON_DTYPES:
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in TRITON_DTYPES)
        raise ValueError(f"impl='triton' takes {dtypes}; got {x.dtype}: use impl='torch' (or 'auto', which falls "
                         "back to it).")  # fmt: skip
    if impl == "triton" and _rows(x) > MAX_ROWS:
        raise ValueError(f"impl='triton' takes at most M = {MAX_ROWS} rows (the product of x's leading dims); got "
                         f"M = {_rows(x)} from x {list(x.shape)}: use impl='torch' (or 'auto', which falls back to "
                         "it), or split the rows into calls of <= 64.")  # fmt: skip
