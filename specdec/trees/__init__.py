"""Draft trees: the tree policies (``Chain``, ``DDTree``, the ``TreePolicy`` protocol and its registry; the trees
sampled from the draft distribution: ``SampledChain``, ``SampledTrees``, ``GumbelTopKTree``,
``StochasticDDTree``; EAGLE-2's ``DynamicTree`` over a drafter's candidate tree) and the device
builders and masks they use. Trees are parent arrays; notation in ``docs/trees.md``.
"""

from specdec.trees.build import (
    ancestor_matrix,
    chain_device,
    chain_from_path,
    ddtree_device,
    trie_device,
)
from specdec.trees.dynamic import DynamicTree, rerank_candidates
from specdec.trees.mask import ancestor_mask, tree_attention_bias, tree_position_ids
from specdec.trees.policies import TREES, Chain, DDTree, TreePolicy, register_tree
from specdec.trees.sampled import GumbelTopKTree, SampledChain, SampledTrees, StochasticDDTree

__all__ = [
    "TREES",
    "Chain",
    "DDTree",
    "DynamicTree",
    "GumbelTopKTree",
    "SampledChain",
    "SampledTrees",
    "StochasticDDTree",
    "TreePolicy",
    "ancestor_mask",
    "ancestor_matrix",
    "chain_device",
    "chain_from_path",
    "ddtree_device",
    "register_tree",
    "rerank_candidates",
    "tree_attention_bias",
    "tree_position_ids",
    "trie_device",
]
