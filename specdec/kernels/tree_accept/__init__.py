"""``tree_accept``: the round's tree attention mask and acceptance walk, one Triton launch each.

References (the specification and the CPU path): ``tree_mask_reference`` is the mask the round builds from
``ancestor_mask`` (pointer jumping, then a gather over the key columns); ``accept_path_reference`` is
``accept_walk`` (both in ``reference.py``). On CUDA these are ~100 small kernels per
round; the Triton versions (``triton.py``) are two launches with bitwise-equal outputs, and, like the references,
read nothing on the host, so they can be captured in a CUDA graph. See ``docs/kernels.md``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import importable, pick_impl
from specdec.kernels.tree_accept.reference import accept_path_reference, accept_walk, ancestor_mask, tree_mask_reference
from specdec.runtime import constant
from specdec.types import Accept, AcceptRow

__all__ = [
    "MAX_ACCEPT_SLOTS",
    "accept_path",
    "accept_path_reference",
    "accept_paths",
    "accept_walk",
    "ancestor_mask",
    "tree_mask",
    "tree_mask_reference",
    "tree_masks",
    "verify_inputs",
]

_MODULE = "specdec.kernels.tree_accept.triton"

Impl = Literal["auto", "torch", "triton"]

MAX_ACCEPT_SLOTS = 256
"""The most slots ``accept_path``'s Triton program holds in registers; ``impl="auto"`` uses the reference above."""


