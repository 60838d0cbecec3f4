"""Traversal verification (Weng et al., NeurIPS 2025): a sampled tree verified leaf to root, whole paths at once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.tree_traversal import MAX_SLOTS, traversal_round
from specdec.kernels.tree_traversal import postorder as kernel_postorder
from specdec.types import Accept, DeviceTree, SamplingParams
from specdec.verify.draws import WeighsQ
from specdec.verify.multidraft import check_sampled_policy
from specdec.verify.rules import register_rule

__all__ = ["TraversalVerification", "kernel_runs", "postorder", "traversal_verify"]

# The round's implementation: ``specdec.kernels.tree_traversal``'s Triton launches on CUDA, tensor ops elsewhere. Set
# through ``specdec.backends`` (``tree_traversal``).
_TRAVERSAL_IMPL = env_default("tree_traversal")


def postorder(tree: DeviceTree, max_depth: int) -> torch.Tensor:
    """``[B, S]`` slots of ``tree`` in depth-first post-order, children in slot order: the real non-root nodes, then
    the root, then the padding (``specdec.kernels.tree_traversal.postorder``)."""
    return kernel_postorder(tree.parents, tree.depth, max_depth)


def kernel_runs(p: torch.Tensor) -> bool:
    """Whether ``traversal_verify`` on ``p [B, S, V]`` runs the Triton round (``Backends(tree_traversal=...)``, the
    device, the slot bound)."""
    module = "specdec.kernels.tree_traversal.triton"
    return pick_impl(_TRAVERSAL_IMPL, p.device, module, fits=p.shape[1] <= MAX_SLOTS) == "triton"


def traversal_verify(tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor, max_depth: int,
                     replacement: bool, q_by_depth: bool = False) -> Accept:  # fmt: skip
    """Traversal verification over ``tree``, nodes visited in post-order (``postorder``).

    Each node ``a`` with parent ``b`` carries a weight, set when its subtree is entered (its earlier siblings'
    subtrees all rejected): ``w_a = min(1, w_b P_b(x_a) / Q_a(x_a))``, the capped likelihood ratio of the path
    (``w_root = 1``; ``P_b`` the parent's current target distribution, ``Q_a`` the distribution ``a`` was drawn
    from). A node is tested once its children are all rejected: accepted with probability ``w_a`` (then the path
    root..a is accepted and the bonus drawn from ``P_a``), else it is removed and its parent corrected:
    ``P_b <- norm(max(0, w_b P_b - Q_a))``, ``w_b <- |.| / (|.| + 1 - w_b)``. If every node is rejected the
    bonus is drawn from the root's corrected ``P``. On a chain this is block verification.

    The round itself is ``specdec.kernels.tree_traversal.traversal_round``: two Triton launches on CUDA, tensor ops
    elsewhere (``Backends(tree_traversal=...)``).

    Args:
        tree (DeviceTree): ``[B, S]``.
        p (torch.Tensor): ``[B, S, V]`` float32 (or float64) target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` draft distribution of each node's depth, p's dtype (read at real non-root
            nodes only); ``q_by_depth``: ``[B, D, V]``, one row per depth (``depth_proposals``).
        noise (torch.Tensor): ``[B, S, >= 4]`` uniforms (``draws.uniform`` 0: the node's test, 1: the final draw).
        max_depth (int): the deepest node; the result has ``max_depth + 1`` slots.
        replacement (bool): siblings are i.i.d. draws (True) or a sample without replacement (False).
        q_by_depth (bool): ``q`` holds one row per depth (read in place by the round's kernel).
    """
    # each slot's two uniforms as their float32 halves (made float64 inside the kernel, by draws.uniforms in the
    # reference)
    return traversal_round(tree.tokens, tree.parents, tree.depth, tree.valid, p, q, noise[..., 0:2], noise[..., 2:4],
                           max_depth, replacement, q_by_depth=q_by_depth, impl=_TRAVERSAL_IMPL)  # fmt: skip


@dataclass(frozen=True)
class TraversalVerification(WeighsQ):
    """Traversal verification: leaf-to-root over the whole tree (``traversal_verify``); a node is accepted on the
    capped likelihood ratio of its whole path, and a rejected subtree corrects its parent instead of ending the
    round, so deep candidates under a doubtful parent still count. On a chain it is :class:`BlockVerification`.

    ``replacement=False`` (default): siblings are a sample without replacement (a sibling repeating an earlier
    one's token has probability 0 and is skipped with its subtree); exact for ``SampledChain`` and
    ``SampledTrees`` (merged or not). ``replacement=True``: siblings are i.i.d. draws; exact for ``SampledChain``
    and ``SampledTrees(merge=False)``, not for the merged trie (refused). The rule reads rejected siblings'
    subtrees, so every node's children must be drawn independently of the other nodes' at its depth:
    ``GumbelTopKTree`` and ``StochasticDDTree`` (one draw per depth) are refused. At ``do_sample=False`` it is
    :class:`~specdec.verify.Greedy`.

    Args:
        replacement (bool): the siblings' law, as above.
    """

    replacement: bool = False
    name = "traversal"
    q_by_depth = True  # verify takes q as one row per depth (the round's kernels read each node's row in place)

    def check(self, sampling: SamplingParams, tree) -> None:
        if tree is None:  # plain decoding: the root alone
            return
        name = type(tree).__name__
        if name == "SampledTrees" and self.replacement and getattr(tree, "merge", True):
            raise ValueError(
                "TraversalVerification(replacement=True) is not exact for SampledTrees(merge=True): merged "
                "duplicate siblings are a sample without replacement; use replacement=False or merge=False."
            )
        if name in ("GumbelTopKTree", "StochasticDDTree"):
            raise ValueError(
                f"TraversalVerification is not exact for {name}: the tree shares one draw per depth between "
                "all nodes of that depth, and traversal reads the subtrees of rejected siblings; use "
                f"SampledTrees, or MultiDraftRejection(replacement=False) with {name}."
            )
        merge = "merge=False" if self.replacement else ""
        check_sampled_policy(f"TraversalVerification(replacement={self.replacement})", sampling, tree,
                             {"SampledChain": "", "SampledTrees": merge})  # fmt: skip

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise, max_depth: int) -> Accept:
        return traversal_verify(tree, p, q, noise, max_depth, self.replacement, q_by_depth=self.q_by_depth)


register_rule("traversal", TraversalVerification)
