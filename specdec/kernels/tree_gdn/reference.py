"""Gated delta-rule recurrence over a draft tree in plain PyTorch: the specification, the CPU path and the
benchmark baseline of ``tree_gdn``.

Per value head, with ``S_{-1}`` the committed state and ``p = parents[i]``:
``S_i = exp(g_i) S_p``; ``S_i <- S_i + k_i (beta_i (v_i - S_i^T k_i))^T``; ``o_i = S_i^T q_i``.
The scan is level-synchronous: all nodes of one depth are updated in one batched step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.kernels._tree import check_parents, nodes_by_depth

__all__ = ["gdn_path_replay_reference", "gdn_step", "gdn_update", "level_scan", "tree_gdn_reference"]

Step = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def gdn_step(
    state: torch.Tensor, key: torch.Tensor, value: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """One gated delta-rule update for a batch of nodes (the state only; the commit's replay uses it).

    Args:
        state (torch.Tensor): ``[n, HV, K, V]`` fp32 parent states.
        key, value, log_decay, beta: ``[n, HV, K]``, ``[n, HV, V]``, ``[n, HV]``, ``[n, HV]`` (fp32).

    Returns:
        ``[n, HV, K, V]`` the nodes' states.
    """
    state = state * log_decay.exp()[..., None, None]
    recalled = (state * key[..., None]).sum(-2)  # [n, HV, V]
    delta = (value - recalled) * beta[..., None]
    return state + key[..., None] * delta[..., None, :]


def gdn_update(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gdn_step`` plus the readout, for a batch of nodes (fp32).

    Args:
        state (torch.Tensor): ``[n, HV, K, V]`` parent states.
        q, k (torch.Tensor): ``[n, HV, K]``.
        v (torch.Tensor): ``[n, HV, V]``.
        log_decay, beta (torch.Tensor): ``[n, HV]``.

    Returns:
        ``(states [n, HV, K, V], outputs [n, HV, V])``.
    """
    state = gdn_step(state, k, v, log_decay, beta)
    return state, (state * q[..., None]).sum(-2)


def level_scan(
    init_state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    step: Step = gdn_update,
) -> torch.Tensor:
    """``tree_gdn_reference`` with the per-depth ``step`` as an argument (the benchmark compiles it).

    Row 0 of the state buffer is ``init_state``, row ``i + 1`` the state of node i, so a parent of -1 reads the
    committed state. States of all nodes are kept (``N + 1`` states): this is the readable form, not the lean one.
    """
    n, hv = q.shape[:2]
    k = _expand_heads(k, hv).float()
    parent_list = check_parents(parents, n)

    states = init_state.new_empty((n + 1, *init_state.shape), dtype=torch.float32)
    states[0] = init_state
    out = q.new_empty((n, hv, v.shape[-1]), dtype=torch.float32)
    for nodes in nodes_by_depth(parent_list):
        rows = torch.tensor(nodes, dtype=torch.long, device=q.device)
        parent_rows = torch.tensor([parent_list[i] + 1 for i in nodes], dtype=torch.long, device=q.device)
        new, o = step(
            states.index_select(0, parent_rows),
            q.index_select(0, rows).float(),
            k.index_select(0, rows),
            v.index_select(0, rows).float(),
            log_decay.index_select(0, rows).float(),
            beta.index_select(0, rows).float(),
        )
        states.index_copy_(0, rows + 1, new)
        out.index_copy_(0, rows, o)
    return out


def tree_gdn_reference(
    init_state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
) -> torch.Tensor:
    """Gated delta-rule outputs of every node of a tree, each from its own root-to-node path.

    Args:
        init_state (torch.Tensor): ``[HV, K, V]`` fp32 committed state (the state above the root).
        q (torch.Tensor): ``[N, HV, K]`` fp32 queries, L2-normalised and scaled.
        k (torch.Tensor): ``[N, H, K]`` fp32 L2-normalised keys, ``HV % H == 0``; value head h reads key head
            ``h // (HV // H)`` (``H == HV`` is the plain layout).
        v (torch.Tensor): ``[N, HV, V]`` values, any float dtype (widened to fp32).
        log_decay (torch.Tensor): ``[N, HV]`` fp32 ``g`` (the state decays by ``exp(g)``).
        beta (torch.Tensor): ``[N, HV]`` fp32 write strength.
        parents (torch.Tensor): ``[N]`` int64, ``parents[i] < i``; -1 means the parent state is ``init_state``.

    Returns:
        ``[N, HV, V]`` fp32 outputs ``o_i = S_i^T q_i``. ``init_state`` is not modified.
    """
    return level_scan(init_state, q, k, v, log_decay, beta, parents)


def _expand_heads(k: torch.Tensor, hv: int) -> torch.Tensor:
    return k if k.shape[1] == hv else k.repeat_interleave(hv // k.shape[1], dim=1)


def gdn_path_replay_reference(
    state: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    path: torch.Tensor,
    num_path: torch.Tensor,
) -> None:
    """Advance ``state`` in place by the nodes ``path[:num_path]``, in order: ``P`` masked steps, no host read.

    Args:
        state (torch.Tensor): ``[HV, K, V]`` fp32, updated in place.
        k, v, log_decay, beta: the nodes' inputs as in :func:`tree_gdn_reference` (``k [N, H, K]``).
        path (torch.Tensor): ``[P]`` int64 node indices; entries past ``num_path`` are ignored.
        num_path (torch.Tensor): 0-d int64, the number of real entries of ``path``.
    """
    k = _expand_heads(k, state.shape[0])
    current = state[None]
    for step in range(path.shape[0]):
        node = path[step : step + 1]
        nxt = gdn_step(
            current,
            k.index_select(0, node).float(),
            v.index_select(0, node).float(),
            log_decay.index_select(0, node).float(),
            beta.index_select(0, node).float(),
        )
        current = torch.where(num_path > step, nxt, current)
    state.copy_(current[0])
