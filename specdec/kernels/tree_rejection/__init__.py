"""``tree_rejection``: a round of recursive rejection sampling in one Triton launch, and its walk in another.

One entry point, ``tree_rejection_round``, what ``specdec.verify.multidraft.recursive_rejection`` calls: from the
tree, ``p``, ``q`` and each slot's uniform, the setup (each node's children by rank, their tokens, uniforms and
draft probabilities, without replacement the earlier siblings' removed mass) then the sibling-rank loop. The
reference (the specification and the CPU path, ``reference.py``) is tensor ops: the setup, then ``K`` steps (one per
sibling rank) of ~18 ops on ``[B, S, V]`` tensors (``p``'s dtype: float32 in the round, float64 allowed). The
Triton version (``triton.py``) is one launch with a program per (row, node); like the reference it reads nothing on
the host, so it can be captured in a CUDA graph. Its ``nxt`` equals the reference's and its ``r`` up to the order of
the residual mass's sum. ``rejection_walk`` follows each node's accepted child from the root and draws the bonus
from the end node's ``r``: the reference (pointer doubling, a gather, a float64 cumulative sum, ~20 launches on
CUDA) or one Triton launch with a program per sequence, equal to it (the bonus up to the order of the float64
sums, a tie at a token's boundary being the only difference). See ``docs/kernels.md``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import check_draft_q, check_uniforms, describe, importable, pick_impl
from specdec.kernels.tree_rejection.reference import (
    children_by_rank,
    rank_width,
    rejection_walk_reference,
    round_setup,
    tree_rejection_round_reference,
)

__all__ = [
    "MAX_WALK_SLOTS",
    "children_by_rank",
    "rank_width",
    "rejection_walk",
    "rejection_walk_reference",
    "round_setup",
    "tree_rejection_round",
    "tree_rejection_round_reference",
]

_MODULE = "specdec.kernels.tree_rejection.triton"

MAX_WALK_SLOTS = 1024
"""The most slots ``rejection_walk``'s Triton program holds in registers (more: the reference)."""

Impl = Literal["auto", "torch", "triton"]


