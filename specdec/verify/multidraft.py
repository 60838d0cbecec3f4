"""Recursive rejection sampling over the children of each node (SpecInfer; RSD's without-replacement form), and
the walk it shares with speculative sampling (``speculative.py``). Arguments: ``docs/verification.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.backends import env_default
from specdec.kernels.tree_rejection import rejection_walk, tree_rejection_round
from specdec.types import Accept, DeviceTree, SamplingParams
from specdec.verify.draws import WeighsQ
from specdec.verify.rules import register_rule

__all__ = ["MultiDraftRejection", "check_sampled_policy", "recursive_rejection"]


# The round's kernel (setup and sibling-rank loop, ``docs/kernels.md``): "auto" = the one-launch Triton kernel on
# CUDA, tensor ops elsewhere. Set through ``specdec.backends`` (``tree_rejection``).
_REJECTION_IMPL = env_default("tree_rejection")


def check_sampled_policy(rule: str, sampling: SamplingParams, tree, exact_for: dict[str, str]) -> None:
    """Refuse ``tree`` unless its class name is a key of ``exact_for`` (the value says what else it needs, or is
    empty), and a policy already bound to other sampling settings than the call's (``with_sampling``). ``tree`` None
    is plain decoding (no drafts: the rule samples the target at the root alone, exact for every rule)."""
    if tree is None:
        return
    name = type(tree).__name__
    if name not in exact_for:
        names = ", ".join(f"{n}{exact_for[n] and f' ({exact_for[n]})'}" for n in exact_for)
        raise ValueError(
            f"verifier={rule} weighs the draft distribution q and is exact only for trees sampled from q: {names}; "
            f"got tree={name}. Pass one of those trees, or verifier=SampleMatch() for any tree."
        )
    bound = getattr(tree, "sampling", None)
    if bound is not None and bound != sampling:
        raise ValueError(
            f"tree={name} was bound to {bound} but the call samples with {sampling}: the rule and the policy must "
            "process q with the same settings (generate binds the tree with tree.with_sampling(sampling))."
        )


def recursive_rejection(
    tree: DeviceTree,
    p: torch.Tensor,
    q: torch.Tensor,
    noise: torch.Tensor,
    max_depth: int,
    replacement: bool,
    q_by_depth: bool = False,
) -> Accept:
    """The accepted paths of recursive rejection sampling.

    From the root, each child ``c`` of the current node (in slot order) is tested: accepted with probability
    ``min(1, r(c) / q_c(c))`` where ``r`` is the current node's target distribution, reduced by the children
    rejected so far, and ``q_c`` the distribution ``c`` was drawn from (its depth's q; without replacement, q with
    the earlier siblings' tokens removed, renormalised). A rejection sets ``r <- norm(max(0, r - q_c))``; an
    acceptance makes ``c`` the current node, ``r = p_c``. When no child is left, the token drawn from ``r`` is the
    bonus.

    What happens at a node depends only on that node (its ``p``, its children and their uniforms), not on the
    path that reached it, so every node's children are tested at once, one sibling rank per step (``K`` steps,
    ``tree.max_children``, whatever the tree's size; ``tree_rejection_round``, one launch on CUDA); the walk then
    follows each node's accepted child from the root (pointer doubling: ``max_depth.bit_length()`` levels). The
    uniforms are the slots': a child's test reads its own slot's, the final draw the slot where the walk ends.

    Args:
        tree (DeviceTree): ``[B, S]``.
        p (torch.Tensor): ``[B, S, V]`` float32 (or float64) target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` draft distribution each node was drawn from, p's dtype (read at the real
            children only); ``q_by_depth``: ``[B, D, V]``, one row per depth (``depth_proposals``), node ``s``
            drawn from row ``depth_s - 1``.
        noise (torch.Tensor): ``[B, S, >= 4]`` uniforms (``draws.uniform`` 0: the node's test, 1: the final draw).
        max_depth (int): the deepest node; the result has ``max_depth + 1`` slots.
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).
        q_by_depth (bool): ``q`` holds one row per depth (read in place by the round's kernel).
    """
    # a child's test reads its own slot's first uniform, the bonus the end slot's second: each one's float32 halves
    # (made into the float64 uniform inside the kernels, by draws.uniforms in the references)
    r, nxt = tree_rejection_round(tree.tokens, tree.parents, tree.depth, tree.valid, p, q, noise[..., 0:2],
                                  tree.max_children, replacement, q_by_depth=q_by_depth,
                                  impl=_REJECTION_IMPL)  # fmt: skip
    # the walk from the root along each node's accepted child, and the bonus from where it ends
    return rejection_walk(tree.tokens, tree.depth, nxt, r, noise[..., 2:4], max_depth, impl=_REJECTION_IMPL)


@dataclass(frozen=True)
class MultiDraftRejection(WeighsQ):
    """Multi-draft recursive rejection sampling over the children of each node.

    ``replacement=True`` is SpecInfer's rule: the children of a node are i.i.d. draws from q, tested in order
    against the target's distribution reduced by every rejection. Exact for ``SampledChain`` and
    ``SampledTrees(merge=False)`` (duplicate siblings kept). Not for the merged trie: merging duplicates changes
    the siblings' law to sampling without replacement, where this rule is biased (refused).

    ``replacement=False`` is the without-replacement form (RSD): the k-th sibling is weighed against q with the
    earlier siblings' tokens removed (a sibling repeating one of them has probability 0 there and is skipped).
    Exact for ``SampledChain``, ``SampledTrees`` (merged or not: the distinct tokens of i.i.d. draws in order of
    first appearance are a sample without replacement), ``GumbelTopKTree`` and ``StochasticDDTree`` (Gumbel-top-k
    siblings in draw order; the stochastic DDTree's sibling counts come from the unperturbed q, never from the draws).

    At ``do_sample=False`` q is the one-hot of the drafter's argmax and p the target's: a child is accepted iff
    it carries the target's argmax, the residual after a rejection is p's argmax again, so the rule is
    :class:`~specdec.verify.Greedy`'s walk (exact for any tree).

    Args:
        replacement (bool): SpecInfer's rule (True, default) or RSD's (False).
    """

    replacement: bool = True
    name = "multi-draft"
    q_by_depth = True  # verify takes q as one row per depth (the round kernel reads each child's row in place)

    def __post_init__(self) -> None:
        if not isinstance(self.replacement, bool):
            raise TypeError(f"MultiDraftRejection: replacement={self.replacement!r} must be True (SpecInfer's rule) "
                            "or False (RSD's, without replacement).")  # fmt: skip

    def check(self, sampling: SamplingParams, tree) -> None:
        if self.replacement:
            exact_for = {"SampledChain": "", "SampledTrees": "merge=False"}
            if type(tree).__name__ == "SampledTrees" and getattr(tree, "merge", False):
                raise ValueError(
                    "MultiDraftRejection(replacement=True) is not exact for SampledTrees(merge=True): merged "
                    "duplicate siblings are a sample without replacement; use MultiDraftRejection(replacement="
                    "False) or SampledTrees(..., merge=False)."
                )
        else:
            exact_for = {"SampledChain": "", "SampledTrees": "", "GumbelTopKTree": "", "StochasticDDTree": ""}
        check_sampled_policy(f"MultiDraftRejection(replacement={self.replacement})", sampling, tree, exact_for)

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise, max_depth: int) -> Accept:
        return recursive_rejection(tree, p, q, noise, max_depth, self.replacement, q_by_depth=self.q_by_depth)


register_rule("multi-draft", MultiDraftRejection)
