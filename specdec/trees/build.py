"""Tree builders as device tensor ops: the DDTree and the argmax chain without host reads (CUDA-graph safe).

Same trees as the best-first heap (``docs/trees.md``) and the argmax chain, in a
fixed number of slots: every output shape depends only on Python ints, nothing reads a tensor on the host, so the
functions can be captured in a CUDA graph; they run unchanged on CPU. Real nodes are a prefix of the slots;
padding slots carry the root token, parent -1 and depth 0, and see only themselves in :func:`ancestor_matrix`.

DDTree without a heap (the DDTree maths: ``docs/trees.md``): a child never scores above its parent and sorts after it,
so the heap pops nodes in the global order of the key (score desc, rank tuple asc) and its ``budget`` best
nodes are closed under prefixes. Depth by depth, the candidates are the kept nodes of the depth above times the
``k`` ranks; the best ``budget`` of them by that key contain every best node of their depth. One final sort of
all kept nodes by the full key yields the heap's pop order.
"""

from __future__ import annotations

import os

import torch

from specdec.kernels.ddtree_build import _triton_available, best_first, topk_rows, triton_fits
from specdec.kernels.ddtree_build.reference import key_order, pack_ranks, select_levels, topk_rows_reference
from specdec.kernels.path_trie.reference import path_trie_reference
from specdec.kernels.tree_accept.reference import ancestor_mask
from specdec.runtime import constant
from specdec.types import DeviceTree, TreeRow

__all__ = [
    "ancestor_matrix",
    "chain_batch",
    "chain_device",
    "chain_from_path",
    "ddtree_batch",
    "ddtree_device",
    "root_tree_device",
    "root_trees",
    "topk_last",
    "trie_device",
]

# Largest row for which ``topk_last`` takes the Triton top-k: one program per row scans it once per rank, which beat
# ``torch.topk`` at 8192 tokens and lost at 151936 on an H200 (docs/kernels.md). The DDTree selection's per-depth
# top-k takes wider rows in two launches (8192-token chunks, then their candidates), which beat ``torch.topk``'s
# radix selection at 151936 tokens on an H100 (``ddtree_device``'s ``topk_impl``).
TOPK_TRITON_MAX_VOCAB = 32768