def tree_rejection_round(
    tree_tokens: torch.Tensor,
    tree_parents: torch.Tensor,
    tree_depth: torch.Tensor,
    tree_valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    test: torch.Tensor,
    max_children: int | None,
    replacement: bool,
    *,
    q_by_depth: bool = False,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A round of recursive rejection sampling: the setup and the sibling-rank loop. Arguments as
    :func:`tree_rejection_round_reference`, but ``test``: each slot's uniform, ``[B, S]`` float64, or ``[B, S, 2]``
    float32, its two halves (``noise[..., 0:2]`` of the round's uniforms: the float64 uniform ``a + b·2⁻²⁴`` kept
    below 1 is made inside, as ``specdec.verify.draws.uniforms`` makes it), any strides.

    Args:
        q_by_depth (bool): ``q`` is ``[B, D, V]``, one row per depth (a DFlash-style drafter's per-depth q, as
            ``specdec.verify.draws.node_proposals`` reads it): slot ``s`` was drawn from row
            ``clamp(depth_s - 1, 0, D - 1)``. The Triton round reads that row in place; the reference gathers the
            ``[B, S, V]`` rows first (three launches and a copy the kernel saves).
        impl (str): ``"triton"`` (one launch, the setup inside the loop's: CUDA or Triton's interpreter),
            ``"torch"`` (the reference) or ``"auto"``: Triton on CUDA (or under ``TRITON_INTERPRET=1``) when it
            imports, else the reference.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``r [B, S, V]`` (p's dtype) and ``nxt [B, S]`` int64.
    """
    _check_round_args(tree_tokens, tree_parents, tree_depth, tree_valid, p, q, test, max_children, replacement,
                      q_by_depth)  # fmt: skip
    if pick_impl(impl, p.device, _MODULE) == "torch":
        if q_by_depth:
            from specdec.verify.draws import rows_by_depth

            q = rows_by_depth(q, tree_depth)
        return tree_rejection_round_reference(tree_tokens, tree_parents, tree_depth, tree_valid, p, q, test,
                                              max_children, replacement)  # fmt: skip
    from specdec.kernels.tree_rejection.triton import tree_rejection_round_triton

    return tree_rejection_round_triton(tree_tokens, tree_parents, tree_depth, tree_valid, p, q, test, max_children,
                                       replacement, q_by_depth=q_by_depth)  # fmt: skip


def rejection_walk(
    tokens: torch.Tensor,
    depth: torch.Tensor,
    nxt: torch.Tensor,
    r: torch.Tensor,
    u: torch.Tensor,
    max_depth: int,
    *,
    impl: Impl = "auto",
):
    """The accepted path after a round (:func:`rejection_walk_reference`): from the root along ``nxt [B, S]``, the
    bonus drawn from the end node's ``r [B, S, V]`` at its uniform ``u``: ``[B, S]`` float64 or its float32 halves
    ``[B, S, 2]`` (as :func:`tree_rejection_round`'s ``test``), any strides.

    Args:
        impl (str): ``"triton"`` (one launch; CUDA or Triton's interpreter), ``"torch"`` (the reference) or
            ``"auto"``: Triton where it runs and ``S <= MAX_WALK_SLOTS``, else the reference.

    Returns:
        Accept: ``path`` / ``tokens [B, max_depth + 1]`` and ``num_path [B]``, int64.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth={max_depth!r}: pass a Python int >= 0 (the deepest node's depth).")
    batch, slots = nxt.shape
    for name, tensor, dtype in (("tokens", tokens, torch.long), ("depth", depth, torch.long), ("nxt", nxt, torch.long)):
        if not isinstance(tensor, torch.Tensor) or tensor.shape != (batch, slots) or tensor.dtype != dtype:
            raise ValueError(f"{name} must be [{batch}, {slots}] {dtype}; got {describe(tensor)}.")
    check_uniforms("u", u, batch, slots)
    if not isinstance(r, torch.Tensor) or r.shape[:2] != (batch, slots) or r.dim() != 3 or r.dtype not in (
            torch.float32, torch.float64):  # fmt: skip
        raise ValueError(f"r must be [{batch}, {slots}, V] float32 or float64; got {describe(r)}.")
    fits = slots <= MAX_WALK_SLOTS
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' walks at most {MAX_WALK_SLOTS} slots, got {slots}; use impl='torch'.")
    if pick_impl(impl, r.device, _MODULE, fits=fits) == "torch":
        return rejection_walk_reference(tokens, depth, nxt, r, u, max_depth)
    from specdec.kernels.tree_rejection.triton import rejection_walk_triton

    return rejection_walk_triton(tokens, depth, nxt, r, u, max_depth)


def _check_round_args(tree_tokens, tree_parents, tree_depth, tree_valid, p, q, test, max_children, replacement,
                      q_by_depth):  # fmt: skip
    floats = (torch.float32, torch.float64)
    if not isinstance(p, torch.Tensor) or p.dim() != 3 or p.dtype not in floats or 0 in p.shape:
        raise ValueError(f"p must be a non-empty [B, S, V] float32 or float64 tensor; got {describe(p)}.")
    check_draft_q(q, p, q_by_depth)
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement={replacement!r}: pass a Python bool.")
    if max_children is not None and (not isinstance(max_children, int) or max_children < 1):
        raise ValueError(f"max_children={max_children!r}: pass a positive int or None.")
    fields = {"tree_tokens": (tree_tokens, torch.long), "tree_parents": (tree_parents, torch.long),
              "tree_depth": (tree_depth, torch.long), "tree_valid": (tree_valid, torch.bool)}  # fmt: skip
    for name, (tensor, dtype) in fields.items():
        if not isinstance(tensor, torch.Tensor) or tensor.shape != p.shape[:2] or tensor.dtype != dtype:
            raise ValueError(f"{name} must be {list(p.shape[:2])} {dtype}; got {describe(tensor)}.")
    check_uniforms("test", test, *p.shape[:2])
    for name, tensor in {"q": q, "test": test, **{n: t for n, (t, _) in fields.items()}}.items():
        if tensor.device != p.device:
            raise ValueError(f"{name} is on {tensor.device}, p on {p.device}: pass one device.")


def _triton_available() -> bool:
    return importable(_MODULE)
