"""Sampled tree policies: draft trees whose tokens are drawn from the drafter's distribution q, for the rules that
weigh q (``specdec.verify``: speculative sampling, multi-draft rejection, block and traversal verification).

q is the drafter's per-depth ``logq`` processed with the call's own sampling settings: temperature, then top-k,
then top-p, exactly as the target's logits are (``specdec.verify.draws.draft_logprobs``), so that q tracks the
target's tempered distribution. ``generate`` hands the call's settings to the policy (``with_sampling``) before
the rule's ``check``; at ``do_sample=False`` q is the one-hot of ``logq``'s argmax and each policy builds its
deterministic counterpart (the argmax chain, the argmax path, the top-k tree).

Randomness comes only from the uniforms the round draws each round (``noise [B, depth, V]``, row d-1 for the
depth-d draws): the policies are ``stochastic`` exactly when the call samples. Which rule is exact for which policy
is each rule's docstring and ``docs/verification.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.backends import env_default
from specdec.kernels.categorical_draws import categorical_draws
from specdec.kernels.path_trie import path_trie
from specdec.runtime import constant
from specdec.trees.build import topk_last
from specdec.trees.policies import DDTree, ddtree_trees, register_tree
from specdec.types import DeviceTree, Proposal, SamplingParams
from specdec.verify.draws import draft_logprobs, draft_probs, exponential_keys
from specdec.verify.processing import gumbel_from_uniform

__all__ = ["GumbelTopKTree", "SampledChain", "SampledTrees", "StochasticDDTree"]

_TRIE_IMPL = env_default("path_trie")  # Backends.path_trie: the merged paths' trie
_DRAWS_IMPL = env_default("categorical_draws")  # Backends.categorical_draws: the paths' draws


def _check_int(owner: str, name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}({name}={value!r}): {name} must be an int >= {low}.")


def _logq(proposal: Proposal, owner: str) -> torch.Tensor:
    if proposal.logq is None:
        raise ValueError(f"{owner} samples from the draft distribution: the drafter must provide logq.")
    return proposal.logq


def _samples(sampling: SamplingParams | None) -> bool:
    return sampling is None or sampling.do_sample


def _fixed_tree(root: torch.Tensor, tokens: torch.Tensor, shape: tuple, make, num_slots: int) -> DeviceTree:
    """Root + ``n`` nodes of a shape fixed by Python ints in ``num_slots`` slots: ``tokens [B, n]`` drawn this round;
    ``make(device)`` gives the shape's ``parents`` and ``depth`` ``[n]`` (slots 1..n) from Python ints alone, and
    ``shape`` (Python values) is everything they depend on besides the device: the shape, padded, and the node
    count are made once per key and kept (``specdec.runtime.constant``), so a round launches one concatenation
    for the tree. Padding holds the root token, parent -1, depth 0."""
    device, (batch, n) = root.device, tokens.shape
    pad = num_slots - 1 - n

    def padded():
        parents, depth = make(device)
        minus = torch.full((pad + 1,), -1, dtype=torch.long, device=device)
        zeros = torch.zeros(pad + 1, dtype=torch.long, device=device)
        return (torch.cat([minus[:1], parents, minus[1:]]), torch.cat([zeros[:1], depth, zeros[1:]]),
                torch.arange(num_slots, device=device) <= n)  # fmt: skip

    par, dep, valid = constant(("sampled_tree_shape", str(device), num_slots, n, *shape), padded)
    count = constant(("sampled_tree_nodes", str(device), batch, n),
                     lambda: torch.full((batch,), n + 1, dtype=torch.long, device=device))  # fmt: skip
    root = root.reshape(-1, 1).long()
    all_tokens = torch.cat([root, tokens.long(), root.expand(-1, pad)], 1)
    return DeviceTree(all_tokens, par.expand(batch, -1), dep.expand(batch, -1), valid.expand(batch, -1), count)


def _chain_shape(n: int):
    def shape(device):
        steps = torch.arange(n, device=device)
        return steps, steps + 1

    return shape


@dataclass(frozen=True)
class SampledChain:
    """A chain of ``k`` tokens sampled from q, one per depth (speculative sampling's draft): ``SampledChain(4)``.

    Depth d's token is a Gumbel-max sample of the processed ``logq[:, d-1]`` (module docstring; the smallest
    exponential key ``q / log(u)``, ``draws.exponential_keys``, at ``noise[:, d-1]``); at
    ``do_sample=False`` it is that row's argmax (the chain of ``Chain(k)``). Reads ``logq`` only.

    Args:
        k (int): drafted tokens per round, >= 1.
        sampling (SamplingParams | None): the call's settings q is processed with; ``generate`` sets them
            (``with_sampling``). None: q as the drafter gives it, sampled.
    """

    k: int = 4
    sampling: SamplingParams | None = None
    reads = ("logq",)
    branching = False

    def __post_init__(self) -> None:
        _check_int("SampledChain", "k", self.k, 1)

    @property
    def stochastic(self) -> bool:
        return _samples(self.sampling)

    @property
    def budget(self) -> int:
        return self.k

    @property
    def max_depth(self) -> int:
        return self.k

    def with_sampling(self, sampling: SamplingParams) -> SampledChain:
        """This policy drawing from q processed with ``sampling`` (``generate`` calls it)."""
        return replace(self, sampling=sampling)

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        logq = _logq(proposal, "SampledChain")
        n = min(self.k, logq.shape[1])
        probs = None
        if self.stochastic:  # the smallest exponential key: a sample of q
            probs = draft_probs(logq[:, :n], self.sampling)  # [B, n, V]: also the rules' q (draft_probs)
            drafts = exponential_keys(probs, noise[:, :n]).argmin(-1)
        else:
            drafts = logq[:, :n].float().argmax(-1)
        tree = _fixed_tree(root, drafts, ("chain",), _chain_shape(n), self.k + 1)
        return tree._replace(max_children=1, draft_probs=probs)


@dataclass(frozen=True)
class SampledTrees:
    """``k`` paths of ``depth`` tokens, each token drawn independently from its depth's q (SpecInfer-style
    multi-draft): ``SampledTrees(4, 3)``.

    ``merge=True`` (default) merges the paths into a trie (``specdec.kernels.path_trie``, as ``trie_device`` does;
    one launch on CUDA; siblings appear in the order of the
    first path that drew them): the siblings of a node are then the distinct tokens of i.i.d. draws in order of
    first appearance, which is the law of sampling *without* replacement, so the without-replacement rules are
    the exact ones for it. ``merge=False`` keeps the ``k`` paths as separate branches of the root (duplicate
    siblings included): the root's children are i.i.d. draws *with* replacement, for SpecInfer's original rule.
    At ``do_sample=False`` every path is the argmax path (one chain, or ``k`` copies of it unmerged).

    Path m's depth-d token is an inverse-CDF draw at uniform pair m of ``noise[:, d-1]`` (needs ``2k <= V``; the
    ``k`` draws of a depth share one float64 cumulative sum of q).

    Args:
        k (int): paths, >= 1.
        depth (int): tokens per path, >= 1 (drafters may draft fewer; the paths are cut there).
        merge (bool): merge shared prefixes into a trie.
        sampling (SamplingParams | None): as :class:`SampledChain`.
    """

    k: int = 4
    depth: int = 4
    merge: bool = True
    sampling: SamplingParams | None = None
    reads = ("logq",)

    def __post_init__(self) -> None:
        _check_int("SampledTrees", "k", self.k, 1)
        _check_int("SampledTrees", "depth", self.depth, 1)
        if not isinstance(self.merge, bool):
            raise ValueError(f"SampledTrees(merge={self.merge!r}): merge must be True or False.")

    @property
    def stochastic(self) -> bool:
        return _samples(self.sampling)

    @property
    def branching(self) -> bool:
        return self.k > 1

    @property
    def budget(self) -> int:
        return self.k * self.depth  # every path's every node: no path is ever cut

    @property
    def max_depth(self) -> int:
        return self.depth

    def with_sampling(self, sampling: SamplingParams) -> SampledTrees:
        """This policy drawing from q processed with ``sampling`` (``generate`` calls it)."""
        return replace(self, sampling=sampling)

    def paths(self, proposal: Proposal, noise=None) -> torch.Tensor:
        """The drawn paths ``[B, k, L]`` (``L = min(depth, D)``)."""
        return self._draws(proposal, noise)[0]

    def _draws(self, proposal: Proposal, noise) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drawn paths and the processed q they were drawn from (``[B, L, V]``; None at ``do_sample=False``)."""
        logq = _logq(proposal, "SampledTrees")
        length = min(self.depth, logq.shape[1])
        if not self.stochastic:
            return logq[:, None, :length].float().argmax(-1).expand(-1, self.k, -1), None
        vocab = logq.shape[-1]
        if 2 * self.k > vocab:
            raise ValueError(f"SampledTrees(k={self.k}) draws k paths from 2 uniforms each: needs 2k <= V = {vocab}.")
        probs = draft_probs(logq[:, :length], self.sampling)  # [B, L, V]
        # [B, L, k]: one float64 cumulative sum per row; one launch on CUDA (``Backends.categorical_draws``)
        draws = categorical_draws(probs, noise[:, :length], self.k, impl=_DRAWS_IMPL)
        return draws.transpose(1, 2), probs

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        paths, probs = self._draws(proposal, noise)  # probs: also the rules' q (the tree's draft_probs)
        # k paths: at most k children
        return self._build(paths, root)._replace(max_children=self.k, draft_probs=probs)

    def _build(self, paths: torch.Tensor, root: torch.Tensor) -> DeviceTree:
        batch, k, length = paths.shape
        slots = self.budget + 1
        if self.merge:  # one launch on CUDA (``Backends.path_trie``), else the reference's tensor ops
            return DeviceTree(*path_trie(paths, root.reshape(-1).long(), slots, impl=_TRIE_IMPL))

        def shape(device):  # path m's depth-d node sits at slot 1 + m L + d
            slot = torch.arange(1, k * length + 1, device=device)
            depths = (slot - 1) % length + 1
            return torch.where(depths > 1, slot - 1, 0), depths

        return _fixed_tree(root, paths.reshape(batch, -1), ("paths", k, length), shape, slots)


