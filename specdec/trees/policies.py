"""Tree policies: turn a drafter's proposal into the round's draft trees (``DeviceTree [B, S]``).

A policy is any object with the attributes and methods of :class:`TreePolicy`; ``Chain`` and ``DDTree`` are the
built-in ones. Policies run inside the round, so ``build`` must be tensor ops with shapes fixed by the policy
(``num_slots``) and no host reads: the same code then runs eagerly and inside a CUDA graph. ``register_tree``
makes a policy selectable by name (hydra's ``tree=`` group, the bench). See ``docs/extending.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from specdec.backends import env_default
from specdec.budget import AutoBudget, check_clock, check_sizes, ddtree_scores, expected_accepts
from specdec.kernels.ddtree_build import EXPECT_SIZES_MAX, best_first, topk_rows, triton_fits
from specdec.kernels.path_trie.reference import path_trie_reference
from specdec.trees.build import (
    _pad_constants,
    chain_batch,
    chain_from_path,
    ddtree_batch,
    pad_trees,
    reachable_nodes,
    root_trees,
)
from specdec.types import DeviceTree, Proposal

__all__ = ["TREES", "Chain", "DDTree", "TreePolicy", "register_tree"]


@runtime_checkable
class TreePolicy(Protocol):
    """The tree-policy protocol.

    Attributes:
        budget (int): most non-root nodes a tree holds; the round verifies ``budget + 1`` slots.
        max_depth (int): deepest node the policy can build; drafters draft at most this deep.
        reads (tuple[str, ...]): the :class:`~specdec.types.Proposal` fields the policy can build from
            (``"logq"``, ``"paths"``, ``"candidates"``); a drafter that provides none of them is refused by name.
        branching (bool): True when siblings occur (drafters may cap the depth they draft for such policies).
        stochastic (bool): True when ``build`` samples from the proposal (it then receives ``noise``).
    """

    budget: int
    max_depth: int
    reads: tuple[str, ...]
    branching: bool
    stochastic: bool

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        """The trees ``[B, budget + 1]`` rooted at ``root [B]`` from ``proposal`` (``depth`` = its drafted depth).
        ``noise``: uniforms ``[B, depth, V]`` drawn fresh each round for a policy with ``stochastic = True`` (one
        that samples its tree from the draft distribution), else None."""


# A policy over a candidate tree the drafter expands itself (``DynamicTree``, ``DDTree(candidates=True)``,
# ``specdec.trees.dynamic``) reads ("candidates",) and adds ``candidate_topk`` (int: children per expanded node; the
# round then calls ``state.propose_tree``) and optionally ``levels`` (int: the candidate tree's depth; else the
# drafter's own depth for the policy).
#
# An adaptive policy (``DDTree(budget="auto")``) adds, and the decoding loop looks for, without the round knowing
# which policy runs:
#   controller(batch) -> object with next_size(remaining, final) -> int and observe(size, expected, accepted, ms,
#       rows), or None (docs/extending.md)
#   sizes: tuple[int, ...]  (the budgets it may pick; plain decoding = 0 and DETACHED = -1 besides)
#   at(size) -> the fixed policy of one round; that policy may carry ``expect_sizes`` (a tuple) and
#       ``expectations(proposal) -> [B, len(expect_sizes)]`` (tensor ops, computed inside the round and read
#       with its tokens); every round is timed on the device.


def _int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} must be an int >= {low}.")


@dataclass(frozen=True)
class Chain:
    """A chain of ``k`` draft tokens (the classic linear speculation): ``Chain(4)`` or ``Chain(k=4)``.

    From per-depth log-probabilities it takes each depth's most likely token (ties: the smallest id); from drafted
    paths, the first path.

    Args:
        k (int): number of drafted tokens per round (non-root nodes), >= 1.
    """

    k: int = 4
    reads = ("logq", "paths")
    branching = False
    stochastic = False

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"Chain(k={self.k!r}): k must be an int >= 1 (number of drafted tokens per round).")

    @property
    def budget(self) -> int:
        """Number of non-root nodes the tree may hold."""
        return self.k

    @property
    def max_depth(self) -> int:
        return self.k

    @property
    def topk(self) -> int:
        return 1

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        slots = self.k + 1
        if proposal.logq is not None:
            return chain_batch(proposal.logq, root.reshape(-1), k=self.k, num_slots=slots)
        rows = [
            chain_from_path(p[0, : self.k], n[0].clamp(max=self.k), r, num_slots=slots)
            for p, n, r in zip(proposal.paths, proposal.path_lengths, root, strict=True)
        ]
        return DeviceTree.stack(rows)


@dataclass(frozen=True)
class DDTree:
    """Best-first draft tree (DDTree): the ``budget`` most likely root-to-node prefixes: ``DDTree(15)``.

    From per-depth log-probabilities it keeps the ``budget`` prefixes of largest summed log-probability (ties by
    the rank tuple, ``docs/trees.md``); from drafted paths, the trie of the paths in priority order, cut at
    ``budget`` nodes.

    ``DDTree(budget="auto")`` picks each round's budget among ``sizes`` by goodput (expected committed tokens per
    ms, ``specdec.budget``, ``docs/trees.md``): the decoding loop runs ``at(size)`` rounds, one captured round per
    size; tokens are the same whatever the choice (every DDTree round is exact).

    Args:
        budget (int | str): number of non-root nodes (verify length = budget + 1), >= 1; or ``"auto"``.
        topk (int | None): candidates per depth; ``None`` means ``budget`` (the reference behaviour).
        sizes (tuple[int, ...]): the budgets ``"auto"`` chooses among (strictly increasing), besides plain
            decoding (a round without a draft, :class:`RootOnly`). Default ``(3, 15, 31, 63)``.
        candidates (bool): build over the candidate tree a drafter drafts itself (EAGLE-2's expansion,
            ``specdec.trees.dynamic``: ``topk`` children per expanded node, as deep as the drafter's depth) instead
            of per-depth log-probabilities: the ``budget`` candidates of largest cumulative log-probability in
            best-first order. Default False.
        clock (str): what ``"auto"`` times each round by (``specdec.budget.AutoBudget``): ``"device"``, its device
            time, or ``"wall"``, the host time between two round reads (what the host adds per round included).
            Default ``"device"``.
        lookahead (bool): an ``"auto"`` round also computes the expectation of the next size above its own (its
            selection then pops that many nodes, which its own tree does not need). Default False: its own size and
            those below only, the larger sizes extrapolated by the controller with the growth it learned from the
            rounds of larger sizes (``docs/trees.md``).
    """

    budget: int | str = 15
    topk: int | None = None
    sizes: tuple[int, ...] = (3, 15, 31, 63)
    candidates: bool = False
    clock: str = "device"
    lookahead: bool = False
    branching = True
    stochastic = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", check_sizes(self.sizes))  # a tuple (hashable), also from a config list
        try:
            check_clock(self.clock)
        except ValueError as err:
            raise ValueError(f"DDTree: {err}") from None
        bad = isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1
        if self.budget != "auto" and bad:
            raise ValueError(
                f"DDTree(budget={self.budget!r}): budget must be an int >= 1 (non-root nodes), or 'auto'."
            )
        if self.topk is not None and (isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1):
            raise ValueError(f"DDTree(topk={self.topk!r}): topk must be an int >= 1, or None for topk = budget.")
        if not isinstance(self.candidates, bool):
            raise ValueError(f"DDTree(candidates={self.candidates!r}): candidates must be True or False.")
        if not isinstance(self.lookahead, bool):
            raise ValueError(f"DDTree(lookahead={self.lookahead!r}): lookahead must be True or False.")
        if self.candidates and self.auto:
            raise ValueError(
                "DDTree(budget='auto', candidates=True): the budget chooser reads per-depth log-probabilities; pass "
                "a fixed budget with candidates=True, or candidates=False with budget='auto'."
            )

    def __repr__(self) -> str:
        sizes = f", sizes={self.sizes}" if self.auto else ""
        sizes += f", clock={self.clock!r}" if self.auto and self.clock != "device" else ""
        sizes += ", lookahead=True" if self.auto and self.lookahead else ""
        over = ", candidates=True" if self.candidates else ""
        return f"DDTree(budget={self.budget!r}, topk={self.topk!r}{sizes}{over})"

    @property
    def reads(self) -> tuple[str, ...]:
        return ("candidates",) if self.candidates else ("logq", "paths")

    @property
    def candidate_topk(self) -> int | None:
        """Children per expanded node of the candidate tree the drafter drafts (``candidates=True``), else None."""
        return self.effective_topk if self.candidates else None

    @property
    def auto(self) -> bool:
        """The budget is chosen each round (``budget="auto"``)."""
        return self.budget == "auto"

    def at(self, budget: int) -> DDTree | RootOnly:
        """The fixed-budget policy of one round (``budget`` one of ``sizes`` for an ``"auto"`` policy; 0: a round of
        plain decoding that still feeds the drafter, :class:`RootOnly`). For an ``"auto"`` policy the round's
        policy also computes, inside the round, the expected accepted drafts at every size (``expectations``)."""
        if not self.auto:
            return RootOnly() if budget == 0 else DDTree(budget=budget, topk=self.topk, candidates=self.candidates)
        if budget == 0:
            return AutoRoot(expect_sizes=self.sizes)
        if budget not in self.sizes:
            raise ValueError(f"{self!r}.at({budget!r}): pick 0 (plain decoding) or one of sizes={self.sizes}.")
        return AutoStep(budget=budget, topk=self.topk, expect_sizes=self.sizes, lookahead=self.lookahead)

    def controller(self, batch: int) -> AutoBudget | None:
        """The chooser of each round's budget for a decoding loop of ``batch`` rows (``specdec.budget.AutoBudget``),
        or None for a fixed budget."""
        return AutoBudget(self.sizes, batch, clock=self.clock) if self.auto else None

    @property
    def largest(self) -> DDTree:
        """The fixed policy of the most slots this policy can use (itself unless ``"auto"``)."""
        return self.at(self.sizes[-1]) if self.auto else self

    @property
    def effective_topk(self) -> int:
        budget = self.largest.budget
        return budget if self.topk is None else min(self.topk, budget)

    @property
    def max_depth(self) -> int:
        return self.largest.budget

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        from specdec.trees.dynamic import rerank_candidates

        if self.auto:
            raise ValueError(
                "DDTree(budget='auto') builds no tree itself: the decoding loop builds at(size) for the size it "
                "chooses each round; build with a fixed budget."
            )
        slots = self.budget + 1
        if self.candidates:
            return rerank_candidates(proposal, root, budget=self.budget, topk=self.effective_topk, num_slots=slots,
                                     order="score")  # fmt: skip
        if proposal.logq is not None:
            return ddtree_trees(proposal.logq, root, budget=self.budget, topk=self.topk)
        # every row's paths merged into its trie at once (``trie_device`` is this for one row)
        return DeviceTree(*path_trie_reference(proposal.paths, root, slots, lengths=proposal.path_lengths,
                                               budget=self.budget))  # fmt: skip


def ddtree_trees(logq: torch.Tensor, root: torch.Tensor, *, budget: int, topk: int | None,
                 rank_tokens: torch.Tensor | None = None) -> DeviceTree:  # fmt: skip
    """The DDTrees of ``logq [B, D, V]`` under ``root`` (``budget + 1`` slots each) with the process's backends
    (``Backends.ddtree`` / ``ddtree_topk``); ``rank_tokens``: as :func:`specdec.trees.build.ddtree_batch`."""
    # the Triton top-k where the selection's kernels run (CUDA, or Triton's interpreter)
    on_device = logq.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return ddtree_batch(logq, root.reshape(-1), budget=budget, topk=topk, num_slots=budget + 1, impl=_DDTREE_IMPL,
                        topk_impl=_DDTREE_TOPK if on_device else "torch", rank_tokens=rank_tokens)  # fmt: skip


@dataclass(frozen=True)
class RootOnly:
    """The tree of a round without a draft: the root alone (plain decoding inside a drafter's loop). The round skips
    the drafter's proposal, verifies the root and commits it to the target and to the drafter's state, so that a
    later round with a tree finds the drafter up to date. ``DDTree(budget="auto")`` runs it when no tree pays."""

    budget = 0
    max_depth = 0
    reads = ("logq", "paths")
    branching = False
    stochastic = False

    def build(self, proposal: Proposal | None, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        return root_trees(root)


@dataclass(frozen=True, repr=False)
class AutoStep(DDTree):
    """One round of ``DDTree(budget="auto")``: the fixed-budget DDTree of the size chosen, which also computes the
    round's expected accepted drafts at every candidate size (``expectations``: tensor ops on the proposal's
    ``logq``, capture-safe), read with the round's tokens for the next choice."""

    expect_sizes: tuple[int, ...] = field(default=(), kw_only=True)

    @property
    def expect_upto(self) -> int:
        """The largest size whose expectation this round computes: its own budget, or with ``lookahead`` the next
        candidate size above it (its own at the largest). Every pop past its own tree costs the round (3-8 % of a
        zoo round, ``docs/results.md``); ``AutoBudget`` extrapolates the larger sizes from the last computed."""
        if not self.lookahead:
            return self.budget
        above = [s for s in self.expect_sizes if s > self.budget]
        return above[0] if above else max(self.budget, *self.expect_sizes)

    def _expected(self, scores: torch.Tensor) -> torch.Tensor:
        """Best-first scores up to :attr:`expect_upto` -> ``[B, len(expect_sizes)]`` expectations, -1 for the sizes
        not computed (the controller's mark)."""
        upto = self.expect_upto
        expected = expected_accepts(scores, [s for s in self.expect_sizes if s <= upto])
        missing = len(self.expect_sizes) - expected.shape[-1]
        if missing == 0:
            return expected
        return torch.cat([expected, expected.new_full((*expected.shape[:-1], missing), -1.0)], dim=-1)

    def expectations(self, proposal: Proposal) -> torch.Tensor:
        """``[B, len(expect_sizes)]`` float64: ``E(n) = sum_{i < n} exp(score_i)`` (``specdec.budget``) for the
        sizes up to :attr:`expect_upto`, -1 for the larger ones (not computed)."""
        return self._expected(ddtree_scores(proposal.logq, budget=self.expect_upto, topk=self.topk))

    def build_expecting(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None):
        """The round's tree and its expectations together: ``(build(...), expectations(proposal))``.

        Where the one-launch Triton selection applies, both come from one pass: the heap's pops up to
        :attr:`expect_upto`, with their scores, give the expectations, and their first ``budget`` nodes are this
        round's tree (the ``n`` best prefixes are the first ``n`` pops, parents before children; see
        :func:`specdec.budget.ddtree_scores`), so the round runs one top-k and one selection launch instead of
        two each. For up to ``EXPECT_SIZES_MAX`` candidate sizes that launch also writes the padded tree and the
        expectations itself (no concatenation, exponential or sum after it). Equal scores may order tied nodes
        differently from ``DDTree(budget)`` alone, never their values,
        and every DDTree round is exact whatever its nodes. Elsewhere the two are computed apart.
        """
        logq = proposal.logq
        upto = self.expect_upto
        fused = logq is not None and logq.dim() == 3 and _DDTREE_IMPL != "torch" and self.budget <= upto
        if fused:
            batch, depth_limit, vocab = logq.shape
            k = min(upto if self.topk is None else self.topk, upto, vocab)
            fused = reachable_nodes(k, depth_limit, upto) >= upto and triton_fits(logq[0], k)
        if not fused:
            return self.build(proposal, root, depth, noise), self.expectations(proposal)
        vals, ids = topk_rows(logq.flatten(0, 1).float(), k)
        vals, ids = vals.view(batch, depth_limit, k), ids.view(batch, depth_limit, k)
        n = self.budget
        if len(self.expect_sizes) <= EXPECT_SIZES_MAX:  # the tree and the expectations written by the selection
            tokens, parents, depths, expected = best_first(vals, ids, upto, roots=root.reshape(-1).long(),
                                                           num_slots=n + 1, tree_nodes=n,
                                                           expect=self.expect_sizes)  # fmt: skip
            return _padded_tree(tokens, parents, depths, n), expected
        tokens, parents, depths, scores = best_first(vals, ids, upto, scores=True)
        tree = pad_trees(root.reshape(-1), tokens[:, :n], parents[:, :n], depths[:, :n], n + 1)
        return tree, self._expected(scores)

    def __repr__(self) -> str:
        look = ", lookahead=True" if self.lookahead else ""
        return f"AutoStep(budget={self.budget!r}, topk={self.topk!r}, expect_sizes={self.expect_sizes}{look})"


def _padded_tree(tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, n: int) -> DeviceTree:
    """The ``DeviceTree`` of whole padded trees ``[B, n + 1]`` of ``n`` nodes each, as the selection wrote them."""
    _, _, valid, num_nodes = _pad_constants(tokens.device, tokens.shape[0], n, n + 1)
    return DeviceTree(tokens=tokens, parents=parents, depth=depth, valid=valid, num_nodes=num_nodes)


@dataclass(frozen=True)
class AutoRoot(RootOnly):
    """A round of plain decoding chosen by ``DDTree(budget="auto")`` (:class:`RootOnly`, timed for the cost model;
    it proposes nothing, so it has no expectations)."""

    expect_sizes: tuple[int, ...] = ()

    def expectations(self, proposal) -> None:
        return None


# The DDTree selection's kernels (``docs/kernels.md``): "auto" = the one-launch Triton kernels on CUDA where they
# apply, tensor ops elsewhere. Set through ``specdec.backends`` (``ddtree``, ``ddtree_topk``).
_DDTREE_IMPL = env_default("ddtree")
_DDTREE_TOPK = env_default("ddtree_topk")

TREES: dict[str, type] = {"chain": Chain, "ddtree": DDTree}
"""Tree policies by name (the hydra ``tree=`` group, the bench's ``tree: {kind: ...}``)."""


def register_tree(name: str, policy: type) -> type:
    """Make ``policy`` (a class implementing :class:`TreePolicy`) selectable as ``name``; returns it (a decorator
    works too: ``register_tree("medusa", MedusaTree)``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_tree: name must be a non-empty string, got {name!r}.")
    TREES[name] = policy
    return policy
