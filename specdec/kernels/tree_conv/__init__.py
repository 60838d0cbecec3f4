"""``tree_conv``: the depthwise causal conv of a recurrent layer (Gated DeltaNet, Mamba2) over each tree node's own
ancestor path, in one launch.

Node i convolves the pre-conv inputs of its ``W`` nearest nodes on its path; where the path is shorter than ``W``
it continues into the row's committed conv window (``docs/hybrid.md``). The reference (``reference.py``) gathers
the taps from ``cat(window, inputs)`` in fp32 (~8 launches per layer and forward on CUDA); the Triton version
(``triton.py``) reads them in place, one launch. ``Backends.tree_conv`` (``SPECDEC_TREE_CONV``): ``auto`` (Triton
on CUDA when the activation is SiLU or none), ``triton`` or ``torch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.tree_conv.reference import tree_conv_reference

__all__ = ["activation_kind", "fits_triton", "tree_conv", "tree_conv_reference"]

_MODULE = "specdec.kernels.tree_conv.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.tree_conv`` (``SPECDEC_TREE_CONV``): what a call without ``impl`` uses
IMPL = env_default("tree_conv")

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_KINDS: dict = {}  # activation module type or function -> "silu", "identity" or None (probed once)


def activation_kind(activation: Callable[[torch.Tensor], torch.Tensor] | None) -> str | None:
    """``"silu"`` or ``"identity"`` when ``activation`` computes that (checked once per module type or function on
    a random fp32 input: equal to ``F.silu`` / the input exactly), else None (the kernel does not take it)."""
    if activation is None:
        return "identity"
    key = type(activation) if isinstance(activation, torch.nn.Module) else activation
    if key not in _KINDS:
        x = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 4
        found = None
        try:
            got = activation(x)
            if isinstance(got, torch.Tensor) and got.dtype == x.dtype and got.shape == x.shape:
                found = "silu" if torch.equal(got, F.silu(x)) else "identity" if torch.equal(got, x) else None
        except Exception:  # noqa: BLE001 - an activation the probe cannot call takes the reference
            found = None
        _KINDS[key] = found
    return _KINDS[key]


def fits_triton(inputs: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                index: torch.Tensor) -> bool:  # fmt: skip
    """Whether the Triton version takes the call: ``inputs [B, N, C]``, ``window [B, C, S]``, ``weight [C, W]``,
    ``bias [C]`` or None, ``index [B, N, W]`` int64 (any strides), fp32 / bf16 / fp16."""
    return (
        inputs.dim() == 3
        and window.dim() == 3
        and weight.dim() == 2
        and index.dim() == 3
        and window.shape[:2] == (inputs.shape[0], inputs.shape[2])
        and weight.shape[0] == inputs.shape[2]
        and index.shape == (*inputs.shape[:2], weight.shape[1])
        and index.dtype == torch.int64
        and (bias is None or (bias.dim() == 1 and bias.shape[0] == inputs.shape[2] and bias.dtype in _DTYPES))
        and all(t.dtype in _DTYPES for t in (inputs, window, weight))
    )


def tree_conv(
    inputs: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    activation: Callable[[torch.Tensor], torch.Tensor] | None,
    *,
    impl: Impl | None = None,
) -> torch.Tensor:
    """Depthwise causal conv of every tree node over its own ancestor path, for one row or a batch of rows.

    Args:
        inputs (torch.Tensor): ``[B, N, C]`` pre-conv inputs of the nodes (or ``[N, C]``: one row).
        window (torch.Tensor): ``[B, C, S]`` committed conv windows (newest column last; ``[C, S]`` for one row).
        weight (torch.Tensor): ``[C, W]`` depthwise kernel; bias ``[C]`` or None.
        index (torch.Tensor): ``[B, N, W]`` int64 from the round's topology, ``conv_index(W, S)`` (``[N, W]`` for
            one row); row b's taps index row b's ``cat(window, inputs)``, oldest first.
        activation: applied to the conv output (fp32); None: none.
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; the call must fit and the
            activation be SiLU or none), ``"torch"`` (the reference) or ``"auto"``; None: ``Backends.tree_conv``.

    Returns:
        ``[B, N, C]`` (``[N, C]`` for one row) in the dtype of ``inputs``.
    """
    if inputs.dim() == 2:
        return tree_conv(inputs[None], window[None], weight, bias, index[None], activation, impl=impl)[0]
    impl = IMPL if impl is None else impl
    if pick_impl(impl, inputs.device, _MODULE) == "torch":
        return tree_conv_reference(inputs, window, weight, bias, index, activation or (lambda t: t))
    kind = activation_kind(activation)
    if kind is None or not fits_triton(inputs, window, weight, bias, index):
        if impl == "triton":
            raise ValueError(f"impl='triton' takes inputs [B, N, C], window [B, C, S], weight [C, W], index [B, N, "
                             f"W] int64 (fp32 / bf16 / fp16) and a SiLU or no activation; got inputs "
                             f"{list(inputs.shape)} {inputs.dtype}, window {list(window.shape)}, weight "
                             f"{list(weight.shape)}, index {list(index.shape)} {index.dtype}, activation "
                             f"{type(activation).__name__}: use impl='torch'.")  # fmt: skip
        return tree_conv_reference(inputs, window, weight, bias, index, activation or (lambda t: t))
    from specdec.kernels.tree_conv.triton import tree_conv_triton

    return tree_conv_triton(inputs, window, weight, bias, index, silu=kind == "silu")