@dataclass(frozen=True)
class GumbelTopKTree:
    """A tree of fixed widths whose siblings are drawn from q *without* replacement by Gumbel-top-k (RSD / Sequoia
    style): ``GumbelTopKTree((3, 2, 1))`` gives every node of depth d-1 ``widths[d-1]`` children.

    Per depth one Gumbel perturbation of the processed ``log q`` (``noise[:, d-1]``) is drawn; its ``widths[d-1]``
    largest tokens, in decreasing order, are the children of every node of that depth, so every node's children
    are a sample without replacement from q in draw order. One draw per depth is enough for rules that walk down
    one node per depth (multi-draft rejection) but not for rules that revisit siblings' subtrees (traversal
    verification refuses this policy). Tokens past q's support (top-k / top-p) fill the remaining siblings and are
    never accepted. At ``do_sample=False``: the ``widths`` largest ``logq`` per depth (ties: the smallest id).

    Args:
        widths (tuple[int, ...]): children per node at each depth, each >= 1; the tree holds
            ``w1 + w1 w2 + ...`` nodes.
        sampling (SamplingParams | None): as :class:`SampledChain`.
    """

    widths: tuple[int, ...] = (2, 2, 2)
    sampling: SamplingParams | None = None
    reads = ("logq",)

    def __post_init__(self) -> None:
        widths = tuple(self.widths) if isinstance(self.widths, list | tuple) else self.widths
        if not isinstance(widths, tuple) or not widths:
            raise ValueError(f"GumbelTopKTree(widths={self.widths!r}): give a non-empty tuple of ints >= 1.")
        for w in widths:
            _check_int("GumbelTopKTree", "widths[i]", w, 1)
        object.__setattr__(self, "widths", widths)

    @property
    def stochastic(self) -> bool:
        return _samples(self.sampling)

    @property
    def branching(self) -> bool:
        return any(w > 1 for w in self.widths)

    @property
    def max_depth(self) -> int:
        return len(self.widths)

    @property
    def budget(self) -> int:
        return sum(self._level_sizes(len(self.widths)))

    def _level_sizes(self, length: int) -> list[int]:
        sizes, n = [], 1
        for w in self.widths[:length]:
            n *= w
            sizes.append(n)
        return sizes

    def with_sampling(self, sampling: SamplingParams) -> GumbelTopKTree:
        """This policy drawing from q processed with ``sampling`` (``generate`` calls it)."""
        return replace(self, sampling=sampling)

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        logq = _logq(proposal, "GumbelTopKTree")
        length = min(len(self.widths), logq.shape[1])
        vocab = logq.shape[-1]
        tokens = []
        sizes = self._level_sizes(length)
        for d, size in enumerate(sizes):
            width = self.widths[d]
            if width > vocab:
                raise ValueError(f"GumbelTopKTree(widths={self.widths}): a width above the vocabulary ({vocab}).")
            if self.stochastic:
                scores = draft_logprobs(logq[:, d], self.sampling) + gumbel_from_uniform(noise[:, d].float())
            else:
                scores = logq[:, d].float()
            ranked = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :width]  # [B, width]
            tokens.append(ranked.repeat(1, size // width))

        def shape(device):
            parents, depths, first = [], [], 1  # ``first``: slot of the level's first node
            for d, size in enumerate(sizes):
                reps = size // self.widths[d]
                above = first - reps  # slot of the level above's first node
                level = torch.arange(size, device=device)
                parents.append(level // self.widths[d] + above if d else level * 0)
                depths.append(torch.full_like(level, d + 1))
                first += size
            return torch.cat(parents), torch.cat(depths)

        tree = _fixed_tree(root, torch.cat(tokens, 1), ("gumbel", self.widths, *sizes), shape, self.budget + 1)
        return tree._replace(max_children=max(self.widths))


@dataclass(frozen=True)
class StochasticDDTree:
    """The DDTree's shape with its tokens drawn from q without replacement: ``StochasticDDTree(15, 8)``.

    The shape (how many children each node gets, and where every node sits) is the deterministic best-first
    ``DDTree(budget, topk)`` over the drafter's unperturbed ``logq``; only the tokens are drawn. Per depth d one
    Gumbel perturbation of the processed ``log q`` (``noise[:, d-1]``) is ranked (Gumbel-top-k: a sample without
    replacement in draw order, Plackett-Luce; computed as the increasing exponential keys ``q / log(u)``,
    ``draws.exponential_keys``, the same order), and the j-th child (slot order) of every depth-(d-1) node carries
    the j-th token of that ranking. In the deterministic DDTree a node's children are its depth's ranks
    ``0 .. c-1`` in slot order, so at ``do_sample=False`` (no perturbation: the ranking is ``logq``'s) this is
    exactly ``DDTree(budget, topk)``, which is built then.

    Why the shape comes from the unperturbed q: multi-draft rejection without replacement (RSD) tests a node's
    children in turn and is exact when the k-th child, given everything before it, is a draw of q without the
    earlier siblings' tokens. That holds for a sibling count fixed before the node's draws (or a stopping time of
    them). A best-first tree over the *perturbed* scores would give a node more children when its own draws come
    out large (their summed scores win the budget), so the count would depend on the values drawn and RSD would
    be biased. Here the count is a function of q alone, i.e. of the committed tokens, fixed before any draw.

    Exact for ``MultiDraftRejection(replacement=False)``: the walk reads the children of one node per depth, and
    depth d+1's perturbation is independent of everything that led the walk to its depth-d node (as for
    :class:`GumbelTopKTree`; q is per depth, as DFlash's). All nodes of a depth share one perturbation, so the rules
    that revisit rejected siblings' subtrees (traversal verification) and the rules for i.i.d. siblings refuse
    it. Tokens past q's support (top-k / top-p) fill remaining siblings and are never accepted.

    Args:
        budget (int): non-root nodes, >= 1 (as ``DDTree``).
        topk (int | None): candidates per depth, >= 1; None means ``budget`` (as ``DDTree``).
        sampling (SamplingParams | None): as :class:`SampledChain`.
    """

    budget: int = 15
    topk: int | None = None
    sampling: SamplingParams | None = None
    reads = ("logq",)
    branching = True

    def __post_init__(self) -> None:
        _check_int("StochasticDDTree", "budget", self.budget, 1)
        if self.topk is not None:
            _check_int("StochasticDDTree", "topk", self.topk, 1)

    @property
    def stochastic(self) -> bool:
        return _samples(self.sampling)

    @property
    def max_depth(self) -> int:
        return self.budget

    @property
    def effective_topk(self) -> int:
        return self.budget if self.topk is None else min(self.topk, self.budget)

    def with_sampling(self, sampling: SamplingParams) -> StochasticDDTree:
        """This policy drawing from q processed with ``sampling`` (``generate`` calls it)."""
        return replace(self, sampling=sampling)

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        logq = _logq(proposal, "StochasticDDTree")
        if not self.stochastic:  # the unperturbed q's DDTree itself
            shape = DDTree(self.budget, self.topk).build(Proposal(logq=logq), root, depth)
            return shape._replace(max_children=self.effective_topk)  # the DDTree's children are top-k ranks
        length, vocab = noise.shape[1], logq.shape[-1]
        logq = logq[:, :length]
        k = min(self.effective_topk, vocab)
        probs = draft_probs(logq, self.sampling)  # [B, L, V]: also the rules' q (the tree's draft_probs)
        keys = exponential_keys(probs, noise[:, :length])
        drawn = topk_last(keys, k, largest=False)[1]  # [B, L, k]: each depth's draws without replacement
        # The unperturbed q's DDTree, its node of rank r at depth d taking draw r of depth d: a node's siblings are
        # ranks 0, 1, ... in slot order, so each node takes the draw of its place among its parent's children,
        # written by the selection itself.
        tree = ddtree_trees(logq, root, budget=self.budget, topk=self.topk, rank_tokens=drawn)
        return tree._replace(max_children=self.effective_topk, draft_probs=probs)


register_tree("sampled-chain", SampledChain)
register_tree("sampled-trees", SampledTrees)
register_tree("gumbel-topk", GumbelTopKTree)
register_tree("stochastic-ddtree", StochasticDDTree)
