"""The target's projection groups through ``grouped_linear`` / ``gated_linear`` while the round runs its uncompiled
forwards (``Backends.grouped_linear``).

A group is the sibling ``nn.Linear`` layers of one module that HF's forward calls on the same input, one after the
other: an attention layer's ``q_proj`` / ``k_proj`` / ``v_proj``, a Gated DeltaNet layer's input projections
(``in_proj_qkvz`` / ``in_proj_ba``; ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``). While routed,
the first member called with an input computes the whole group in one launch and returns its own product; the
others, called with the very same tensor (same object, unchanged since), return theirs from it; a member called
with another input launches the group for that one. Where the kernel does not fit (more than 64 rows, autograd,
off a GPU) a member computes its own ``F.linear`` as before. A gated MLP (``specdec.kernels.silu_mul.mlp_modules``:
its forward probed equal to ``down(silu(gate(x)) * up(x))``) runs ``down_proj(gated_linear(x, ...))``: its gate,
up and activation in one launch.

Only exact ``nn.Linear`` members whose forward can be swapped (``specdec.state.forwards.swappable``) and whose
weights share ``K``, dtype and device, stored contiguously, with a bias on all or none, form a group; the user's
modules are left as they were on exit, and graph replays pay nothing.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from specdec.state.forwards import swappable, swapped_forwards

__all__ = [
    "GROUPS",
    "ProjectionGroup",
    "gate_up_silu",
    "gated_mlp_forward",
    "projection_groups",
    "projection_kernel_for",
    "routed",
]

GROUPS = (
    ("q_proj", "k_proj", "v_proj"),
    ("in_proj_qkvz", "in_proj_ba"),
    ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
)
"""Names of sibling projections called on one input, in the order HF's layers call them."""


def projection_kernel_for(device: torch.device | str) -> bool:
    """Whether uncompiled forwards on ``device`` route their projection groups (``Backends.grouped_linear``):
    ``auto`` on CUDA where the kernels import (not under Triton's interpreter, where the layers' own products are
    faster), ``triton`` everywhere (the kernels where Triton runs, the layers' own ``F.linear`` elsewhere), ``torch``
    never."""
    from specdec.kernels import grouped_linear as package

    if package.IMPL != "auto":
        return package.IMPL == "triton"
    return torch.device(device).type == "cuda" and package._triton_available()


def _groupable(layers: list) -> bool:
    if not all(type(m) is nn.Linear and swappable(m) for m in layers):
        return False
    first = layers[0].weight
    return all(
        m.weight.shape[1] == first.shape[1]
        and m.weight.dtype == first.dtype
        and m.weight.device == first.device
        and m.weight.is_contiguous()
        and (m.bias is None) == (layers[0].bias is None)
        for m in layers
    )


