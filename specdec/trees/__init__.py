"""Pure functions on draft trees: builders (chain, DDTree), ancestor masks and positions.

Trees are parent arrays (``specdec.types.DraftTree``); notation in ``docs/trees.md``.
"""

from specdec.trees.ddtree import build_ddtree, chain_from_logq, tree_path_scores
from specdec.trees.device import DeviceTree, ancestor_matrix, chain_device, ddtree_device, to_draft_tree
from specdec.trees.mask import ancestor_mask, tree_attention_bias, tree_position_ids
from specdec.trees.paths import chain_tree, paths_to_tree, prune_depth, root_tree

__all__ = [
    "DeviceTree",
    "ancestor_mask",
    "ancestor_matrix",
    "build_ddtree",
    "chain_device",
    "chain_from_logq",
    "chain_tree",
    "ddtree_device",
    "paths_to_tree",
    "prune_depth",
    "root_tree",
    "to_draft_tree",
    "tree_attention_bias",
    "tree_path_scores",
    "tree_position_ids",
]
