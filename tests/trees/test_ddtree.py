"""Property tests of the host DDTree oracle (the best-first heap) and the argmax chain against brute-force
enumeration; the library's device builders are checked against this oracle in ``test_device_trees.py``."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.ddtree_heap import build_ddtree, chain_from_logq, tree_path_scores

# Few distinct values (and -inf) so that ties, the interesting case for reproducibility, are common.
_VALUES = [0.0, -0.5, -1.0, -1.5, -3.0, float("-inf")]


@st.composite
def _logq_cases(draw, max_depth: int = 4, max_vocab: int = 5):
    depth = draw(st.integers(1, max_depth))
    vocab = draw(st.integers(1, max_vocab))
    if draw(st.booleans()):
        row = st.lists(st.sampled_from(_VALUES), min_size=vocab, max_size=vocab)
        rows = draw(st.lists(row, min_size=depth, max_size=depth))
        logq = torch.tensor(rows, dtype=torch.float32)
    else:
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        logq = torch.log_softmax(2.0 * torch.randn(depth, vocab, generator=gen), dim=-1)
    budget = draw(st.integers(1, 12))
    topk = draw(st.none() | st.integers(1, 6))
    return logq, budget, topk


def _paths(tree) -> list[tuple[int, ...]]:
    """Token path (root excluded) of every node, in node order."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(tokens)):
        paths.append((*paths[parents[i]], tokens[i]))
    return paths


def _brute_force(logq: torch.Tensor, budget: int, topk: int | None) -> list[tuple[int, ...]]:
    """All prefixes over the top-``topk`` tokens per depth, sorted by (-score, rank tuple); the first ``budget``."""
    depth, vocab = logq.shape
    width = min(budget if topk is None else topk, budget, vocab)
    rows = logq.tolist()
    # Rank r at depth d = r-th token by (log-prob descending, id ascending).
    order = [sorted(range(vocab), key=lambda v, row=row: (-row[v], v))[:width] for row in rows]
    prefixes = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(width), repeat=d):
            score = 0.0
            for j, r in enumerate(ranks):
                score += rows[j][order[j][r]]
            prefixes.append((-score, ranks, tuple(order[j][r] for j, r in enumerate(ranks))))
    prefixes.sort(key=lambda p: (p[0], p[1]))
    return [p[2] for p in prefixes[:budget]]


@settings(max_examples=150, deadline=None)
@given(_logq_cases())
def test_build_ddtree_matches_brute_force(case):
    logq, budget, topk = case
    tree = build_ddtree(logq, 7, budget=budget, topk=topk)
    assert _paths(tree)[1:] == _brute_force(logq, budget, topk)


@settings(max_examples=80, deadline=None)
@given(_logq_cases(max_depth=6, max_vocab=12))
def test_build_ddtree_is_a_prefix_closed_tree(case):
    logq, budget, topk = case
    tree = build_ddtree(logq, 7, budget=budget, topk=topk)
    depth, vocab = logq.shape
    width = min(budget if topk is None else topk, budget, vocab)
    reachable = sum(width**d for d in range(1, depth + 1))
    parents = tree.parents.tolist()
    assert tree.tokens[0].item() == 7 and parents[0] == -1
    assert all(0 <= parents[i] < i for i in range(1, len(parents)))
    assert tree.num_nodes == 1 + min(budget, reachable)
    assert tree.max_depth <= depth
    paths = _paths(tree)
    assert len(set(paths)) == len(paths)  # no two siblings carry the same token
    assert {p[:-1] for p in paths[1:]} <= set(paths)  # prefix-closed
    assert tree.tokens.dtype == torch.long and tree.parents.dtype == torch.long


@settings(max_examples=80, deadline=None)
@given(_logq_cases(max_depth=6, max_vocab=12))
def test_build_ddtree_scores_non_increasing(case):
    logq, budget, topk = case
    scores = tree_path_scores(build_ddtree(logq, 7, budget=budget, topk=topk), logq)[1:]
    assert bool((scores[1:] <= scores[:-1]).all())