class ProjectionGroup:
    """Sibling linear layers computed together (see the module docstring); ``forwards()`` gives the swaps."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        self.layers = layers
        self._x: torch.Tensor | None = None
        self._version = -1
        self._outs: list[torch.Tensor | None] = []

    def clear(self) -> None:
        """Drop the products waiting for their members (at the scope's exit)."""
        self._x, self._outs = None, []

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member ``index``'s product of ``x``: from the group's last launch when it was made from this very
        input, else a new launch for the group (or the member's own ``F.linear`` where the kernel does not fit)."""
        from specdec.kernels.grouped_linear import grouped_linear

        if self._x is x and _version(x) == self._version and self._outs[index] is not None:
            out, self._outs[index] = self._outs[index], None
            if all(o is None for o in self._outs):
                self.clear()
            return out
        layer = self.layers[index]
        weights = [m.weight for m in self.layers]
        if not _kernels_take(x, weights):
            return F.linear(x, layer.weight, layer.bias)
        biases = None if layer.bias is None else [m.bias for m in self.layers]
        outs: list[torch.Tensor | None] = list(grouped_linear(x, weights, biases, impl="triton"))
        out, outs[index] = outs[index], None
        self._x, self._version, self._outs = x, _version(x), outs
        return out

    def forwards(self) -> list[tuple[nn.Module, types.MethodType]]:
        """``(layer, forward)`` pairs for ``swapped_forwards``."""
        return [(m, types.MethodType(lambda _m, x, _i=i: self.forward(_i, x), m)) for i, m in enumerate(self.layers)]


def _version(x: torch.Tensor) -> int:
    """``x``'s in-place update counter; -1 for an inference tensor, which keeps none (matched by identity alone)."""
    return -1 if x.is_inference() else x._version


def _kernels_take(x: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    """Whether the Triton kernels take ``x`` by ``weights`` (``pick_impl``'s ``auto``: on CUDA or under Triton's
    interpreter, where they import and the call fits), with every weight on ``x``'s device now (a layer offloaded
    by accelerate holds its weights elsewhere until its own hook moves them: it computes its own product)."""
    from specdec.kernels import grouped_linear as package
    from specdec.kernels._triton import pick_impl

    if not all(w.device == x.device for w in weights):
        return False
    return pick_impl("auto", x.device, package._MODULE, fits=package.fits_triton(x, weights)) == "triton"


def projection_groups(*models) -> list[ProjectionGroup]:
    """The projection groups of ``models`` (None skipped), each layer in at most one group."""
    groups: list[ProjectionGroup] = []
    seen: set[int] = set()
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            for names in GROUPS:
                layers = [getattr(module, name, None) for name in names]
                if any(m is None for m in layers) or any(id(m) in seen for m in layers) or not _groupable(layers):
                    continue
                seen.update(id(m) for m in layers)
                groups.append(ProjectionGroup(layers))
    return groups


def gated_mlp_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` of a gated MLP whose gate and up projections form a group (``routed`` picks those): its gate,
    up and activation in one ``gated_linear`` where the kernel takes the call (the down projection is the module's
    own); else ``specdec.kernels.silu_mul.mlp_forward``."""
    from specdec.kernels.grouped_linear import gated_linear
    from specdec.kernels.silu_mul import mlp_forward

    gate, up = module.gate_proj, module.up_proj
    if _kernels_take(x, [gate.weight, up.weight]):
        return module.down_proj(gated_linear(x, gate.weight, up.weight, gate.bias, up.bias, impl="triton"))
    return mlp_forward(module, x)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of a drafter's gated MLP whose gate and up weights are stacked in one ``[2 I, K]`` tensor
    (``weight``; ``bias`` ``[2 I]`` or None): one ``gated_linear`` launch over the two halves where uncompiled
    forwards route their groups (``projection_kernel_for``) and the kernel takes the call, else one product and
    ``silu_mul`` (two launches on CUDA; the tensor ops elsewhere), as before."""
    from specdec.kernels.grouped_linear import gated_linear
    from specdec.kernels.silu_mul import silu_mul

    half = weight.shape[0] // 2
    gate_w, up_w = weight[:half], weight[half:]
    if not torch.compiler.is_compiling() and projection_kernel_for(x.device) and _kernels_take(x, [gate_w, up_w]):
        gate_b, up_b = (None, None) if bias is None else (bias[:half], bias[half:])
        return gated_linear(x, gate_w, up_w, gate_b, up_b, impl="triton")
    gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)
    return silu_mul(gate, up)


def _gated_pair(module: nn.Module) -> bool:
    """Whether a gated MLP's gate and up projections can run as one ``gated_linear`` (one shape, a group)."""
    gate, up = module.gate_proj, module.up_proj
    return _groupable([gate, up]) and gate.weight.shape == up.weight.shape


class routed:  # noqa: N801 - a context manager, named as the other routings' ``routed``
    """Route ``groups`` and the gated ``mlps`` while active (an MLP whose gate and up cannot form a group keeps
    ``silu_mul``'s routing); waiting products are dropped on exit."""

    def __init__(self, groups: list[ProjectionGroup], mlps: list[nn.Module] = ()) -> None:
        from specdec.kernels.silu_mul import mlp_forward

        self.groups = groups
        pairs = [pair for g in groups for pair in g.forwards()]
        pairs += [(m, types.MethodType(gated_mlp_forward if _gated_pair(m) else mlp_forward, m)) for m in mlps]
        self._swap = swapped_forwards(pairs)

    def __enter__(self) -> routed:
        self._swap.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for g in self.groups:
            g.clear()
        self._swap.__exit__(*exc)