def topk_last(x: torch.Tensor, k: int, *, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1, largest=largest)`` (values and int64 ids, sorted) for fp32 ``x``: on CUDA (or under
    Triton's interpreter), for rows of up to ``TOPK_TRITON_MAX_VOCAB`` entries, the DDTree builder's top-k kernel
    (``ddtree_build.topk_rows``: one launch, each row read once; ties to the smaller index, one of the orders
    ``torch.topk`` may return), which on a vocabulary of a few thousand tokens or the ``k**2`` candidates of an
    EAGLE-2 level takes a fraction of the time of ``torch.topk``'s radix selection and sorts; ``torch.topk``
    elsewhere. ``largest=False``: the ``k`` smallest, ascending (ties to the smaller index too)."""
    vocab = x.shape[-1]
    on_device = x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if on_device and x.dtype == torch.float32 and vocab <= TOPK_TRITON_MAX_VOCAB and _triton_available():
        vals, ids = topk_rows(x.reshape(-1, vocab), k, smallest=not largest)
        return vals.view(*x.shape[:-1], k), ids.view(*x.shape[:-1], k)
    return x.topk(k, dim=-1, largest=largest)


def ddtree_device(
    logq: torch.Tensor,
    root_token: torch.Tensor,
    *,
    budget: int,
    topk: int | None,
    num_slots: int,
    impl: str = "torch",
    topk_impl: str = "torch",
    rank_tokens: torch.Tensor | None = None,
) -> TreeRow:
    """The DDTree (the best-first heap of ``docs/trees.md``, node for node) as device tensor ops.

    Ranks per depth order tokens by (fp32 value desc, id asc), ties at the top-``k`` cut included; a path scores
    the float64 left-to-right sum of its fp32 per-depth values; nodes come in the heap's pop order, (score desc,
    rank tuple asc, a tuple before its extensions). ``logq`` is not validated (that would read it on the host):
    pass log-probabilities (<= 0; -inf allowed, no NaN or +inf).

    Args:
        logq (torch.Tensor): ``[D, V]`` float log-probabilities, row d-1 for depth d; any float dtype, compared
            as fp32 (float64 input is rounded first, so two float64 values that round to one fp32 value tie).
        root_token (torch.Tensor): 0-d or ``[1]`` int64 token of node 0, on ``logq.device``.
        budget (int): number of non-root nodes, >= 1.
        topk (int | None): candidates per depth, >= 1; None means ``budget``. Also capped by ``budget`` and ``V``.
        num_slots (int): ``S``, the output length, >= ``budget + 1``.
        impl (str): ``"torch"`` (default: per-depth selection as tensor ops, any device), ``"triton"`` (the heap's
            pops in one launch, ``specdec.kernels.ddtree_build``; needs ``D * bit_length(k) <= 63``, e.g. D = 15
            with k <= 15) or ``"auto"``: Triton on CUDA when it applies, else torch.
        topk_impl (str): the per-depth top-k: ``"torch"`` (default: one ``topk`` over packed int64 keys),
            ``"triton"`` (``specdec.kernels.ddtree_build.topk_rows``: one launch, one program per depth, a pass
            per rank; rows wider than 32768 in two launches over 8192-token chunks) or ``"auto"``: Triton on CUDA
            where it fits (measured faster at 8192 and at 151936 tokens, ``docs/kernels.md``), else torch. All give
            the same ranks, ties included.

    Returns:
        rank_tokens (torch.Tensor | None): ``[D, >= k]`` int64: the token the node of rank ``r`` at depth ``d`` takes
            (``rank_tokens[d - 1, r]``) instead of ``logq``'s own ``r``-th token; the tree's shape is ``logq``'s.
            A policy whose tokens are drawn elsewhere (``StochasticDDTree``'s draws without replacement) writes
            them through the selection itself. Siblings under one parent are ranks ``0, 1, ...`` in slot order.

    Returns:
        TreeRow: ``S`` slots holding ``1 + min(budget, reachable)`` real nodes.
    """
    depth_limit, vocab = _check_logq(logq)
    _check_int("budget", budget, 1)
    if topk is not None:
        _check_int("topk", topk, 1)
    _check_int("num_slots", num_slots, 1)
    if num_slots < budget + 1:
        raise ValueError(f"num_slots={num_slots} < budget + 1 = {budget + 1}: pass num_slots >= budget + 1.")
    k = min(budget if topk is None else topk, budget, vocab)
    if topk_impl not in ("auto", "torch", "triton"):
        raise ValueError(f"topk_impl={topk_impl!r}: choose 'auto', 'torch' or 'triton'.")
    if topk_impl == "auto":
        topk_impl = "triton" if triton_fits(logq, 1) else "torch"
    vals, ids = topk_rows(logq, k) if topk_impl == "triton" else topk_rows_reference(logq, k)  # [D, k] fp32 / int64
    if rank_tokens is not None:
        ids = _rank_tokens(rank_tokens, depth_limit, k)
    num_real = 1 + min(budget, reachable_nodes(k, depth_limit, budget))
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"impl={impl!r}: choose 'auto', 'torch' or 'triton'.")
    if impl == "triton" or (impl == "auto" and triton_fits(logq, k)):
        tokens, parents, depth = best_first(vals, ids, num_real - 1)
        return _pad_tree(root_token, tokens, parents, depth, num_slots)
    scores, ranks, parents = select_levels(vals, budget)  # [M], [M, D], [M]: kept nodes, depth-major
    depth = (ranks >= 0).sum(-1)  # [M], non-decreasing
    order = key_order(scores, pack_ranks(ranks, k))  # [M]: kept nodes in pop order
    position = torch.empty_like(order).scatter_(0, order, torch.arange(1, order.numel() + 1, device=order.device))
    take = order[: num_real - 1]
    depth, ranks, parents = depth[take], ranks[take], parents[take]
    own_rank = ranks.gather(1, (depth - 1).unsqueeze(-1)).squeeze(-1)
    new_parents = torch.where(parents < 0, 0, position[parents.clamp(min=0)])  # the root's children keep 0
    return _pad_tree(root_token, ids[depth - 1, own_rank], new_parents, depth, num_slots)


def ddtree_batch(
    logq: torch.Tensor,
    roots: torch.Tensor,
    *,
    budget: int,
    topk: int | None,
    num_slots: int,
    impl: str = "torch",
    topk_impl: str = "torch",
    rank_tokens: torch.Tensor | None = None,
) -> DeviceTree:
    """:func:`ddtree_device` for a batch: ``logq [B, D, V]``, ``roots [B]`` (``rank_tokens``: ``[B, D, >= k]``) ->
    the trees ``[B, S]``, node for node those of each row alone. Where the Triton selection applies, the whole
    batch takes one top-k launch and one selection launch (one program per row); otherwise the rows are built one
    by one."""
    batch = logq.shape[0]
    if logq.dim() != 3 or roots.shape != (batch,):
        raise ValueError(f"ddtree_batch takes logq [B, D, V] and roots [B]; got {list(logq.shape)}, "
                         f"{list(roots.shape)}.")  # fmt: skip
    depth_limit, vocab = _check_logq(logq[0])
    _check_int("budget", budget, 1)
    k = min(budget if topk is None else topk, budget, vocab)
    if impl == "auto":
        impl = "triton" if triton_fits(logq[0], k) else "torch"
    if impl != "triton":
        per_row = [None] * batch if rank_tokens is None else list(rank_tokens)
        rows = [ddtree_device(q, r, budget=budget, topk=topk, num_slots=num_slots, impl=impl, topk_impl=topk_impl,
                              rank_tokens=t) for q, r, t in zip(logq, roots, per_row, strict=True)]  # fmt: skip
        return DeviceTree.stack(rows)
    _check_int("num_slots", num_slots, budget + 1)
    if topk_impl == "auto":
        topk_impl = "triton" if triton_fits(logq[0], 1) else "torch"
    flat = logq.reshape(batch * depth_limit, vocab)
    vals, ids = topk_rows(flat, k) if topk_impl == "triton" else topk_rows_reference(flat, k)
    if rank_tokens is not None:
        if rank_tokens.dim() != 3 or rank_tokens.shape[0] != batch:
            raise ValueError(f"rank_tokens must be [B, D, >= k] = [{batch}, {depth_limit}, >= {k}]; got "
                             f"{list(rank_tokens.shape)}.")  # fmt: skip
        _rank_tokens(rank_tokens[0], depth_limit, k)  # the checks
        ids = rank_tokens[:, :, :k].contiguous()  # (no copy when it holds k ranks)
    num_real = 1 + min(budget, reachable_nodes(k, depth_limit, budget))
    # whole trees from the launch that selects them (pad_trees' layout, no concatenations)
    tokens, parents, depth = best_first(vals.view(batch, depth_limit, k), ids.view(batch, depth_limit, k),
                                        num_real - 1, roots=roots.long(), num_slots=num_slots)  # fmt: skip
    _, _, valid, num_nodes = _pad_constants(tokens.device, batch, num_real - 1, num_slots)
    return DeviceTree(tokens=tokens, parents=parents, depth=depth, valid=valid, num_nodes=num_nodes)


def _rank_tokens(rank_tokens: torch.Tensor, depth_limit: int, k: int) -> torch.Tensor:
    """``rank_tokens [D, >= k]`` checked (shapes and dtype: no read) and cut to the ``[D, k]`` ids the selection
    writes from."""
    if rank_tokens.dim() != 2 or rank_tokens.shape[0] != depth_limit or rank_tokens.shape[1] < k:
        raise ValueError(f"rank_tokens must be [D, >= k] = [{depth_limit}, >= {k}]; got {list(rank_tokens.shape)}.")
    if rank_tokens.dtype != torch.long:
        raise ValueError(f"rank_tokens must be int64 token ids; got {rank_tokens.dtype}.")
    return rank_tokens[:, :k].contiguous()


def pad_trees(roots, tokens, parents, depth, num_slots: int) -> DeviceTree:
    """:func:`_pad_tree` for a batch: ``roots [B]``, non-root nodes ``[B, n]`` -> ``[B, num_slots]`` trees (three
    concatenations; the padding, ``valid`` and ``num_nodes`` depend only on the shapes: made once, ``constant``)."""
    batch, n = tokens.shape
    root = roots.reshape(batch, 1).long()
    pad = num_slots - 1 - n
    minus, zeros, valid, num_nodes = _pad_constants(tokens.device, batch, n, num_slots)
    return DeviceTree(
        tokens=torch.cat([root, tokens, root.expand(batch, pad)], 1),
        parents=torch.cat([minus[:, :1], parents, minus[:, 1:]], 1),
        depth=torch.cat([zeros[:, :1], depth, zeros[:, 1:]], 1),
        valid=valid,
        num_nodes=num_nodes,
    )


def _pad_constants(device: torch.device, batch: int, n: int, num_slots: int) -> tuple:
    """``(-1 [B, pad + 1], 0 [B, pad + 1], valid [B, S], num_nodes [B])`` of trees of ``n`` non-root nodes."""

    def make():
        pad = num_slots - 1 - n
        return (
            torch.full((batch, pad + 1), -1, dtype=torch.long, device=device),
            torch.zeros(batch, pad + 1, dtype=torch.long, device=device),
            (torch.arange(num_slots, device=device) <= n).expand(batch, -1).contiguous(),  # kernels read it as is
            torch.full((batch,), n + 1, dtype=torch.long, device=device),
        )

    return constant(("pad_trees", str(device), batch, n, num_slots), make)


def chain_device(logq: torch.Tensor, root_token: torch.Tensor, *, k: int, num_slots: int) -> TreeRow:
    """The argmax chain of the argmax chain as device tensor ops.

    Args:
        logq (torch.Tensor): ``[D, V]`` float per-depth log-probabilities (or logits); ties pick the smallest id.
        root_token (torch.Tensor): 0-d or ``[1]`` int64 token of node 0, on ``logq.device``.
        k (int): number of drafted tokens, >= 1; the chain holds ``min(k, D)``.
        num_slots (int): ``S``, the output length, >= ``1 + min(k, D)``.

    Returns:
        TreeRow: ``S`` slots holding ``1 + min(k, D)`` real nodes.
    """
    depth_limit, _ = _check_logq(logq)
    _check_int("k", k, 1)
    _check_int("num_slots", num_slots, 1)
    length = min(k, depth_limit)
    if num_slots < length + 1:
        raise ValueError(f"num_slots={num_slots} < 1 + min(k, D) = {length + 1}: pass more slots.")
    tokens = logq[:length].float().argmax(dim=-1)  # first maximum = smallest id among ties
    steps = torch.arange(length, device=logq.device)
    return _pad_tree(root_token, tokens, steps, steps + 1, num_slots)


def chain_batch(logq: torch.Tensor, roots: torch.Tensor, *, k: int, num_slots: int) -> DeviceTree:
    """:func:`chain_device` for a batch: ``logq [B, D, V]``, ``roots [B]`` -> the chains ``[B, S]``, node for node
    those of each row alone: one argmax and one concatenation (parents, depths, ``valid`` and ``num_nodes`` depend
    only on the shapes: made once, ``constant``)."""
    batch = logq.shape[0]
    if logq.dim() != 3 or roots.shape != (batch,):
        raise ValueError(f"chain_batch takes logq [B, D, V] and roots [B]; got {list(logq.shape)}, "
                         f"{list(roots.shape)}.")  # fmt: skip
    depth_limit, _ = _check_logq(logq[0])
    _check_int("k", k, 1)
    _check_int("num_slots", num_slots, 1)
    length = min(k, depth_limit)
    if num_slots < length + 1:
        raise ValueError(f"num_slots={num_slots} < 1 + min(k, D) = {length + 1}: pass more slots.")
    tokens = logq[:, :length].float().argmax(dim=-1)  # [B, length]; first maximum = smallest id among ties
    parents, depth = _chain_constants(logq.device, batch, length, num_slots)
    _, _, valid, num_nodes = _pad_constants(logq.device, batch, length, num_slots)
    root = roots.reshape(batch, 1).long()
    return DeviceTree(tokens=torch.cat([root, tokens, root.expand(batch, num_slots - 1 - length)], 1),
                      parents=parents, depth=depth, valid=valid, num_nodes=num_nodes)  # fmt: skip


def _chain_constants(device: torch.device, batch: int, length: int, num_slots: int) -> tuple:
    """The padded parents and depths ``[B, S]`` of a chain of ``length`` drafts."""

    def make():
        slots = torch.arange(num_slots, device=device)
        real = slots <= length
        parents = torch.where(real, slots - 1, -1).expand(batch, -1).contiguous()
        depth = torch.where(real, slots, 0).expand(batch, -1).contiguous()
        return parents, depth

    return constant(("chain", str(device), batch, length, num_slots), make)


def root_tree_device(root_token: torch.Tensor) -> TreeRow:
    """The one-slot tree of plain decoding: the root alone."""
    none = root_token.reshape(1)[:0].long()
    return _pad_tree(root_token, none, none, none, 1)


def root_trees(roots: torch.Tensor) -> DeviceTree:
    """The one-slot trees of plain decoding for a batch: ``roots [B]`` -> each root alone (``[B, 1]`` fields)."""
    tokens = roots.reshape(-1, 1).long()
    batch, device = tokens.shape[0], tokens.device

    def make():
        zeros = torch.zeros_like(tokens)
        return zeros - 1, zeros, torch.ones_like(tokens, dtype=torch.bool), torch.ones_like(tokens[:, 0])

    parents, depth, valid, num_nodes = constant(("root_trees", str(device), batch), make)  # made once
    return DeviceTree(tokens=tokens, parents=parents, depth=depth, valid=valid, num_nodes=num_nodes)


def ancestor_matrix(tree: TreeRow, max_depth: int) -> torch.Tensor:
    """Boolean ``[S, S]`` mask, ``A[i, j]`` = slot j is slot i or one of its ancestors, by pointer jumping.

    Round t joins each row with the row of the ancestor ``2**t`` levels up, so ``bit_length(max_depth)`` rounds
    cover every node of depth <= ``max_depth``. Padding rows see only themselves.

    Args:
        tree (TreeRow): ``S`` slots.
        max_depth (int): an upper bound on the depth of the real nodes (e.g. ``D``), >= 0.

    Returns:
        torch.Tensor: ``[S, S]`` bool on the tree's device.
    """
    _check_int("max_depth", max_depth, 0)
    return ancestor_mask(tree.parents, max_depth)


def _check_logq(logq: torch.Tensor) -> tuple[int, int]:
    """A ``[D, V]`` float tensor with at least one depth and token, within the packed-key limit; returns ``(D, V)``."""
    if not isinstance(logq, torch.Tensor) or logq.dim() != 2:
        shape = tuple(logq.shape) if isinstance(logq, torch.Tensor) else type(logq).__name__
        raise ValueError(f"logq must be a 2-D [D, V] tensor (row d-1 = depth d), got {shape}; index one sequence.")
    if not logq.is_floating_point():
        raise ValueError(f"logq has dtype {logq.dtype}: pass float log-probabilities.")
    if logq.shape[0] < 1 or logq.shape[1] < 1:
        raise ValueError(f"logq has shape {tuple(logq.shape)}: it needs at least one depth and one token.")
    if logq.shape[1] > 2**31:
        raise ValueError(f"logq has {logq.shape[1]} columns: vocabularies above 2**31 tokens are not supported.")
    return logq.shape[0], logq.shape[1]


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: pass a Python int >= {low}.")


def reachable_nodes(k: int, depth_limit: int, cap: int) -> int:
    """``min(cap, k + k**2 + ... + k**depth_limit)`` without forming huge powers."""
    total, level = 0, 1
    for _ in range(depth_limit):
        level = min(level * k, cap)
        total += level
        if total >= cap:
            return cap
    return total


def _pad_tree(
    root_token: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, num_slots: int
) -> TreeRow:
    """Root + the given non-root nodes, padded to ``num_slots`` slots."""
    device = tokens.device
    root = root_token.reshape(1).to(device=device, dtype=torch.long)
    pad = num_slots - 1 - tokens.numel()
    minus = torch.full((pad + 1,), -1, dtype=torch.long, device=device)
    zeros = torch.zeros(pad + 1, dtype=torch.long, device=device)
    return TreeRow(
        tokens=torch.cat([root, tokens, root.expand(pad)]),
        parents=torch.cat([minus[:1], parents, minus[1:]]),
        depth=torch.cat([zeros[:1], depth, zeros[1:]]),
        valid=torch.arange(num_slots, device=device) <= tokens.numel(),
        num_nodes=torch.full((), tokens.numel() + 1, dtype=torch.long, device=device),
    )


def chain_from_path(path: torch.Tensor, length: torch.Tensor, root_token: torch.Tensor, *, num_slots: int) -> TreeRow:
    """A chain of the first ``length`` tokens of ``path`` (drafts from a path proposal, e.g. an n-gram match).

    Args:
        path (torch.Tensor): ``[L]`` int64 drafted tokens.
        length (torch.Tensor): 0-d int64, how many of them are real (0 = the root alone).
        root_token (torch.Tensor): 0-d or ``[1]`` int64.
        num_slots (int): ``S >= L + 1``.
    """
    steps = torch.arange(path.numel(), device=path.device)
    real = steps < length
    return _pad_masked(root_token, path, torch.where(real, steps, -1), torch.where(real, steps + 1, 0), real, num_slots)


def trie_device(paths: torch.Tensor, lengths: torch.Tensor, root_token: torch.Tensor, *, budget: int,
                num_slots: int) -> TreeRow:  # fmt: skip
    """Merge drafted paths into a trie under ``budget`` non-root nodes, as device tensor ops.

    Paths come in priority order; nodes are numbered path by path, depth by depth (path 0's nodes first, then the
    nodes path 1 adds, ...), so every prefix of the numbering is closed under parents and the ``budget`` first
    nodes form the tree. A node is the prefix ``paths[m, :l + 1]``; it is new on path m unless an earlier path with
    at least ``l + 1`` real tokens shares that prefix.

    Args:
        paths (torch.Tensor): ``[M, L]`` int64 drafted tokens.
        lengths (torch.Tensor): ``[M]`` int64 real tokens per path (0 = an empty path).
        root_token (torch.Tensor): 0-d or ``[1]`` int64.
        budget (int): non-root nodes kept, >= 1.
        num_slots (int): ``S >= budget + 1``.
    """
    root = root_token.reshape(1).to(device=paths.device, dtype=torch.long)
    fields = path_trie_reference(paths[None], root, num_slots, lengths=lengths[None], budget=budget)
    tokens, parents, depth, valid, count = (f[0] for f in fields)
    return TreeRow(tokens, parents, depth, valid, count)


def _pad_masked(root_token, tokens, parents, depth, real, num_slots: int) -> TreeRow:
    """Root + ``tokens`` where ``real`` (a prefix), padding elsewhere (root token, parent -1, depth 0)."""
    device = tokens.device
    root = root_token.reshape(1).to(device=device, dtype=torch.long)
    pad = num_slots - 1 - tokens.numel()
    minus = torch.full((pad + 1,), -1, dtype=torch.long, device=device)
    zeros = torch.zeros(pad + 1, dtype=torch.long, device=device)
    valid = torch.cat([real.new_ones(1), real, real.new_zeros(pad)])
    return TreeRow(
        tokens=torch.cat([root, torch.where(real, tokens, root), root.expand(pad)]),
        parents=torch.cat([minus[:1], parents, minus[1:]]),
        depth=torch.cat([zeros[:1], depth, zeros[1:]]),
        valid=valid,
        num_nodes=valid.sum(),
    )
