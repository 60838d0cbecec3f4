"""``tree_gdn``: the gated delta-rule (Gated DeltaNet) recurrence over a draft tree, one layer, all nodes.

See ``docs/kernels.md`` for the maths, the kernel design and measured speed.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from specdec.kernels._triton import importable
from specdec.kernels.tree_gdn.reference import gdn_path_replay_reference, tree_gdn_reference

__all__ = [
    "CHAIN_PATHS_MAX_WORK",
    "auto_impl",
    "chain_walk",
    "gdn_path_replay",
    "gdn_path_replay_reference",
    "tree_gdn",
    "tree_gdn_reference",
    "tree_gdn_rows",
]

Impl = Literal["auto", "triton", "torch"]

CHAIN_PATHS_MAX_WORK = 256
"""A chain takes the path schedule only while value heads x nodes stays within this (``chain_walk``)."""


def chain_walk(num_nodes: int, num_value_heads: int) -> str:
    """The ``walk`` for a chain of ``num_nodes`` nodes in a layer with ``num_value_heads`` value heads.

    On a chain the path schedule replays N (N + 1) / 2 steps over N programs per (value head, value block), so it
    pays only while those programs fill the GPU in about one wave: ``"paths"`` while ``num_value_heads *
    num_nodes <= CHAIN_PATHS_MAX_WORK``, else ``"nodes"``. The bound is read off the kernel bench on an H200
    (docs/kernels.md): 8 value heads, paths faster at 16 and 32 nodes, nodes at 64 and 128; 32 and 48
    value heads, nodes faster at every size from 16 nodes (2.0-15.6x).
    """
    return "paths" if num_value_heads * num_nodes <= CHAIN_PATHS_MAX_WORK else "nodes"


def tree_gdn(
    init_state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    *,
    impl: Impl = "auto",
    walk: str = "auto",
) -> torch.Tensor:
    """Gated delta-rule outputs ``[N, HV, V]`` (fp32) of every tree node, each from its root-to-node path.

    Arguments as ``tree_gdn_reference`` (``init_state [HV, K, V]``, ``q [N, HV, K]``, ``k [N, H, K]`` with
    ``HV % H == 0``, ``v [N, HV, V]``, ``log_decay`` and ``beta [N, HV]``, ``parents [N]`` with ``parents[i] < i``).

    Args:
        impl: ``"triton"`` (one fused launch), ``"torch"`` (level-synchronous PyTorch) or ``"auto"``: Triton
            when the tensors are on a CUDA device and Triton imports, else the reference.
        walk: the Triton kernel's schedule (``tree_gdn_triton``): ``"paths"`` (one program per node replays its
            path: steps in sequence = the tree's depth), ``"nodes"`` (one walk over the nodes in order: best for
            long chains), ``"chunk"`` (every node at once in matrix form, trees of up to ``CHUNK_MAX_NODES``
            nodes) or ``"auto"`` (see ``tree_gdn_triton``). The reference ignores it.
    """
    _check_walk(walk)
    _check_shapes(init_state, q, k, v, log_decay, beta, parents)
    one = (init_state, q, k, v, log_decay, beta, parents)
    return tree_gdn_rows(*(t[None] for t in one), impl=impl, walk=walk)[0]  # a batch of one sequence


def tree_gdn_rows(
    init_state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    *,
    impl: Impl = "auto",
    walk: str = "auto",
) -> torch.Tensor:
    """:func:`tree_gdn` for a batch of sequences, each with its own tree and state: ``init_state [B, HV, K, V]``,
    ``q [B, N, HV, K]``, ``k [B, N, H, K]``, ``v [B, N, HV, V]``, ``log_decay`` and ``beta [B, N, HV]``, ``parents
    [B, N]``; returns ``[B, N, HV, V]`` (fp32). Triton runs the batch in one launch: the sequences' heads side by
    side (``B * HV`` programs per value block), each program reading its own sequence's parent array; the reference
    runs the sequences one by one. ``walk="auto"`` picks the schedule for one sequence (its ``HV`` heads), so a row
    is computed, and rounded, as it would be alone, whatever the batch size."""
    if q.dim() != 4 or parents.dim() != 2 or init_state.dim() != 4:
        raise ValueError(
            f"tree_gdn_rows takes init_state [B, HV, K, V], q [B, N, HV, K] and parents [B, N]; got "
            f"{list(init_state.shape)}, {list(q.shape)}, {list(parents.shape)}."
        )
    _check_walk(walk)
    rows, n, hv = q.shape[:3]
    _check_shapes(init_state[0], q[0], k[0], v[0], log_decay[0], beta[0], parents[0])  # every row has these shapes
    if impl == "auto":
        impl = auto_impl(q.device)
    if impl == "torch":
        return torch.stack([tree_gdn_reference(*row) for row in zip(init_state, q, k, v, log_decay, beta, parents,
                                                                      strict=True)])  # fmt: skip
    if impl != "triton":
        raise ValueError(f"impl={impl!r}: choose 'auto', 'triton' or 'torch'.")
    if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("impl='triton' needs tensors on a GPU (or Triton's interpreter); use impl='torch'.")
    from specdec.kernels.tree_gdn.triton import auto_walk, default_precision, tensor_cores, tree_gdn_triton

    if walk == "auto":  # chosen for one sequence's heads: a row's schedule (and rounding) never depends on the batch
        walk = auto_walk(n, hv, v.shape[-1], precision=default_precision(v.dtype, tensor_cores(q.device)))

    def side_by_side(x: torch.Tensor) -> torch.Tensor:  # [B, N, heads, ...] -> [N, B * heads, ...]
        return x.transpose(0, 1).reshape(n, -1, *x.shape[3:])

    out = tree_gdn_triton(init_state.reshape(rows * hv, *init_state.shape[2:]), side_by_side(q), side_by_side(k),
                          side_by_side(v), side_by_side(log_decay), side_by_side(beta), parents, walk=walk)  # fmt: skip
    return out.view(n, rows, hv, -1).transpose(0, 1)


def gdn_path_replay(
    state: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    path: torch.Tensor,
    num_path: torch.Tensor,
    *,
    impl: Impl = "auto",
) -> None:
    """Advance ``state [HV, K, V]`` (fp32) in place by the accepted nodes ``path[:num_path]`` (the commit of a tree
    round), without a host read; a batch of sequences: ``state [B, HV, K, V]``, ``path [B, P]`` and ``num_path
    [B]`` (one launch on CUDA), each row advanced by its own path through the same stash. Arguments as
    ``gdn_path_replay_reference``.

    Args:
        impl: ``"triton"`` (one launch per layer: the state is read and written once), ``"torch"`` (``P``
            masked steps of tensor ops) or ``"auto"``: Triton on CUDA when it imports, else the reference.
    """
    if state.dim() not in (3, 4) or state.dtype != torch.float32:
        raise ValueError(f"state must be an fp32 [HV, K, V] (or [B, HV, K, V]) tensor; got {state.dtype} "
                         f"{list(state.shape)}.")  # fmt: skip
    rows = state.shape[:1]
    if state.dim() == 4 and (path.dim() != 2 or path.shape[:1] != rows or num_path.shape != rows):
        raise ValueError(f"a batch of states {list(state.shape)} takes path [B, P] and num_path [B]; got "
                         f"{list(path.shape)} and {list(num_path.shape)}.")  # fmt: skip
    if impl == "auto":
        impl = auto_impl(state.device)
    if impl == "torch":
        if state.dim() == 3:
            gdn_path_replay_reference(state, k, v, log_decay, beta, path, num_path)
        else:  # one sequence after another
            for row, nodes, count in zip(state, path, num_path, strict=True):
                gdn_path_replay_reference(row, k, v, log_decay, beta, nodes, count)
        return
    if impl != "triton":
        raise ValueError(f"impl={impl!r}: choose 'auto', 'triton' or 'torch'.")
    if state.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("impl='triton' needs tensors on a GPU (or Triton's interpreter); use impl='torch'.")
    from specdec.kernels.tree_gdn.triton import gdn_path_replay_triton

    gdn_path_replay_triton(state, k, v, log_decay, beta, path, num_path)


def auto_impl(device: torch.device) -> str:
    """What ``impl="auto"`` runs on ``device``: Triton on CUDA when it imports, else the reference (which reads the
    parent array on the host, so it cannot run inside a captured round). When Triton, the device's compute capability
    is read now (the schedule depends on it), so that calls traced by ``torch.compile`` later find it cached."""
    if device.type == "cuda" and _triton_available():
        from specdec.kernels.tree_gdn.triton import tensor_cores

        tensor_cores(device)
        return "triton"
    return "torch"


def _triton_available() -> bool:
    return importable("specdec.kernels.tree_gdn.triton")


def _check_walk(walk: str) -> None:
    if walk not in ("auto", "paths", "nodes", "chunk"):
        raise ValueError(f"walk={walk!r}: choose 'auto', 'paths', 'nodes' or 'chunk'.")


def _check_shapes(init_state, q, k, v, log_decay, beta, parents) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [N, heads, dim]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}.")
    n, hv, k_dim = q.shape
    v_dim = v.shape[-1]
    expected = {
        "init_state": (init_state, (hv, k_dim, v_dim)),
        "v": (v, (n, hv, v_dim)),
        "log_decay": (log_decay, (n, hv)),
        "beta": (beta, (n, hv)),
        "parents": (parents, (n,)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} for q {list(q.shape)}; got {list(tensor.shape)}.")
    if k.shape[0] != n or k.shape[2] != k_dim or k.shape[1] == 0 or hv % k.shape[1]:
        raise ValueError(f"k must be [N={n}, H, K={k_dim}] with HV={hv} divisible by H; got {list(k.shape)}.")
    if n == 0:
        raise ValueError("tree_gdn needs at least one node.")
    devices = {t.device for t in (init_state, q, k, v, log_decay, beta, parents)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}.")
