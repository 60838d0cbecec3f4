"""Tree builders from per-depth draft log-probabilities: the DDTree best-first tree and the argmax chain.

``logq [D, V]`` holds one log-distribution per depth (row d-1 = depth d), shared by every branch as a block
drafter produces it. A path's score is the sum of its per-depth log-probs; DDTree keeps the ``budget`` best
prefixes, found lazily with a heap on the CPU. Maths and notation: ``docs/trees.md`` (arXiv 2604.12989).
"""

from __future__ import annotations

import heapq

import torch

from specdec.types import DraftTree

__all__ = ["build_ddtree", "chain_from_logq", "tree_path_scores"]


def build_ddtree(logq: torch.Tensor, root_token: int, *, budget: int, topk: int | None = None) -> DraftTree:
    """Best-first draft tree: the ``budget`` root-to-node prefixes with the largest summed log-probability.

    A heap pops the best open prefix, then opens its next sibling (same parent, next rank at that depth) and
    its first child (rank 0 one depth below). Ties break by the tuple of per-depth ranks, lexicographically,
    and tokens of equal log-prob are ranked by increasing id, so the tree is a pure function of ``logq``.
    Nodes appear in pop order: scores are non-increasing and every parent precedes its children.

    Args:
        logq (torch.Tensor): ``[D, V]`` float log-probabilities (all <= 0), row d-1 for depth d; any device
            and float dtype. Only the top-``topk`` entries per row are copied to the host, as fp32.
        root_token (int): token of node 0 (the last committed token).
        budget (int): number of non-root nodes, >= 1; the tree holds ``min(budget, reachable)`` of them.
        topk (int | None): candidates per depth, >= 1; None means ``budget``. Also capped by ``V``.

    Returns:
        DraftTree: ``tokens [N]`` int64 on ``logq.device`` and ``parents [N]`` int64 on CPU, with
        ``N = 1 + min(budget, reachable)`` and depth <= D.
    """
    _check_logq(logq)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget={budget!r}: pass an int >= 1 (the number of non-root nodes).")
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
        raise ValueError(f"topk={topk!r}: pass an int >= 1, or None for topk = budget.")
    k = min(budget if topk is None else topk, budget, logq.shape[1])
    vals, ids = _topk_rows(logq, k)
    if vals[:, 0].gt(0).any():
        raise ValueError("logq holds values > 0: pass log-probabilities, e.g. torch.log_softmax(logits.float(), -1).")
    tokens, parents = _best_first(vals.tolist(), ids.tolist(), budget)
    return DraftTree(
        torch.tensor([int(root_token), *tokens], dtype=torch.long, device=logq.device),
        torch.tensor([-1, *parents], dtype=torch.long),
    )


def chain_from_logq(logq: torch.Tensor, root_token: int, *, k: int) -> DraftTree:
    """The argmax chain (the DFlash draft): the most likely token at each of the first ``min(k, D)`` depths.

    Ties pick the smallest token id, as in :func:`build_ddtree`, so ``build_ddtree(logq, r, budget=k, topk=1)``
    returns the same tree when ``k <= D``.

    Args:
        logq (torch.Tensor): ``[D, V]`` float per-depth log-probabilities (or logits), any device.
        root_token (int): token of node 0.
        k (int): number of drafted tokens, >= 1.

    Returns:
        DraftTree: ``tokens [1 + min(k, D)]`` on ``logq.device``, ``parents = [-1, 0, 1, ...]`` on CPU.
    """
    _check_logq(logq)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: pass an int >= 1 (the number of drafted tokens).")
    depth = min(k, logq.shape[0])
    _, ids = _topk_rows(logq[:depth], 1)
    tokens = torch.cat([torch.tensor([int(root_token)], dtype=torch.long), ids[:, 0]])
    return DraftTree(tokens.to(logq.device), torch.arange(-1, depth, dtype=torch.long))