def tree_mask(
    parents: torch.Tensor,
    valid: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Additive attention mask of a tree round: node i (at key slot ``prefix + i``) sees the committed keys
    ``[0, prefix)`` if it is real, and the slots of itself and its ancestors. Arguments as
    :func:`tree_mask_reference`.

    Args:
        impl (str): ``"triton"`` (one launch: CUDA or Triton's interpreter), ``"torch"`` (the reference) or
            ``"auto"``: Triton on CUDA (or under ``TRITON_INTERPRET=1``) when it imports, else the reference.

    Returns:
        torch.Tensor: ``[1, 1, S, capacity]`` of ``dtype``, 0 where visible, ``torch.finfo(dtype).min`` elsewhere.
    """
    _check_mask_args(parents, valid, prefix, capacity, max_depth, dtype)
    return tree_masks(parents[None], valid[None], prefix.reshape(1), capacity, max_depth, dtype, impl=impl)


def tree_masks(
    parents: torch.Tensor,
    valid: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """:func:`tree_mask` for a batch of trees: ``parents``, ``valid`` ``[B, S]``, ``prefix [B]`` (each tree's node 0
    at its own key slot); returns ``[B, 1, S, capacity]`` (one launch on CUDA for the whole batch)."""
    _check_batch_mask_args("tree_masks", parents, valid, prefix, capacity, max_depth, dtype)
    if pick_impl(impl, parents.device, _MODULE) == "torch":
        return torch.cat([tree_mask_reference(p, v, x, capacity, max_depth, dtype)
                          for p, v, x in zip(parents, valid, prefix, strict=True)])  # fmt: skip
    from specdec.kernels.tree_accept.triton import tree_masks_triton

    return tree_masks_triton(parents, valid, prefix, capacity, max_depth, dtype)


def verify_inputs(
    parents: torch.Tensor,
    valid: torch.Tensor,
    depth: torch.Tensor,
    prefix: torch.Tensor,
    capacity: int,
    max_depth: int,
    dtype: torch.dtype,
    *,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a tree round's verify forward takes besides the tokens, for a batch of trees (``parents``, ``valid``,
    ``depth`` ``[B, S]``, ``prefix [B]``): :func:`tree_masks`' masks ``[B, 1, S, capacity]``, each node's position
    ``prefix + depth`` and key slot ``prefix + i`` (``[B, S]`` int64), and each sequence's read length ``prefix + S``
    (``[B]``). One launch on CUDA (the mask kernel writes the three from its first column block), else the reference
    mask and three additions."""
    _check_batch_mask_args("verify_inputs", parents, valid, prefix, capacity, max_depth, dtype)
    if depth.shape != parents.shape:
        raise ValueError(f"verify_inputs takes depth of the parents' shape {list(parents.shape)}; got "
                         f"{list(depth.shape)}.")  # fmt: skip
    _check_slots(parents[0], depth=(depth[0], torch.long))
    if pick_impl(impl, parents.device, _MODULE) == "torch":
        mask = tree_masks(parents, valid, prefix, capacity, max_depth, dtype, impl="torch")
        slots = parents.shape[1]
        index = constant(("arange", str(parents.device), slots), lambda: torch.arange(slots, device=parents.device))
        return mask, prefix[:, None] + depth, prefix[:, None] + index, prefix + slots
    from specdec.kernels.tree_accept.triton import verify_inputs_triton

    return verify_inputs_triton(parents, valid, depth, prefix, capacity, max_depth, dtype)


def accept_path(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    valid: torch.Tensor,
    choices: torch.Tensor,
    max_depth: int,
    *,
    impl: Impl = "auto",
) -> AcceptRow:
    """The accepted path of a tree round: from the root, step to the first (smallest) real child carrying the
    current node's choice, until there is none or depth ``max_depth`` is reached. Arguments as
    :func:`accept_path_reference`.

    Args:
        impl (str): ``"triton"`` (one launch, ``S <= MAX_ACCEPT_SLOTS``; CUDA or Triton's interpreter), ``"torch"``
            (the reference) or ``"auto"``: Triton on CUDA (or under ``TRITON_INTERPRET=1``) when it imports and
            ``S`` fits, else the reference.

    Returns:
        AcceptRow: ``(path [P], num_path 0-d, tokens [P])``, int64, ``P = max_depth + 1``.
    """
    _check_accept_args(tokens, parents, depth, valid, choices, max_depth)
    fits = tokens.numel() <= MAX_ACCEPT_SLOTS
    if pick_impl(impl, tokens.device, _MODULE, fits=fits) == "torch":
        return accept_path_reference(tokens, parents, depth, valid, choices, max_depth)
    if not fits:
        raise ValueError(f"impl='triton' holds at most {MAX_ACCEPT_SLOTS} slots, got {tokens.numel()}; use 'torch'.")
    from specdec.kernels.tree_accept.triton import accept_path_triton

    return accept_path_triton(tokens, parents, valid, choices, max_depth)


def accept_paths(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    valid: torch.Tensor,
    choices: torch.Tensor,
    max_depth: int,
    *,
    impl: Impl = "auto",
) -> Accept:
    """:func:`accept_path` for a batch of trees: every argument ``[B, S]`` (a row per tree); one launch on CUDA for
    the whole batch (one program per tree), the reference row by row elsewhere.

    Returns:
        Accept: ``path [B, P]``, ``num_path [B]`` and ``tokens [B, P]``, int64, ``P = max_depth + 1``.
    """
    if tokens.dim() != 2 or any(t.shape != tokens.shape for t in (parents, depth, valid, choices)):
        shapes = [list(t.shape) for t in (tokens, parents, depth, valid, choices)]
        raise ValueError(f"accept_paths takes tokens, parents, depth, valid and choices of one shape [B, S]; got "
                         f"{shapes}.")  # fmt: skip
    _check_accept_args(tokens[0], parents[0], depth[0], valid[0], choices[0], max_depth)
    fits = tokens.shape[1] <= MAX_ACCEPT_SLOTS
    if pick_impl(impl, tokens.device, _MODULE, fits=fits) == "torch":
        rows = zip(tokens, parents, depth, valid, choices, strict=True)
        return Accept.stack([accept_path_reference(*row, max_depth) for row in rows])
    if not fits:
        raise ValueError(f"impl='triton' holds at most {MAX_ACCEPT_SLOTS} slots, got {tokens.shape[1]}; use 'torch'.")
    from specdec.kernels.tree_accept.triton import accept_paths_triton

    return accept_paths_triton(tokens, parents, valid, choices, max_depth)


def _triton_available() -> bool:
    return importable(_MODULE)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: pass a Python int >= {low}.")


def _check_slots(parents: torch.Tensor, **others: tuple[torch.Tensor, torch.dtype]) -> None:
    """``parents`` is ``[S]`` int64 with ``S >= 1``; every other tensor ``[S]`` of its dtype, on the same device."""
    if parents.dim() != 1 or parents.numel() == 0 or parents.dtype != torch.long:
        raise ValueError(f"parents must be a non-empty [S] int64 tensor; got {parents.dtype} {list(parents.shape)}.")
    for name, (tensor, dtype) in others.items():
        if tensor.shape != parents.shape or tensor.dtype != dtype:
            raise ValueError(f"{name} must be [{parents.numel()}] {dtype}; got {tensor.dtype} {list(tensor.shape)}.")
        if tensor.device != parents.device:
            raise ValueError(f"{name} is on {tensor.device}, parents on {parents.device}: pass one device.")


def _check_batch_mask_args(name, parents, valid, prefix, capacity, max_depth, dtype) -> None:
    if parents.dim() != 2 or valid.shape != parents.shape or prefix.shape != parents.shape[:1]:
        raise ValueError(
            f"{name} takes parents and valid [B, S] and prefix [B]; got {list(parents.shape)}, "
            f"{list(valid.shape)}, {list(prefix.shape)}."
        )
    _check_mask_args(parents[0], valid[0], prefix[0], capacity, max_depth, dtype)  # dtypes, devices (no values)


def _check_mask_args(parents, valid, prefix, capacity, max_depth, dtype) -> None:
    _check_slots(parents, valid=(valid, torch.bool))
    if prefix.numel() != 1 or prefix.dim() > 1 or prefix.dtype != torch.long or prefix.device != parents.device:
        raise ValueError(f"prefix must be a 0-d int64 tensor on {parents.device}; got {prefix.dtype} "
                         f"{list(prefix.shape)} on {prefix.device}.")  # fmt: skip
    _check_int("capacity", capacity, 1)
    _check_int("max_depth", max_depth, 0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: pass a float torch.dtype.")


def _check_accept_args(tokens, parents, depth, valid, choices, max_depth) -> None:
    _check_slots(parents, tokens=(tokens, torch.long), depth=(depth, torch.long), valid=(valid, torch.bool),
                 choices=(choices, torch.long))  # fmt: skip
    _check_int("max_depth", max_depth, 0)
