"""Parent-array trees: validation, masks and positions; the host oracles' tries, pruning and greedy walk."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.host_trees import chain_tree, paths_to_tree, prune_depth
from oracles.walk import walk_tree

from specdec.trees import ancestor_mask, tree_attention_bias, tree_position_ids
from specdec.types import DraftTree


@st.composite
def parent_arrays(draw, max_nodes=24):
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


def brute_ancestors(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


@settings(max_examples=60, deadline=None)
@given(parent_arrays())
def test_ancestor_mask_matches_brute_force(parents):
    mask = ancestor_mask(torch.tensor(parents))
    for i in range(len(parents)):
        assert set(mask[i].nonzero().squeeze(-1).tolist()) == brute_ancestors(parents, i)


@settings(max_examples=40, deadline=None)
@given(parent_arrays(), st.integers(0, 6))
def test_prune_depth_keeps_prefix_closed_tree(parents, max_depth):
    tree = DraftTree(torch.arange(len(parents)) + 100, torch.tensor(parents))
    pruned = prune_depth(tree, max_depth)
    kept = [i for i in range(len(parents)) if tree.depth[i] <= max_depth]
    assert pruned.tokens.tolist() == [100 + i for i in kept]
    assert pruned.depth.tolist() == [int(tree.depth[i]) for i in kept]


def brute_paths(tokens, parents):
    """Root-to-node token path of every node, by walking the parent pointers."""
    paths = []
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        paths.append(tuple(reversed(path)))
    return paths


@settings(max_examples=60, deadline=None)
@given(parent_arrays(), st.integers(0, 6))
def test_prune_depth_parents_match_brute_force(parents, max_depth):
    """Every kept node keeps its parent (re-indexed among the kept nodes) and its root-to-node token path."""
    tokens = list(range(100, 100 + len(parents)))
    pruned = prune_depth(DraftTree(torch.tensor(tokens), torch.tensor(parents)), max_depth)
    kept = [i for i in range(len(parents)) if len(brute_ancestors(parents, i)) - 1 <= max_depth]
    new_index = {old: new for new, old in enumerate(kept)}
    assert pruned.parents.tolist() == [-1] + [new_index[parents[i]] for i in kept[1:]]
    old_paths = brute_paths(tokens, parents)
    assert brute_paths(pruned.tokens.tolist(), pruned.parents.tolist()) == [old_paths[i] for i in kept]


@settings(max_examples=60, deadline=None)
@given(parent_arrays(), st.integers(0, 50))
def test_tree_position_ids_are_prefix_plus_ancestor_count(parents, prefix_len):
    """Node i sits at ``prefix_len`` + its number of strict ancestors (the position it has on its own path)."""
    tree = DraftTree(torch.zeros(len(parents), dtype=torch.long), torch.tensor(parents))
    positions = tree_position_ids(tree.depth, prefix_len, "cpu")
    want = [prefix_len + len(brute_ancestors(parents, i)) - 1 for i in range(len(parents))]
    assert positions.shape == (1, len(parents)) and positions.dtype == torch.long
    assert positions[0].tolist() == want


def test_draft_tree_rejects_bad_parents():
    with pytest.raises(ValueError, match="root"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"parents\[2\] = 2"):
        DraftTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 2]))
    with pytest.raises(ValueError, match="same length"):
        DraftTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0]))


def test_tree_attention_bias_is_additive_float():
    bias = tree_attention_bias(torch.tensor([-1, 0, 0, 1]), 3, dtype=torch.float32, device="cpu")
    assert bias.shape == (1, 1, 4, 7) and bias.dtype == torch.float32
    assert (bias[0, 0, :, :3] == 0).all()
    visible = bias[0, 0, :, 3:] == 0
    assert visible.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]


def test_paths_to_tree_merges_prefixes_under_budget():
    tree = paths_to_tree(9, [[1, 2, 3], [1, 4], [5]], budget=4)
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 1]


def test_walk_tree_follows_choices_and_appends_bonus():
    tree = DraftTree(torch.tensor([9, 1, 5, 2, 3]), torch.tensor([-1, 0, 0, 1, 1]))
    res = walk_tree(tree, [1, 3, 0, 0, 7])
    assert res.path == (0, 1, 4) and res.tokens == (1, 3, 7) and res.num_accepted == 2
    res = walk_tree(tree, [8, 0, 0, 0, 0])
    assert res.path == (0,) and res.tokens == (8,)
    chain = chain_tree(9, [1, 2])
    assert walk_tree(chain, [1, 2, 6]).tokens == (1, 2, 6)