def tree_path_scores(tree: DraftTree, logq: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of every node's root-to-node path (the DDTree surrogate score).

    Sums run from depth 1 down in float64 over the fp32 values of ``logq``, the same arithmetic as
    :func:`build_ddtree`, so its pop order can be checked exactly.

    Args:
        tree (DraftTree): ``N`` nodes with depth <= D.
        logq (torch.Tensor): ``[D, V]`` per-depth log-probabilities, on the device of ``tree.tokens``.

    Returns:
        torch.Tensor: ``[N]`` float64 on CPU; the root scores 0.
    """
    _check_logq(logq)
    if tree.max_depth > logq.shape[0]:
        raise ValueError(f"tree depth {tree.max_depth} exceeds logq's {logq.shape[0]} rows: pass logq [D >= depth, V].")
    rows = (tree.depth[1:] - 1).to(logq.device)
    node_logq = logq[rows, tree.tokens[1:]].float().cpu().tolist()
    parents = tree.parents.tolist()
    scores = [0.0] * tree.num_nodes
    for i in range(1, tree.num_nodes):
        scores[i] = scores[parents[i]] + node_logq[i - 1]
    return torch.tensor(scores, dtype=torch.float64)


def _check_logq(logq: torch.Tensor) -> None:
    if not isinstance(logq, torch.Tensor) or logq.dim() != 2:
        shape = tuple(logq.shape) if isinstance(logq, torch.Tensor) else type(logq).__name__
        raise ValueError(f"logq must be a 2-D [D, V] tensor (row d-1 = depth d), got {shape}; index one sequence.")
    if not logq.is_floating_point():
        raise ValueError(f"logq has dtype {logq.dtype}: pass float log-probabilities.")
    if logq.shape[0] < 1 or logq.shape[1] < 1:
        raise ValueError(f"logq has shape {tuple(logq.shape)}: it needs at least one depth and one token.")


def _topk_rows(logq: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` fp32 values ``[D, k]`` and int64 ids ``[D, k]`` per row on CPU, ranked by (value desc, id asc)."""
    num_tokens = logq.shape[1]
    fetch = min(k + 1, num_tokens)  # one extra column exposes ties at the cut-off
    vals, ids = torch.topk(logq, fetch, dim=-1)
    # A single device->host copy: the fp32 bits and the int32 ids side by side.
    packed = torch.cat([vals.float().view(torch.int32), ids.to(torch.int32)], dim=-1).cpu()
    vals, ids = packed[:, :fetch].view(torch.float32), packed[:, fetch:].long()
    if vals.isnan().any() or vals.eq(float("inf")).any():
        raise ValueError("logq contains NaN or +inf: pass finite log-probabilities (-inf is allowed).")
    if fetch > k:
        cut_tie = (vals[:, k - 1] == vals[:, k]).nonzero().flatten()
        if cut_tie.numel():
            # Which tied tokens torch.topk keeps is unspecified; a stable sort keeps the smallest ids.
            tied_vals, tied_ids = torch.sort(logq[cut_tie.to(logq.device)], dim=-1, descending=True, stable=True)
            vals[cut_tie] = tied_vals[:, :fetch].float().cpu()
            ids[cut_tie] = tied_ids[:, :fetch].cpu()
        vals, ids = vals[:, :k], ids[:, :k]
    # Canonical order inside the kept set: value descending, then id ascending (sort by id, then stable by value).
    ids, by_id = ids.sort(dim=-1)
    vals = vals.gather(-1, by_id)
    vals, by_val = vals.sort(dim=-1, descending=True, stable=True)
    return vals, ids.gather(-1, by_val)


def _best_first(vals: list[list[float]], ids: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """Pop prefixes best-first; returns the tokens and parents of the non-root nodes in pop order.

    Heap entries are ``(-score, ranks, parent, parent_score)`` with ``ranks`` the per-depth rank tuple. A
    prefix enters the heap only after its previous sibling or its parent, both of which sort before it, so the
    pops come out in exact (-score, ranks) order. Scores are recomputed as parent score + own log-prob (never
    by subtracting a sibling's), keeping them bit-identical to a plain sum along the path.
    """
    depth_limit, width = len(vals), len(vals[0])
    tokens: list[int] = []
    parents: list[int] = []
    heap = [(-vals[0][0], (0,), 0, 0.0)]
    while heap and len(tokens) < budget:
        neg_score, ranks, parent, parent_score = heapq.heappop(heap)
        depth, rank = len(ranks), ranks[-1]
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        if rank + 1 < width:
            sibling = parent_score + vals[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling, (*ranks[:-1], rank + 1), parent, parent_score))
        if depth < depth_limit:
            child = -neg_score + vals[depth][0]
            heapq.heappush(heap, (-child, (*ranks, 0), len(tokens), -neg_score))
    return tokens, parents
