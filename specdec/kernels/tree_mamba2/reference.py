"""SSD (Mamba2) recurrence over a draft tree in plain PyTorch: the specification, the CPU path and the benchmark
baseline of ``tree_mamba2``.

Per head, with ``h_{-1}`` the committed state and ``p = parents[i]``:
``h_i = exp(dt_i A) h_p + dt_i x_i B_i^T``; ``y_i = h_i C_i + D x_i``.
The scan is level-synchronous: all nodes of one depth are updated in one batched step, and only the states of
nodes that have children are kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.kernels._tree import check_parents, nodes_by_depth

__all__ = ["level_scan", "mamba2_step", "mamba2_update", "tree_mamba2_reference"]

Step = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def mamba2_step(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, A: torch.Tensor
) -> torch.Tensor:
    """One SSD update for a batch of nodes (the state only; the commit's replay uses it).

    Args:
        state (torch.Tensor): ``[n, H, P, S]`` fp32 parent states.
        x, dt, B: ``[n, H, P]``, ``[n, H]``, ``[n, H, S]`` (fp32); A ``[H]``.

    Returns:
        ``[n, H, P, S]`` the nodes' states.
    """
    decay = torch.exp(dt * A)  # [n, H]
    return state * decay[..., None, None] + (dt[..., None] * B)[:, :, None, :] * x[..., None]


def mamba2_update(
    state: torch.Tensor,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mamba2_step`` plus the readout and skip, for a batch of nodes (fp32).

    Args:
        state (torch.Tensor): ``[n, H, P, S]`` parent states.
        x (torch.Tensor): ``[n, H, P]``.
        B, C (torch.Tensor): ``[n, H, S]`` (already expanded from groups to heads).
        dt (torch.Tensor): ``[n, H]``.
        A, D (torch.Tensor): ``[H]``.

    Returns:
        ``(states [n, H, P, S], outputs [n, H, P])``.
    """
    state = mamba2_step(state, x, dt, B, A)
    return state, (state * C[:, :, None, :]).sum(-1) + D[:, None] * x


def level_scan(
    init_state: torch.Tensor,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
    step: Step = mamba2_update,
) -> torch.Tensor:
    """``tree_mamba2_reference`` with the per-depth ``step`` as an argument (the benchmark compiles it).

    Slot 0 of the scratch is ``init_state``; every node with a child gets a slot of its own, so a parent of -1
    reads the committed state.
    """
    n, h = x.shape[:2]
    rep = h // B.shape[1]  # head h reads group h // rep
    B = B.float().repeat_interleave(rep, dim=1)
    C = C.float().repeat_interleave(rep, dim=1)
    x, dt, A, D = x.float(), dt.float(), A.float(), D.float()
    levels, num_slots = _schedule(check_parents(parents, n), x.device)

    scratch = init_state.new_empty((num_slots, *init_state.shape), dtype=torch.float32)
    scratch[0] = init_state
    out = x.new_empty(x.shape)
    for nodes, parent_slots, keep_rows, keep_slots in levels:
        states, y = step(
            scratch.index_select(0, parent_slots),
            x.index_select(0, nodes),
            B.index_select(0, nodes),
            C.index_select(0, nodes),
            dt.index_select(0, nodes),
            A,
            D,
        )
        out.index_copy_(0, nodes, y)
        if keep_rows is not None:
            scratch.index_copy_(0, keep_slots, states.index_select(0, keep_rows))
    return out


def tree_mamba2_reference(
    init_state: torch.Tensor,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
) -> torch.Tensor:
    """SSD outputs of every node of a tree, each from its own root-to-node path.

    Args:
        init_state (torch.Tensor): ``[H, P, S]`` fp32 committed state (the state above the root).
        x (torch.Tensor): ``[N, H, P]`` post-conv inputs per head, any float dtype (widened to fp32).
        B (torch.Tensor): ``[N, G, S]`` post-conv input matrices per group, ``H % G == 0``; head h reads group
            ``h // (H // G)``. Any float dtype.
        C (torch.Tensor): ``[N, G, S]`` post-conv output matrices per group, like ``B``.
        dt (torch.Tensor): ``[N, H]`` fp32 step sizes (after softplus, ``dt_bias`` and the clamp).
        A (torch.Tensor): ``[H]`` fp32 ``-exp(A_log)``.
        D (torch.Tensor): ``[H]`` skip weights.
        parents (torch.Tensor): ``[N]`` int64, ``parents[i] < i``; -1 means the parent state is ``init_state``.

    Returns:
        ``[N, H, P]`` fp32 outputs ``y_i = h_i C_i + D x_i`` (before the gated norm). ``init_state`` is not
        modified.
    """
    return level_scan(init_state, x, B, C, dt, A, D, parents)


def _schedule(parents: list[int], device: torch.device) -> tuple[list[tuple], int]:
    """Per depth: ``(nodes, parent slots, rows of nodes with children or None, their slots)``; number of slots."""
    n = len(parents)
    has_child = [False] * n
    for p in parents:
        if p >= 0:
            has_child[p] = True
    slot, num_slots = [0] * n, 1
    for i in range(n):
        if has_child[i]:
            slot[i], num_slots = num_slots, num_slots + 1

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    levels = []
    for nodes in nodes_by_depth(parents):
        rows = [r for r, i in enumerate(nodes) if has_child[i]]
        parent_slots = t([slot[parents[i]] if parents[i] >= 0 else 0 for i in nodes])
        keep = (t(rows), t([slot[nodes[r]] for r in rows])) if rows else (None, None)
        levels.append((t(nodes), parent_slots, *keep))
    return levels, num_slots
