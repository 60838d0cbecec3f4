"""``ddtree_build`` reference: the DDTree selection as tensor ops (what runs off CUDA, and what the Triton kernels
in ``triton.py`` are tested against). Maths: ``docs/trees.md``; the tree assembled from it: ``specdec.trees.build``.
"""

from __future__ import annotations

import torch

__all__ = ["key_order", "pack_ranks", "select_levels", "topk_rows_reference"]

_LOW32 = 0xFFFFFFFF


def topk_rows_reference(logq: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` fp32 values and int64 ids per row, ranked by (value desc, id asc): one ``topk`` on packed keys.

    The fp32 bits map to integers in value order (a negative float to minus its magnitude bits, so -0.0 meets
    +0.0); the high half of an int64 key holds that, the low half ``V - 1 - id``: keys are distinct and larger
    means better.
    """
    vals = logq.float()
    bits = vals.view(torch.int32).long()  # sign-extended: negative floats have negative bits
    ordered = torch.where(bits < 0, -(2**31) - bits, bits)
    ids = torch.arange(logq.shape[1], device=logq.device)
    keys = ordered * 2**32 + (logq.shape[1] - 1 - ids)
    top = keys.topk(k, dim=-1).values  # [D, k], sorted descending
    top_ids = logq.shape[1] - 1 - (top & _LOW32)
    return vals.gather(-1, top_ids), top_ids


def select_levels(vals: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per depth, the best ``budget`` children of the kept nodes above, each level stored in rank-tuple order.

    Keeping a level in rank-tuple order makes the candidate index ``parent * k + rank`` increase with the rank
    tuple, so a stable descending sort of the scores ranks the candidates by the full key.

    Returns:
        tuple: over the ``M`` kept nodes, depth 1 first: float64 scores ``[M]``, per-depth ranks ``[M, D]``
        (-1 past the node's depth) and parents ``[M]`` (index into the same arrays, -1 for the root).
    """
    depth_limit, k = vals.shape
    device = vals.device
    vals = vals.double()
    cells = torch.arange(budget * k, device=device)
    cell_parent, cell_rank = cells // k, cells % k  # candidate index -> (parent slot, rank); sliced per level
    scores = torch.zeros(1, dtype=torch.float64, device=device)  # the root
    ranks = torch.full((1, depth_limit), -1, dtype=torch.long, device=device)
    levels = []
    for d in range(depth_limit):
        cand = (scores.unsqueeze(-1) + vals[d]).flatten()  # [n_prev * k], rank-tuple order
        if cand.numel() > budget:
            sel = torch.sort(cand, descending=True, stable=True).indices[:budget].sort().values
            scores, parent, rank = cand[sel], sel // k, sel % k
        else:
            scores, parent, rank = cand, cell_parent[: cand.numel()], cell_rank[: cand.numel()]
        ranks = ranks[parent]
        ranks[:, d] = rank
        levels.append((scores, ranks, parent))
    scores, ranks, parent = (torch.cat(parts) for parts in zip(*levels, strict=True))
    depth = (ranks >= 0).sum(-1)
    above = torch.searchsorted(depth, depth - 1)  # where the level above starts
    return scores, ranks, torch.where(depth > 1, parent + above, -1)


def pack_ranks(ranks: torch.Tensor, k: int) -> torch.Tensor:
    """Ranks ``[M, D]`` in ``[-1, k)`` -> int64 keys ``[M, G]`` ordering nodes by rank tuple, prefixes first.

    Digits are ``rank + 1`` (0 past a node's depth), ``k.bit_length()`` bits each, most significant first, at
    most 63 bits per key so that keys stay non-negative.
    """
    num, depth_limit = ranks.shape
    bits = k.bit_length()
    per_key = 63 // bits
    columns = -(-depth_limit // per_key)
    digits = torch.nn.functional.pad(ranks + 1, (0, columns * per_key - depth_limit))
    shifts = torch.arange(per_key - 1, -1, -1, device=ranks.device) * bits
    return (digits.view(num, columns, per_key) << shifts).sum(-1)


def key_order(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Permutation sorting nodes by (score desc, rank tuple asc): stable sorts, least significant key first."""
    order = torch.arange(scores.numel(), device=scores.device)
    for column in reversed(range(keys.shape[1])):
        order = order[torch.sort(keys[order, column], stable=True).indices]
    return order[torch.sort(scores[order], descending=True, stable=True).indices]
