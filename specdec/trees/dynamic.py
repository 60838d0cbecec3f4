"""EAGLE-2's dynamic draft tree: the drafter expands a candidate tree, the policy reranks it to a fixed size.

The drafter (``Eagle3Drafter``) drafts the candidates inside the round (``docs/eagle3.md``): the ``k`` most likely
tokens after the root, then, level by level, the ``k`` most likely children of each of the ``k`` frontier nodes,
of which the ``k`` of largest cumulative log-probability form the next frontier. It proposes every candidate with
its parent and cumulative log-probability (``Proposal.candidates``, ``parents``, ``scores``, fixed shapes).

:class:`DynamicTree` keeps the ``total_tokens - 1`` candidates of largest cumulative log-probability (ties: the
smaller candidate index) and lays them out in candidate order, so parents come before children, as EAGLE-2's rerank
does. ``DDTree(candidates=True)`` keeps the same nodes in best-first (pop) order. A child never scores above its
parent and sorts after it, so the kept set is closed under parents.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.trees.build import pad_trees, topk_last
from specdec.trees.policies import register_tree
from specdec.types import DeviceTree, Proposal

__all__ = [
    "CANDIDATE_DRAFTERS",
    "DynamicTree",
    "candidate_count",
    "candidate_levels",
    "expand_candidates",
    "rerank_candidates",
]

CANDIDATE_DRAFTERS = ("Eagle3Drafter",)
"""The drafters that propose candidate trees (``Proposal.candidates``)."""


def candidate_count(topk: int, levels: int) -> int:
    """Candidates of a tree of ``levels`` levels with ``topk`` children per expanded node: ``k + (L - 1) k**2``."""
    return topk + (levels - 1) * topk * topk


def candidate_levels(num: int, topk: int, device=None) -> torch.Tensor:
    """``[num]`` int64 level (depth, >= 1) of each candidate index of the layout ``Proposal.candidates`` states."""
    return level_of(torch.arange(num, device=device), topk)


def level_of(index: torch.Tensor, topk: int) -> torch.Tensor:
    """The level (depth, >= 1) of candidate indices ``index`` (any shape) for ``topk`` children per node."""
    return torch.where(index < topk, 1, 2 + (index - topk).clamp(min=0) // (topk * topk))


def expand_candidates(first: torch.Tensor, step, *, levels: int, topk: int, token_ids=None) -> Proposal:
    """EAGLE-2's candidate tree from a drafter's log-probabilities (tensor ops, fixed shapes, no host read).

    Level 1: the ``topk`` most likely tokens of ``first`` (scores: their log-probabilities). Each next level asks
    ``step`` for the log-probabilities after each of the ``topk`` frontier nodes; each frontier row's ``topk`` most
    likely tokens become candidates scoring the row's score plus their log-probability (row by row, rank by rank);
    the ``topk`` best of those ``topk**2`` form the next frontier (``torch.topk``; on CUDA one top-k kernel). The
    last level is not expanded.

    Args:
        first (torch.Tensor): ``[B, Vd]`` log-probabilities after the root.
        step: ``step(level, tokens [B, k], parent_rows [B, k]) -> [B, k, Vd]`` log-probabilities after each frontier
            node of level ``level`` (>= 1); ``parent_rows`` is the row of the previous call (level 1: of ``first``,
            all 0) whose candidate each node is: a drafter takes that row's state with it.
        levels (int): levels of the tree, >= 1. topk (int): ``k``, >= 1.
        token_ids (torch.Tensor | None): ``[Vd]`` the token id of each column (a reduced draft vocabulary); None:
            the column is the id.

    Returns:
        Proposal: ``candidates``, ``parents``, ``scores`` ``[B, k + (levels - 1) * k**2]``.
    """
    k = topk
    scores, ids = topk_last(first, k)  # [B, k]
    tokens = [ids if token_ids is None else token_ids[ids]]
    parents, all_scores = [torch.full_like(ids, -1)], [scores]
    front_token, parent_rows = tokens[0], torch.zeros_like(ids)
    front_index = torch.arange(k, device=ids.device).expand(ids.shape[0], -1)
    for level in range(1, levels):
        vals, ids = topk_last(step(level, front_token, parent_rows), k)  # [B, k, k]
        cumulative = (vals + scores[:, :, None]).flatten(1)  # [B, k * k]: row r's children, rank by rank
        tokens.append((ids if token_ids is None else token_ids[ids]).flatten(1))
        parents.append(front_index[:, :, None].expand(-1, -1, k).flatten(1))
        all_scores.append(cumulative)
        if level + 1 < levels:
            scores, pick = topk_last(cumulative, k)  # the next frontier
            parent_rows = pick // k
            front_index = k + (level - 1) * k * k + pick
            front_token = tokens[-1].gather(1, pick)
    return Proposal(candidates=torch.cat(tokens, 1), parents=torch.cat(parents, 1), scores=torch.cat(all_scores, 1))


def rerank_candidates(
    proposal: Proposal, root: torch.Tensor, *, budget: int, topk: int, num_slots: int, order: str = "index"
) -> DeviceTree:
    """The trees ``[B, num_slots]`` of the ``budget`` best candidates of each row (tensor ops, no host read).

    Candidates are ranked by cumulative log-probability, largest first, ties by the smaller candidate index
    (a stable sort), and the first ``min(budget, N)`` kept: a set closed under parents. ``order="index"`` lays them
    out by candidate index (EAGLE-2's rerank: level by level, parents before children); ``order="score"`` in rank
    order (DDTree's pop order, also parents first).

    Args:
        proposal (Proposal): ``candidates``, ``parents``, ``scores`` ``[B, N]``.
        root (torch.Tensor): ``[B]`` int64 root tokens.
        budget (int): non-root nodes kept, >= 1.
        topk (int): children per expanded node (fixes each candidate's level).
        num_slots (int): ``S >= budget + 1``.
        order (str): ``"index"`` or ``"score"``.
    """
    if proposal.candidates is None or proposal.parents is None or proposal.scores is None:
        raise ValueError(
            "rerank_candidates needs a candidate tree (Proposal.candidates, parents, scores): a drafter that drafts "
            f"one ({', '.join(CANDIDATE_DRAFTERS)}) proposes it for a policy that reads 'candidates'."
        )
    if order not in ("index", "score"):
        raise ValueError(f"order={order!r}: choose 'index' (EAGLE-2's layout) or 'score' (best-first).")
    scores, parents, tokens = proposal.scores, proposal.parents, proposal.candidates
    batch, num = scores.shape
    if num_slots < budget + 1:
        raise ValueError(f"num_slots={num_slots} < budget + 1 = {budget + 1}: pass num_slots >= budget + 1.")
    kept = min(budget, num)
    ranked = torch.sort(scores.float(), dim=1, descending=True, stable=True).indices[:, :kept]  # [B, n]
    chosen = ranked.sort(dim=1).values if order == "index" else ranked
    device = scores.device
    nodes = torch.arange(1, kept + 1, device=device).expand(batch, -1)
    slot = torch.zeros(batch, num, dtype=torch.long, device=device).scatter_(1, chosen, nodes)
    parent = parents.gather(1, chosen)
    parent = torch.where(parent < 0, 0, slot.gather(1, parent.clamp(min=0)))
    depth = level_of(chosen, topk)
    return pad_trees(root.reshape(-1), tokens.gather(1, chosen), parent, depth, num_slots)


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's dynamic draft tree: ``DynamicTree(depth=7, topk=10, total_tokens=60)`` (the reference defaults).

    The drafter expands a candidate tree of ``depth + 1`` levels, ``topk`` tokens per expanded node and a frontier
    of ``topk`` nodes per level (``topk + depth * topk**2`` candidates, ``depth + 1`` draft forwards of at most
    ``topk`` rows); the policy keeps the ``total_tokens - 1`` of largest cumulative log-probability, parents before
    children (module docstring). Only drafters that draft the candidates themselves serve it
    (``CANDIDATE_DRAFTERS``). Deterministic given the draft: exact with ``Greedy`` and ``SampleMatch``.

    Args:
        depth (int): expansion steps after the first level, >= 1 (the deepest node sits at ``depth + 1``).
        topk (int): children per expanded node and frontier width, >= 1.
        total_tokens (int): tree nodes verified per round, the root included (budget = ``total_tokens - 1``),
            between 2 and ``1 + topk + depth * topk**2``.
    """

    depth: int = 7
    topk: int = 10
    total_tokens: int = 60
    reads = ("candidates",)
    branching = True
    stochastic = False

    def __post_init__(self) -> None:
        for name, low in (("depth", 1), ("topk", 1), ("total_tokens", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DynamicTree({name}={value!r}): {name} must be an int >= {low}.")
        most = 1 + candidate_count(self.topk, self.depth + 1)
        if self.total_tokens > most:
            raise ValueError(
                f"DynamicTree(total_tokens={self.total_tokens}): the candidate tree of depth={self.depth}, "
                f"topk={self.topk} holds {most - 1} candidates (+ the root); pass total_tokens <= {most}, or a "
                "larger depth or topk."
            )

    @property
    def budget(self) -> int:
        """Non-root nodes of each tree."""
        return self.total_tokens - 1

    @property
    def max_depth(self) -> int:
        return self.depth + 1

    @property
    def levels(self) -> int:
        """Levels of the candidate tree the drafter drafts."""
        return self.depth + 1

    @property
    def candidate_topk(self) -> int:
        """Children per expanded node of the candidate tree."""
        return self.topk

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        return rerank_candidates(proposal, root, budget=self.budget, topk=self.topk, num_slots=self.budget + 1)


register_tree("dynamic", DynamicTree)