@settings(max_examples=60, deadline=None)
@given(_logq_cases(max_depth=6, max_vocab=8), st.integers(1, 8))
def test_build_ddtree_topk_one_equals_chain(case, k):
    logq = case[0]
    chain = chain_from_logq(logq, 3, k=k)
    assert chain.num_nodes == 1 + min(k, logq.shape[0])
    assert chain.parents.tolist() == list(range(-1, chain.num_nodes - 1))
    if k <= logq.shape[0]:
        tree = build_ddtree(logq, 3, budget=k, topk=1)
        assert torch.equal(tree.tokens, chain.tokens) and torch.equal(tree.parents, chain.parents)


def test_chain_from_logq_takes_argmax_smallest_id_on_ties():
    logq = torch.tensor([[-2.0, -1.0, -1.0], [0.0, -5.0, -5.0], [-1.0, -1.0, -1.0]])
    assert chain_from_logq(logq, 9, k=5).tokens.tolist() == [9, 1, 0, 0]
    assert chain_from_logq(logq, 9, k=2).tokens.tolist() == [9, 1, 0]


def test_build_ddtree_keeps_smallest_ids_at_the_topk_cut():
    # Four tokens tie for the second place; topk = 2 must keep id 1 whatever torch.topk returns.
    logq = torch.log_softmax(torch.tensor([[3.0, 1.0, 1.0, 1.0, 1.0]]), dim=-1)
    tree = build_ddtree(logq, 0, budget=4, topk=2)
    assert tree.tokens.tolist() == [0, 0, 1]


def test_build_ddtree_low_precision_input():
    gen = torch.Generator().manual_seed(0)
    logq = torch.log_softmax(torch.randn(5, 50, generator=gen), dim=-1).bfloat16()
    tree = build_ddtree(logq, 1, budget=20, topk=4)
    assert _paths(tree)[1:] == _brute_force(logq.float(), 20, 4)


@pytest.mark.gpu
def test_build_ddtree_device_matches_cpu():
    gen = torch.Generator().manual_seed(0)
    logq = torch.log_softmax(torch.randn(15, 1000, generator=gen), dim=-1)
    cpu = build_ddtree(logq, 5, budget=64, topk=8)
    dev = build_ddtree(logq.cuda(), 5, budget=64, topk=8)
    assert dev.tokens.device.type == "cuda" and dev.parents.device.type == "cpu"
    assert torch.equal(dev.tokens.cpu(), cpu.tokens) and torch.equal(dev.parents, cpu.parents)


@pytest.mark.parametrize(
    ("logq", "kwargs", "match"),
    [
        (torch.zeros(2, 3), {"budget": 0}, "budget=0"),
        (torch.zeros(2, 3), {"budget": 4, "topk": 0}, "topk=0"),
        (torch.zeros(2, 3), {"budget": 2.5}, "budget=2.5"),
        (torch.zeros(1, 2, 3), {"budget": 4}, "2-D"),
        (torch.zeros(3), {"budget": 4}, "2-D"),
        (torch.zeros(0, 3), {"budget": 4}, "at least one depth"),
        (torch.zeros(2, 3, dtype=torch.long), {"budget": 4}, "float"),
        (torch.tensor([[0.0, float("nan")]]), {"budget": 4}, "NaN"),
        (torch.tensor([[1.0, 0.0]]), {"budget": 4}, "log_softmax"),
    ],
    ids=["budget0", "topk0", "budget-float", "3d", "1d", "no-depth", "int-dtype", "nan", "logits"],
)
def test_build_ddtree_rejects_bad_input(logq, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_ddtree(logq, 0, **kwargs)


def test_chain_from_logq_rejects_bad_input():
    with pytest.raises(ValueError, match="k=0"):
        chain_from_logq(torch.zeros(2, 3), 0, k=0)
    with pytest.raises(ValueError, match="2-D"):
        chain_from_logq(torch.zeros(3), 0, k=1)


def test_tree_path_scores_sums_along_paths():
    logq = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.125, 0.75, 0.125]]))
    tree = build_ddtree(logq, 0, budget=3)
    # Pops: token 0 (p = .5), then 0 -> 1 (p = .375), then token 1 at depth 1 (p = .25).
    assert tree.tokens.tolist() == [0, 0, 1, 1]
    expected = torch.log(torch.tensor([1.0, 0.5, 0.375, 0.25], dtype=torch.float64))
    torch.testing.assert_close(tree_path_scores(tree, logq), expected, rtol=0, atol=1e-6)
