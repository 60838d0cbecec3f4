"""``tree_mamba2``: the SSD (Mamba2) recurrence over a draft tree, one layer, all nodes.

See ``docs/kernels.md`` for the maths, the kernel design and its tests.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from specdec.backends import env_default
from specdec.kernels._triton import importable
from specdec.kernels.tree_mamba2.reference import tree_mamba2_reference

__all__ = ["auto_impl", "tree_mamba2", "tree_mamba2_reference", "tree_mamba2_rows"]

Impl = Literal["auto", "triton", "torch"]


def tree_mamba2(
    init_state: torch.Tensor,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """SSD outputs ``[N, H, P]`` (fp32, before the gated norm) of every tree node, each from its root-to-node path.

    Arguments as ``tree_mamba2_reference`` (``init_state [H, P, S]``, ``x [N, H, P]``, ``B`` and ``C [N, G, S]``
    with ``H % G == 0``, ``dt [N, H]``, ``A`` and ``D [H]``, ``parents [N]`` with ``parents[i] < i``).

    Args:
        impl: ``"triton"`` (one fused launch), ``"torch"`` (level-synchronous PyTorch) or ``"auto"``: Triton
            when the tensors are on a CUDA device and Triton imports (``SPECDEC_TREE_MAMBA2=torch`` forces the
            reference there), else the reference.
    """
    _check_inputs(init_state, x, B, C, dt, A, D, parents)
    rows = (init_state[None], x[None], B[None], C[None], dt[None])
    return tree_mamba2_rows(*rows, A, D, parents[None], impl=impl)[0]  # a batch of one sequence


def tree_mamba2_rows(
    init_state: torch.Tensor,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """:func:`tree_mamba2` for a batch of sequences, each with its own tree and state: ``init_state [R, H, P, S]``,
    ``x [R, N, H, P]``, ``B`` and ``C [R, N, G, S]``, ``dt [R, N, H]``, ``A`` and ``D [H]`` (shared), ``parents
    [R, N]``; returns ``[R, N, H, P]`` (fp32). Triton runs the batch in one launch (the sequences' heads side by
    side, each program reading its own sequence's parent array); the reference runs them one by one."""
    if x.dim() != 4 or parents.dim() != 2 or init_state.dim() != 4:
        raise ValueError(
            f"tree_mamba2_rows takes init_state [R, H, P, S], x [R, N, H, P] and parents [R, N]; got "
            f"{list(init_state.shape)}, {list(x.shape)}, {list(parents.shape)}."
        )
    rows, n, heads = x.shape[:3]
    _check_inputs(init_state[0], x[0], B[0], C[0], dt[0], A, D, parents[0])  # every row has these shapes
    if impl == "auto":
        impl = auto_impl(x.device)
    if impl == "torch":
        return torch.stack([tree_mamba2_reference(s, xx, b, c, d, A, D, p)
                            for s, xx, b, c, d, p in zip(init_state, x, B, C, dt, parents, strict=True)])  # fmt: skip
    if impl != "triton":
        raise ValueError(f"impl={impl!r}: choose 'auto', 'triton' or 'torch'.")
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("impl='triton' needs tensors on a GPU (or Triton's interpreter); use impl='torch'.")
    from specdec.kernels.tree_mamba2.triton import tree_mamba2_triton

    def side_by_side(t: torch.Tensor) -> torch.Tensor:  # [R, N, heads, ...] -> [N, R * heads, ...]
        return t.transpose(0, 1).reshape(n, -1, *t.shape[3:])

    out = tree_mamba2_triton(init_state.reshape(rows * heads, *init_state.shape[2:]), side_by_side(x),
                             side_by_side(B), side_by_side(C), side_by_side(dt), A.repeat(rows), D.repeat(rows),
                             parents)  # fmt: skip
    return out.view(n, rows, heads, -1).transpose(0, 1)


IMPL = env_default("tree_mamba2")  # "torch" keeps the tensor-op scan on CUDA too (specdec.backends)


def auto_impl(device: torch.device) -> str:
    """What ``impl="auto"`` runs on ``device``: Triton on CUDA when it imports and ``SPECDEC_TREE_MAMBA2`` is not
    ``reference``, else the reference (which reads the parent array on the host: not inside a captured round)."""
    forced = IMPL == "torch"
    return "triton" if not forced and device.type == "cuda" and _triton_available() else "torch"


def _triton_available() -> bool:
    return importable("specdec.kernels.tree_mamba2.triton")


def _check_inputs(init_state, x, B, C, dt, A, D, parents) -> None:
    if x.dim() != 3 or B.dim() != 3:
        raise ValueError(f"x must be [N, H, P] and B [N, G, S]; got {list(x.shape)} and {list(B.shape)}.")
    n, h, p = x.shape
    g, s = B.shape[1:]
    if B.shape[0] != n or g == 0 or h % g:
        raise ValueError(f"B must be [N={n}, G, S] with H={h} divisible by G; got {list(B.shape)}.")
    expected = {
        "init_state": (init_state, (h, p, s)),
        "C": (C, (n, g, s)),
        "dt": (dt, (n, h)),
        "A": (A, (h,)),
        "D": (D, (h,)),
        "parents": (parents, (n,)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"{name} must be {list(shape)} for x {list(x.shape)}, B {list(B.shape)}; got {list(tensor.shape)}."
            )
    if n == 0:
        raise ValueError("tree_mamba2 needs at least one node.")
    if parents.dtype.is_floating_point or parents.dtype.is_complex or parents.dtype == torch.bool:
        raise TypeError(f"parents must be an integer tensor (int64); got {parents.dtype}.")
    devices = {t.device for t in (init_state, x, B, C, dt, A, D, parents)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}.")
