"""``path_trie`` reference: sampled paths merged into a trie as plain tensor ops.

``path_trie_reference`` is the specification of the Triton kernel in ``triton.py`` and what runs off CUDA: about
twenty batched tensor ops (a pairwise prefix comparison of the paths, a cumulative sum for the node numbers,
scatters into the slots). Like the kernel it reads nothing on the host, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

__all__ = ["path_trie_reference"]


def path_trie_reference(paths: torch.Tensor, root: torch.Tensor, num_slots: int, *,
                        lengths: torch.Tensor | None = None, budget: int | None = None):  # fmt: skip
    """Paths ``[B, M, L]`` (int64) merged into one trie per row.

    A node is a prefix ``paths[b, m, :l + 1]`` of a path's real tokens; it is new on path ``m`` unless an earlier
    path with at least ``l + 1`` real tokens shares that prefix. New nodes are numbered path by path, depth by depth
    from 1 (so every prefix of the numbering is closed under parents) and the first ``budget`` sit in the slot of
    their number; slot 0 is the root (``root [B]``). Slots past the last node are padding: the root's token,
    parent -1, depth 0, not valid.

    Args:
        num_slots (int): ``S >= M * L + 1``, or ``>= budget + 1`` with a ``budget``.
        lengths (torch.Tensor | None): ``[B, M]`` int64, the real tokens of each path (None: all ``L``).
        budget (int | None): the non-root nodes kept (None: every node).

    Returns:
        tuple: ``tokens``, ``parents``, ``depth`` ``[B, S]`` int64, ``valid [B, S]`` bool, ``num_nodes [B]`` int64
        (the nodes with the root), the fields of a ``DeviceTree``.
    """
    batch, num, length = paths.shape
    device = paths.device
    equal = (paths[:, :, None] == paths[:, None]).long().cumprod(-1).bool()  # [B, M, M', L]: prefixes agree
    real = None if lengths is None else torch.arange(length, device=device) < lengths[..., None]  # [B, M, L]
    if real is not None:  # only prefixes both paths hold count
        equal = equal & real[:, :, None] & real[:, None]
    first = equal.long().argmax(2)  # [B, M, L]: the first path holding the same prefix
    new = first == torch.arange(num, device=device)[:, None]
    if real is not None:
        new = new & real
    order = new.flatten(1).long().cumsum(1).view(batch, num, length)  # 1-based node number of each new node
    node = order.gather(1, first)
    keep = new if budget is None else new & (order <= budget)
    parent = torch.cat([torch.zeros_like(node[..., :1]), node[..., :-1]], -1)
    depth = torch.arange(1, length + 1, device=device).expand(batch, num, -1)
    spot = torch.where(keep, order, num_slots).flatten(1)  # the rest go to a spill slot
    size = num_slots + 1
    rows = root.reshape(-1, 1).long().expand(batch, size).clone()
    tokens = rows.scatter(1, spot, paths.flatten(1))
    parents = torch.full((batch, size), -1, dtype=torch.long, device=device).scatter(1, spot, parent.flatten(1))
    depths = torch.zeros(batch, size, dtype=torch.long, device=device).scatter(1, spot, depth.flatten(1))
    count = keep.flatten(1).sum(1, keepdim=True) + 1
    valid = torch.arange(num_slots, device=device) < count
    tokens = torch.where(valid, tokens[:, :num_slots], rows[:, :num_slots])
    return (tokens, torch.where(valid, parents[:, :num_slots], -1), depths[:, :num_slots] * valid, valid,
            count[:, 0])  # fmt: skip
