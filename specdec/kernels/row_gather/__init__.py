"""``row_gather``: rows of a table picked by an index tensor in one launch (``table[index]``), and the routing of
plain embedding lookups through it while the round runs its uncompiled forwards.

The round looks rows up three times per forward of a tree: the target's token embedding, the DFlash drafter's
block embedding (the target's module) and the rotary tables by position (``specdec.state.rope``). ``index_select``'s
CUDA kernel for a short index walks the index entries one after another in each thread, so a lookup of 16-32 rows
costs several times a lookup of one. The Triton version (``triton.py``) reads every index at once, one program per
row block; the reference (``reference.py``) is ``index_select``. Both copy the rows as they are: the outputs are
equal bit for bit.

Which embedding modules are routed: an ``nn.Embedding`` whose forward is a plain lookup of its weight
(:func:`plain_table`: no ``max_norm``, no forward set on the instance, no hooks); a scaled embedding (Gemma's) or a
hooked one keeps its own forward.

``Backends.row_gather`` (``SPECDEC_ROW_GATHER``): ``auto`` (Triton on CUDA outside ``torch.compile`` and autograd,
and the modules routed there), ``triton`` (routed everywhere: the kernel runs where Triton does, the reference
elsewhere) or ``torch`` (never).
"""

from __future__ import annotations

import types
from typing import Literal

import torch
from torch import nn

from specdec.backends import env_default
from specdec.distributed import is_dtensor
from specdec.kernels._triton import pick_impl
from specdec.kernels.row_gather.reference import row_gather_reference
from specdec.state.forwards import swapped_forwards

__all__ = ["IMPL", "embed", "embedding_forward", "embedding_modules", "fits_triton", "gather_kernel_for",
           "plain_table", "routed", "row_gather", "row_gather_reference"]  # fmt: skip

_MODULE = "specdec.kernels.row_gather.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.row_gather`` (``SPECDEC_ROW_GATHER``): what a call without ``impl`` uses, and whether scopes route
IMPL = env_default("row_gather")

_INDEX_DTYPES = (torch.int32, torch.int64)


def fits_triton(table: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the Triton version takes the call: a table of at least one dim whose rows are contiguous, an int32 /
    int64 index on its device, no autograd history to keep."""
    return (
        table.dim() >= 1
        and index.dtype in _INDEX_DTYPES
        and index.device == table.device
        and (table.dim() == 1 or table[:1].is_contiguous() or table.shape[0] == 0)
        and (table.dim() > 1 or table.stride(0) == 1)
        and not (torch.is_grad_enabled() and table.requires_grad)
    )


def row_gather(table: torch.Tensor, index: torch.Tensor, *, impl: Impl | None = None) -> torch.Tensor:
    """``table[index]``: ``[*index.shape, *table.shape[1:]]`` (:func:`row_gather_reference`).

    Args:
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold;
            indices outside ``[0, N)`` give rows of zeros), ``"torch"`` (the reference) or ``"auto"``: Triton where
            it runs and the call fits, outside ``torch.compile``; None: ``Backends.row_gather``.
    """
    impl = IMPL if impl is None else impl
    if impl == "auto" and torch.compiler.is_compiling():  # the compiler lowers the lookup itself
        impl = "torch"
    fits = fits_triton(table, index)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes a table with contiguous rows and an int32 / int64 index on its device "
                         f"(no autograd); got {table.dtype} {list(table.shape)} on {table.device} and {index.dtype} "
                         f"on {index.device}: use impl='torch'.")  # fmt: skip
    if pick_impl(impl, table.device, _MODULE, fits=fits) == "torch":
        return row_gather_reference(table, index)
    from specdec.kernels.row_gather.triton import row_gather_triton

    return row_gather_triton(table, index)


def gather_kernel_for(device: torch.device | str) -> bool:
    """Whether uncompiled forwards on ``device`` route their plain embedding lookups through
    :func:`embedding_forward`."""
    if IMPL != "auto":
        return IMPL == "triton"
    return pick_impl("auto", torch.device(device), _MODULE) == "triton"


def _hooked(module: nn.Module) -> bool:
    hooks = torch.nn.modules.module
    return bool(module._forward_hooks or module._forward_pre_hooks or hooks._global_forward_hooks
                or hooks._global_forward_pre_hooks)  # fmt: skip


def plain_table(module) -> torch.Tensor | None:
    """The weight of ``module`` when its forward is a plain lookup of it (an ``nn.Embedding`` without
    ``max_norm``, no hooks, a whole weight (not a tensor-parallel shard), and no forward set on the instance other
    than :func:`embedding_forward`: a row gather, bit for bit), else None (a scaled embedding, a hooked one)."""
    if type(module) is not nn.Embedding or module.max_norm is not None or _hooked(module) or is_dtensor(module.weight):
        return None
    own = module.__dict__.get("forward")
    if own is not None and getattr(own, "__func__", None) is not embedding_forward:
        return None
    return module.weight


def embedding_modules(*models) -> list[nn.Module]:
    """The plain embedding modules (:func:`plain_table`) of ``models`` (None skipped), each once."""
    seen: dict[int, nn.Module] = {}
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            if plain_table(module) is not None:
                seen[id(module)] = module
    return list(seen.values())


def embedding_forward(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``module(ids)`` as one :func:`row_gather` of its weight."""
    return row_gather(module.weight, ids)


def embed(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``module(ids)``: one :func:`row_gather` where the module is a plain lookup (:func:`plain_table`) and the
    lookup is routed on this device (:func:`gather_kernel_for`, outside ``torch.compile``), else its own forward."""
    table = plain_table(module)
    if table is None or torch.compiler.is_compiling() or not gather_kernel_for(table.device):
        return module(ids)
    return row_gather(table, ids)


def routed(modules: list[nn.Module]):
    """A context manager that routes ``modules`` through :func:`embedding_forward` while active."""
    return swapped_forwards((m, types.MethodType(embedding_forward, m)) for m in modules)
