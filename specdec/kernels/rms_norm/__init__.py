"""``rms_norm``: the DFlash drafter's RMSNorm in one launch.

The reference (the specification and the CPU path) is the drafter's ``_RMSNorm``
(:mod:`specdec.drafters.dflash_model`): normalise in fp32, round back to ``x``'s dtype, multiply by the weight.
On CUDA that is ~8 small kernels per call; the Triton version (``triton.py``) is one launch, reads nothing on the
host (capture-safe) and equals the reference up to the order of the fp32 sum of squares. A ``[G, D]`` weight
applies one row per group of ``period`` consecutive rows (e.g. per-layer key norms over ``[R, L, H, D]``), so the
drafter's stacked norms are one call too. See ``docs/kernels.md``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from specdec.kernels._triton import importable, pick_impl
from specdec.kernels.rms_norm.reference import add_rms_norm_reference, rms_norm_cat_reference, rms_norm_reference

__all__ = [
    "FLOAT_DTYPES",
    "add_rms_norm",
    "add_rms_norm_reference",
    "rms_norm",
    "rms_norm_cat",
    "rms_norm_cat_reference",
    "rms_norm_reference",
]

_MODULE = "specdec.kernels.rms_norm.triton"

Impl = Literal["auto", "torch", "triton"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The dtypes ``x`` and ``weight`` may have."""


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    period: int = 1,
    unit_offset: bool = False,
    impl: Impl = "auto",
) -> torch.Tensor:
    """RMSNorm over the last dim of ``x``, with one weight row per group of ``period`` rows. Arguments as
    :func:`rms_norm_reference`.

    Args:
        impl (str): ``"triton"`` (one launch: CUDA or Triton's interpreter), ``"torch"`` (the reference) or
            ``"auto"``: Triton on CUDA (or under ``TRITON_INTERPRET=1``) when it imports, else the reference.

    Returns:
        torch.Tensor: ``x``'s shape, dtype ``torch.promote_types(x.dtype, weight.dtype)`` (``unit_offset``:
        ``x.dtype``).
    """
    _check_args(x, weight, eps, period)
    if pick_impl(impl, x.device, _MODULE) == "torch":
        return rms_norm_reference(x, weight, eps, period=period, unit_offset=unit_offset)
    from specdec.kernels.rms_norm.triton import rms_norm_triton

    return rms_norm_triton(x, weight, eps, period, unit_offset=unit_offset)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, impl: Impl = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm layer's residual add and the RMSNorm after it (:func:`add_rms_norm_reference`): ``(residual + x,
    its norm)``, in one launch where Triton runs (``x`` and ``residual`` of one shape and dtype, a ``[D]`` weight),
    else the two tensor ops.

    Args:
        impl (str): ``"triton"`` (no autograd, as :func:`rms_norm`'s), ``"torch"`` (the reference) or ``"auto"``
            (as :func:`rms_norm`; a call the kernel does not take, e.g. mixed dtypes, or one that needs gradients,
            runs the reference).
    """
    _check_args(x, weight, eps, 1)
    fits = isinstance(residual, torch.Tensor) and residual.shape == x.shape and residual.dtype == x.dtype \
        and residual.device == x.device and weight.dim() == 1  # fmt: skip
    if impl == "triton" and not fits:
        raise ValueError("impl='triton' takes x and residual of one shape, dtype and device and a [D] weight: use "
                         "impl='torch'.")  # fmt: skip
    grads = torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad)
    if pick_impl(impl, x.device, _MODULE, fits=fits and not (impl == "auto" and grads)) == "torch":
        return add_rms_norm_reference(x, residual, weight, eps)
    from specdec.kernels.rms_norm.triton import add_rms_norm_triton

    return add_rms_norm_triton(x, residual, weight, eps)


def rms_norm_cat(
    a: torch.Tensor,
    b: torch.Tensor,
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    eps_a: float,
    eps_b: float,
    *,
    rows: torch.Tensor | None = None,
    row_map: torch.Tensor | None = None,
    unit_offset: bool = False,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Two RMSNorms written side by side (:func:`rms_norm_cat_reference`): ``[..., 2 D]``, ``a``'s norm first. One
    launch where Triton runs (``a`` and ``b`` of one shape, dtype and device, ``[D]`` weights of one dtype), else the
    two norms and the concatenation. Each half equals :func:`rms_norm` of its input.

    Args:
        rows (torch.Tensor | None): integer ids of ``b``'s leading shape: ``a`` is then a table ``[N, D]`` and the
            first half normalises ``a[rows]`` (an embedding lookup in the same launch); ids must be in range (not
            checked on the device).
        row_map (torch.Tensor | None): with ``rows``, a 1-D integer map: the rows ``a[row_map[rows]]``.
        impl (str): as :func:`add_rms_norm`'s (``"triton"`` refuses a call the kernel does not take).
    """
    _check_args(a, weight_a, eps_a, 1)
    _check_args(b, weight_b, eps_b, 1)
    for name, ids in (("rows", rows), ("row_map", row_map)):
        if ids is not None and (not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex()
                                or ids.dtype == torch.bool or ids.device != b.device):  # fmt: skip
            raise ValueError(f"{name} must be an integer tensor on {b.device}: pass token ids (e.g. ids.long()).")
    if row_map is not None and (rows is None or row_map.dim() != 1):
        raise ValueError("row_map is a 1-D id map applied to rows: pass rows too, and a [M] map.")
    if rows is not None and (a.dim() != 2 or tuple(rows.shape) != tuple(b.shape[:-1])):
        raise ValueError(f"with rows, a is a table [N, D] and rows has b's leading shape {list(b.shape[:-1])}; got "
                         f"a {list(a.shape)}, rows {list(rows.shape)}: pass the embedding weight and one id per row.")
    lead = a.shape if rows is None else (*rows.shape, a.shape[-1])
    fits = lead == b.shape and a.dtype == b.dtype and a.device == b.device and weight_a.dim() == 1 \
        and weight_b.dim() == 1 and weight_a.dtype == weight_b.dtype  # fmt: skip
    if impl == "triton" and not fits:
        raise ValueError("impl='triton' takes a and b of one shape, dtype and device and [D] weights of one dtype: "
                         "use impl='torch'.")  # fmt: skip
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, weight_a, weight_b))
    if pick_impl(impl, a.device, _MODULE, fits=fits and not (impl == "auto" and grads)) == "torch":
        return rms_norm_cat_reference(a, b, weight_a, weight_b, eps_a, eps_b, rows=rows, row_map=row_map,
                                      unit_offset=unit_offset)  # fmt: skip
    from specdec.kernels.rms_norm.triton import rms_norm_cat_triton

    return rms_norm_cat_triton(a, b, weight_a, weight_b, eps_a, eps_b, rows=rows, row_map=row_map,
                               unit_offset=unit_offset)  # fmt: skip


def _triton_available() -> bool:
    return importable(_MODULE)


def _check_args(x: torch.Tensor, weight: torch.Tensor, eps: float, period: int) -> None:
    names = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES or x.dim() == 0:
        got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a [..., D] tensor (at least one dim) of {names}; got {got}: convert it "
                         "(e.g. x.float(), x[None]).")  # fmt: skip
    if not isinstance(weight, torch.Tensor) or weight.dtype not in FLOAT_DTYPES:
        got = weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a tensor of {names}; got {got}: convert it (e.g. weight.float()).")
    dim = x.shape[-1]
    if weight.dim() not in (1, 2) or weight.shape[-1] != dim or (weight.dim() == 2 and weight.shape[0] == 0):
        shape = list(weight.shape)
        raise ValueError(f"weight must be [D] or [G, D] with G >= 1 and D = x.shape[-1] = {dim}; got {shape}: pass "
                         "the norm's weight for x's last dim (a row per group).")  # fmt: skip
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}: move them to one device.")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps={eps!r}: pass a finite Python float >= 0 (a tensor would be read on the host).")
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ValueError(f"period={period!r}: pass a Python int >= 1 (rows of x per weight row).")
