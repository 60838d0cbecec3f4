"""``tree_traversal``: a round of traversal verification in two Triton launches.

One entry point, ``traversal_round``, what ``specdec.verify.traversal.traversal_verify`` calls: from the tree,
``p``, ``q`` and each slot's two uniforms, the accepted path and its tokens. The reference (the specification and
the CPU path, ``reference.py``) is tensor ops: a post-order built with one stable sort per depth, then one step of
~25 ops per slot on the whole batch (about 2000 launches a round at 32 slots on CUDA). The Triton version
(``triton.py``) is a setup launch with a program per (row, node) (each node's ``Q_a(x_a)`` and, without
replacement, its q's mass without the earlier siblings' tokens) and a walk with a program per sequence, which holds
the per-node state in registers and passes over the vocabulary only to correct a rejected node's parent and to draw
the bonus. Both read nothing on the host, so they can be captured in a CUDA graph. The path and its length equal the
reference's, the bonus too, up to the order of the sums over the vocabulary. See ``docs/kernels.md``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import check_draft_q, check_uniforms, describe, pick_impl
from specdec.kernels.tree_traversal.reference import (
    ancestors,
    postorder,
    sibling_proposals,
    traversal_round_reference,
)

__all__ = ["MAX_SLOTS", "ancestors", "postorder", "sibling_proposals", "traversal_round",
           "traversal_round_reference"]  # fmt: skip

_MODULE = "specdec.kernels.tree_traversal.triton"

MAX_SLOTS = 1024
"""The most slots the Triton walk holds in registers (more: the reference)."""

Impl = Literal["auto", "torch", "triton"]


def traversal_round(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    test: torch.Tensor,
    final: torch.Tensor,
    max_depth: int,
    replacement: bool,
    *,
    q_by_depth: bool = False,
    impl: Impl = "auto",
):
    """A round of traversal verification (:func:`traversal_round_reference`, arguments as there: ``test`` and
    ``final`` both ``[B, S]`` float64 or both their ``[B, S, 2]`` float32 halves, made into the float64 uniforms
    inside the Triton round; any strides).

    Args:
        q_by_depth (bool): ``q`` is ``[B, D, V]``, one row per depth (a DFlash-style drafter's per-depth q): node
            ``a`` was drawn from row ``clamp(depth_a - 1, 0, D - 1)``. The Triton round reads that row in place; the
            reference gathers the ``[B, S, V]`` rows first.
        impl (str): ``"triton"`` (two launches: CUDA or Triton's interpreter), ``"torch"`` (the reference) or
            ``"auto"``: Triton where it runs and ``S <= MAX_SLOTS``, else the reference.

    Returns:
        Accept: ``path`` / ``tokens [B, max_depth + 1]`` and ``num_path [B]``, int64.
    """
    _check_args(tokens, parents, depth, valid, p, q, test, final, max_depth, replacement, q_by_depth)
    fits = p.shape[1] <= MAX_SLOTS
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' walks at most {MAX_SLOTS} slots, got {p.shape[1]}; use impl='torch'.")
    if pick_impl(impl, p.device, _MODULE, fits=fits) == "torch":
        if q_by_depth:
            from specdec.verify.draws import rows_by_depth

            q = rows_by_depth(q, depth)
        return traversal_round_reference(tokens, parents, depth, valid, p, q, test, final, max_depth, replacement)
    from specdec.kernels.tree_traversal.triton import traversal_round_triton

    return traversal_round_triton(tokens, parents, depth, valid, p, q, test, final, max_depth, replacement,
                                  q_by_depth=q_by_depth)  # fmt: skip


def _check_args(tokens, parents, depth, valid, p, q, test, final, max_depth, replacement, q_by_depth) -> None:
    floats = (torch.float32, torch.float64)
    if not isinstance(p, torch.Tensor) or p.dim() != 3 or p.dtype not in floats or 0 in p.shape:
        raise ValueError(f"p must be a non-empty [B, S, V] float32 or float64 tensor; got {describe(p)}.")
    check_draft_q(q, p, q_by_depth)
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth={max_depth!r}: pass a Python int >= 0 (the deepest node's depth).")
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement={replacement!r}: pass a Python bool.")
    fields = {"tokens": (tokens, torch.long), "parents": (parents, torch.long), "depth": (depth, torch.long),
              "valid": (valid, torch.bool)}  # fmt: skip
    for name, (tensor, dtype) in fields.items():
        if not isinstance(tensor, torch.Tensor) or tensor.shape != p.shape[:2] or tensor.dtype != dtype:
            raise ValueError(f"{name} must be {list(p.shape[:2])} {dtype}; got {describe(tensor)}.")
    check_uniforms("test", test, *p.shape[:2])
    check_uniforms("final", final, *p.shape[:2], pair=test.dim() == 3)
    for name, tensor in {"q": q, "test": test, "final": final, **{n: t for n, (t, _) in fields.items()}}.items():
        if tensor.device != p.device:
            raise ValueError(f"{name} is on {tensor.device}, p on {p.device}: pass one device.")
