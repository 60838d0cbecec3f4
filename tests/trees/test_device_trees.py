"""The device tree builders must return the host oracles' trees exactly (the heap DDTree, the argmax chain, the
trie of drafted paths), padded into fixed slots."""

from __future__ import annotations

import pytest
import torch
from device_trees import padded_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.ddtree_heap import build_ddtree, chain_from_logq
from oracles.host_trees import chain_tree, paths_to_tree, to_draft_tree

from specdec.trees import Chain, DDTree, ancestor_mask
from specdec.trees.build import (
    ancestor_matrix,
    chain_batch,
    chain_device,
    chain_from_path,
    ddtree_device,
    root_tree_device,
    root_trees,
    trie_device,
)
from specdec.types import Proposal, TreeRow

# Few distinct values (-0.0 and -inf included) so that equal scores, the hard case for the order, are common.
_VALUES = [0.0, -0.0, -0.5, -1.0, -1.5, -3.0, float("-inf")]


@st.composite
def _logq(draw, max_depth: int, vocabs: st.SearchStrategy[int], ties: bool) -> torch.Tensor:
    depth, vocab = draw(st.integers(1, max_depth)), draw(vocabs)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if not ties:
        return torch.log_softmax(3.0 * torch.randn(depth, vocab, generator=gen), dim=-1)
    kind = draw(st.sampled_from(["integer", "values", "flat"]))
    if kind == "integer":  # log_softmax of small integers: many equal values per row and across rows
        return torch.log_softmax(torch.randint(-2, 2, (depth, vocab), generator=gen).float(), dim=-1)
    if kind == "flat":  # every token equally likely: all candidates tie
        return torch.full((depth, vocab), -float(torch.log(torch.tensor(float(vocab)))))
    picks = torch.randint(0, len(_VALUES), (depth, vocab), generator=gen)
    return torch.tensor(_VALUES)[picks]  # raw values <= 0, -inf included (even whole rows)


@st.composite
def _cases(draw, max_depth: int = 16, vocabs=None, ties: bool = False, max_budget: int = 130):
    logq = draw(_logq(max_depth, st.integers(1, 64) if vocabs is None else vocabs, ties))
    budget = draw(st.integers(1, max_budget))
    topk = draw(st.none() | st.integers(1, budget))
    num_slots = budget + 1 + draw(st.integers(0, 6))
    root = draw(st.integers(0, 10**6))
    return logq, root, budget, topk, num_slots


def _assert_padded(tree: TreeRow, root: int, num_slots: int, n: int) -> None:
    """Shapes and padding: real nodes are the prefix ``0 .. n-1``, padding holds (root token, -1, depth 0)."""
    for field in (tree.tokens, tree.parents, tree.depth, tree.valid):
        assert field.shape == (num_slots,)
    assert tree.tokens.dtype == tree.parents.dtype == tree.depth.dtype == torch.long
    assert tree.num_nodes.shape == () and int(tree.num_nodes) == n
    assert tree.valid.tolist() == [True] * n + [False] * (num_slots - n)
    assert tree.tokens[n:].eq(root).all() and tree.parents[n:].eq(-1).all() and tree.depth[n:].eq(0).all()


def _assert_matches_heap(logq, root, budget, topk, num_slots, root_shape=()):
    expected = build_ddtree(logq, root, budget=budget, topk=topk)
    tree = ddtree_device(logq, torch.tensor(root).reshape(root_shape), budget=budget, topk=topk, num_slots=num_slots)
    got = to_draft_tree(tree)
    assert got.tokens.tolist() == expected.tokens.tolist()
    assert got.parents.tolist() == expected.parents.tolist()
    assert tree.depth[: got.num_nodes].tolist() == expected.depth.tolist()
    _assert_padded(tree, root, num_slots, expected.num_nodes)


@settings(max_examples=450, deadline=None)
@given(_cases())
def test_ddtree_device_matches_heap_on_random_logq(case):
    _assert_matches_heap(*case)


@settings(max_examples=500, deadline=None)
@given(_cases(max_depth=8, vocabs=st.integers(1, 12), ties=True))
def test_ddtree_device_matches_heap_with_ties_and_neg_inf(case):
    _assert_matches_heap(*case)


@settings(max_examples=100, deadline=None)
@given(_cases(max_depth=16, vocabs=st.sampled_from([2, 3]), ties=True, max_budget=40))
def test_ddtree_device_matches_heap_when_few_nodes_are_reachable(case):
    _assert_matches_heap(*case, root_shape=(1,))


@settings(max_examples=30, deadline=None)
@given(_cases(max_depth=16, vocabs=st.sampled_from([1000, 8192]), ties=False))
def test_ddtree_device_matches_heap_on_large_vocab(case):
    _assert_matches_heap(*case)


@settings(max_examples=40, deadline=None)
@given(_cases(max_depth=8, vocabs=st.integers(1, 40), ties=True, max_budget=40))
def test_ddtree_device_matches_heap_on_bf16(case):
    logq, *rest = case
    _assert_matches_heap(logq.bfloat16(), *rest)


def test_ddtree_device_breaks_cut_off_ties_by_id():
    # Four tokens tie for the second rank; topk = 2 keeps id 1; the tree is then [0, 0 -> 0, ...] by score.
    logq = torch.log_softmax(torch.tensor([[3.0, 1.0, 1.0, 1.0, 1.0]]), dim=-1)
    tree = ddtree_device(logq, torch.tensor(0), budget=4, topk=2, num_slots=6)
    assert tree.tokens.tolist() == [0, 0, 1, 0, 0, 0]
    assert tree.parents.tolist() == [-1, 0, 0, -1, -1, -1]


def test_ddtree_device_orders_equal_scores_by_rank_tuple():
    # Depth-2 log-probs are 0 (one certain token), so every child ties its parent and must follow it directly.
    logq = torch.tensor([[-0.5, -0.5, -1.0], [0.0, float("-inf"), float("-inf")]])
    tree = to_draft_tree(ddtree_device(logq, torch.tensor(9), budget=6, topk=3, num_slots=8))
    # Heap: (0,) then (0,0) [same score], (1,), (1,0), (2,), (2,0), then the -inf ones (0,1) ...
    assert tree.tokens.tolist() == [9, 0, 0, 1, 0, 2, 0]
    assert tree.parents.tolist() == [-1, 0, 1, 0, 3, 0, 5]


@settings(max_examples=120, deadline=None)
@given(_logq(max_depth=8, vocabs=st.integers(1, 10), ties=True), st.integers(1, 12), st.integers(0, 3))
def test_chain_device_matches_chain_from_logq(logq, k, extra):
    length = min(k, logq.shape[0])
    expected = chain_from_logq(logq, 4, k=k)
    tree = chain_device(logq, torch.tensor(4), k=k, num_slots=length + 1 + extra)
    got = to_draft_tree(tree)
    assert got.tokens.tolist() == expected.tokens.tolist() and got.parents.tolist() == expected.parents.tolist()
    assert tree.depth[: length + 1].tolist() == list(range(length + 1))
    _assert_padded(tree, 4, length + 1 + extra, length + 1)
    # topk = 1 DDTree is the same chain (both stop at depth D).
    chain = ddtree_device(logq, torch.tensor(4), budget=k, topk=1, num_slots=k + 1 + extra)
    assert to_draft_tree(chain).tokens.tolist() == expected.tokens.tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 8), st.integers(0, 3))
def test_chain_batch_rows_are_the_oracle_chains_padded(seed, rows, k, extra):
    """``chain_batch`` (its padding made once and reused): row b is the argmax chain of row b, padded; a second
    call with other log-probs (the same shapes) builds its own chains."""
    gen = torch.Generator().manual_seed(seed)
    depth, vocab = 5, 7
    length = min(k, depth)
    for _ in range(2):
        logq = torch.log_softmax(2.0 * torch.randn(rows, depth, vocab, generator=gen), dim=-1)
        roots = torch.randint(0, vocab, (rows,), generator=gen)
        tree = chain_batch(logq, roots, k=k, num_slots=length + 1 + extra)
        for b in range(rows):
            want = chain_from_logq(logq[b], int(roots[b]), k=k)
            got = to_draft_tree(tree.row(b))
            assert got.tokens.tolist() == want.tokens.tolist() and got.parents.tolist() == want.parents.tolist()
            assert tree.depth[b, : length + 1].tolist() == list(range(length + 1))
            _assert_padded(tree.row(b), int(roots[b]), length + 1 + extra, length + 1)


def test_root_trees_are_each_root_alone():
    for roots in ([4, 9], [7, 7], [3]):
        tree = root_trees(torch.tensor(roots))
        for b, root in enumerate(roots):
            _assert_padded(tree.row(b), root, 1, 1)
            assert tree.tokens[b].tolist() == [root] and tree.parents[b].tolist() == [-1]


def test_chain_device_takes_first_maximum_of_logits():
    logits = torch.tensor([[-2.0, 7.0, 7.0], [-0.0, 0.0, -5.0], [1.0, 1.0, 1.0]])  # logits may be > 0
    assert chain_device(logits, torch.tensor(9), k=5, num_slots=5).tokens.tolist() == [9, 1, 0, 0, 9]


@st.composite
def _path_sets(draw, max_paths: int = 6, max_len: int = 6):
    """Drafted paths ``[M, L]`` over a few tokens (shared prefixes, repeats), real lengths (0 = empty path; the
    entries past a path's length are junk), a budget and a slot count."""
    num, steps = draw(st.integers(1, max_paths)), draw(st.integers(1, max_len))
    tokens = draw(st.lists(st.integers(0, 3), min_size=num * steps, max_size=num * steps))
    lengths = draw(st.lists(st.integers(0, steps), min_size=num, max_size=num))
    budget = draw(st.integers(1, 24))
    return torch.tensor(tokens).view(num, steps), torch.tensor(lengths), budget, budget + 1 + draw(st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(_path_sets(), st.integers(0, 10**6))
def test_trie_device_matches_paths_to_tree(case, root):
    paths, lengths, budget, num_slots = case
    expected = paths_to_tree(root, [p[:n] for p, n in zip(paths.tolist(), lengths.tolist(), strict=True)],
                             budget=budget)  # fmt: skip
    tree = trie_device(paths, lengths, torch.tensor(root), budget=budget, num_slots=num_slots)
    got = to_draft_tree(tree)
    assert got.tokens.tolist() == expected.tokens.tolist()
    assert got.parents.tolist() == expected.parents.tolist()
    assert tree.depth[: got.num_nodes].tolist() == expected.depth.tolist()
    _assert_padded(tree, root, num_slots, expected.num_nodes)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(0, 8), st.integers(0, 3))
def test_chain_from_path_matches_chain_tree(path, length, extra):
    length = min(length, len(path))
    num_slots = len(path) + 1 + extra
    tree = chain_from_path(torch.tensor(path), torch.tensor(length), torch.tensor(7), num_slots=num_slots)
    expected = chain_tree(7, path[:length])
    got = to_draft_tree(tree)
    assert got.tokens.tolist() == expected.tokens.tolist() and got.parents.tolist() == expected.parents.tolist()
    assert tree.depth[: length + 1].tolist() == list(range(length + 1))
    _assert_padded(tree, 7, num_slots, length + 1)


def test_root_tree_device_is_the_root_alone():
    tree = root_tree_device(torch.tensor([11]))
    _assert_padded(tree, 11, 1, 1)
    assert tree.tokens.tolist() == [11] and tree.parents.tolist() == [-1]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 12), st.none() | st.integers(1, 4),
       st.integers(1, 6))  # fmt: skip
def test_policies_build_the_oracle_trees_per_row(seed, rows, budget, topk, k):
    """``Chain.build`` / ``DDTree.build`` over a batch: row b is the host oracle's tree of row b's proposal (the
    argmax chain or heap DDTree of its log-probs; the chain of its first path or the trie of its paths)."""
    gen = torch.Generator().manual_seed(seed)
    depth, vocab = 5, 7
    logq = torch.log_softmax(2.0 * torch.randn(rows, depth, vocab, generator=gen), dim=-1)
    paths = torch.randint(0, 3, (rows, 4, budget), generator=gen)
    lengths = torch.randint(0, budget + 1, (rows, 4), generator=gen)
    roots = torch.randint(0, vocab, (rows,), generator=gen)

    def check(tree, want):
        assert tree.tokens.shape[0] == rows
        for b in range(rows):
            got = to_draft_tree(tree.row(b))
            assert got.tokens.tolist() == want[b].tokens.tolist() and got.parents.tolist() == want[b].parents.tolist()

    root = roots.tolist()
    check(Chain(k).build(Proposal(logq=logq), roots, depth),
          [chain_from_logq(q, r, k=k) for q, r in zip(logq, root, strict=True)])  # fmt: skip
    check(DDTree(budget, topk).build(Proposal(logq=logq), roots, depth),
          [build_ddtree(q, r, budget=budget, topk=topk) for q, r in zip(logq, root, strict=True)])  # fmt: skip
    short = lengths.clamp(max=k)
    check(Chain(k).build(Proposal(paths=paths[:, :, :k], path_lengths=short), roots, k),
          [chain_tree(r, p[0, : n[0]].tolist()) for p, n, r in zip(paths, short, root, strict=True)])  # fmt: skip
    want = [paths_to_tree(r, [x[:m] for x, m in zip(p.tolist(), n.tolist(), strict=True)], budget=budget)
            for p, n, r in zip(paths, lengths, root, strict=True)]  # fmt: skip
    check(DDTree(budget, topk).build(Proposal(paths=paths, path_lengths=lengths), roots, budget), want)


@st.composite
def _device_trees(draw, max_nodes: int = 24):
    """Random parent arrays (chains, bushes, anything) padded with up to 5 slots."""
    n = draw(st.integers(1, max_nodes))
    shape = draw(st.sampled_from(["random", "chain", "bush"]))
    parents = [-1]
    for i in range(1, n):
        parents.append({"chain": i - 1, "bush": 0}.get(shape, draw(st.integers(0, i - 1))))
    tokens = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return padded_tree(tokens, parents, n + draw(st.integers(0, 5)))


@settings(max_examples=150, deadline=None)
@given(_device_trees(), st.integers(0, 3))
def test_ancestor_matrix_matches_ancestor_mask(tree, slack):
    n, slots = int(tree.num_nodes), tree.tokens.numel()
    mask = ancestor_matrix(tree, int(tree.depth.max()) + slack)
    assert mask.shape == (slots, slots) and mask.dtype == torch.bool
    assert torch.equal(mask[:n, :n], ancestor_mask(tree.parents[:n]))
    assert not mask[:n, n:].any()
    assert torch.equal(mask[n:], torch.eye(slots, dtype=torch.bool)[n:])  # padding sees only itself


def test_ancestor_matrix_on_a_ddtree():
    logq = torch.log_softmax(torch.randn(6, 30, generator=torch.Generator().manual_seed(3)), dim=-1)
    tree = ddtree_device(logq, torch.tensor(1), budget=40, topk=4, num_slots=48)
    expected = ancestor_mask(build_ddtree(logq, 1, budget=40, topk=4).parents)
    assert torch.equal(ancestor_matrix(tree, 6)[:41, :41], expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 4, "topk": None, "num_slots": 4}, "num_slots=4"),
        ({"budget": 0, "topk": None, "num_slots": 4}, "budget=0"),
        ({"budget": 2, "topk": 0, "num_slots": 4}, "topk=0"),
        ({"budget": 2.0, "topk": None, "num_slots": 4}, "budget=2.0"),
    ],
    ids=["few-slots", "budget0", "topk0", "budget-float"],
)
def test_ddtree_device_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ddtree_device(torch.zeros(2, 3), torch.tensor(0), **kwargs)


def test_device_builders_reject_bad_logq():
    with pytest.raises(ValueError, match="2-D"):
        ddtree_device(torch.zeros(3), torch.tensor(0), budget=2, topk=None, num_slots=3)
    with pytest.raises(ValueError, match="float"):
        chain_device(torch.zeros(2, 3, dtype=torch.long), torch.tensor(0), k=2, num_slots=3)
    with pytest.raises(ValueError, match="num_slots=2"):
        chain_device(torch.zeros(4, 3), torch.tensor(0), k=2, num_slots=2)


@pytest.mark.gpu
@settings(max_examples=300, deadline=None)
@given(_cases(max_depth=16, vocabs=st.sampled_from([3, 8, 40, 5000]), ties=True))
def test_ddtree_device_on_cuda_matches_heap(case):
    logq, root, budget, topk, num_slots = case
    expected = build_ddtree(logq, root, budget=budget, topk=topk)
    tree = ddtree_device(logq.cuda(), torch.tensor(root).cuda(), budget=budget, topk=topk, num_slots=num_slots)
    got = to_draft_tree(tree)
    assert got.tokens.tolist() == expected.tokens.tolist() and got.parents.tolist() == expected.parents.tolist()


@pytest.mark.gpu
def test_device_round_captures_in_a_cuda_graph():
    from specdec.kernels.tree_accept.reference import accept_walk
    from specdec.types import SamplingParams
    from specdec.verify import target_choices

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    depth, vocab, budget, slots = 15, 8192, 32, 48
    logq = torch.log_softmax(torch.randn(depth, vocab, generator=gen), -1).to(device)
    logits = torch.randn(slots, vocab, generator=gen).to(device)
    noise = torch.rand(slots, vocab, generator=gen).to(device)
    root = torch.tensor(5, device=device)
    sampling = SamplingParams(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)

    def round_ops():
        tree = ddtree_device(logq, root, budget=budget, topk=8, num_slots=slots)
        chain = chain_device(logq, root, k=depth, num_slots=slots)
        mask = ancestor_matrix(tree, depth)
        choices = target_choices(logits, sampling, noise)
        return tree, chain, mask, choices, accept_walk(tree, choices, mask, max_depth=depth)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        round_ops()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = round_ops()
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        logq.copy_(torch.log_softmax(torch.randn(depth, vocab, generator=g), -1))
        logits.copy_(torch.randn(slots, vocab, generator=g))
        noise.copy_(torch.rand(slots, vocab, generator=g))
        graph.replay()
        eager = round_ops()
        for got, want in zip(_flat(static_out), _flat(eager), strict=True):
            assert torch.equal(got, want)
        tree = to_draft_tree(static_out[0])
        expected = build_ddtree(logq, 5, budget=budget, topk=8)
        assert torch.equal(tree.tokens.cpu(), expected.tokens.cpu()) and torch.equal(tree.parents, expected.parents)


def _flat(outputs) -> list[torch.Tensor]:
    return [t for out in outputs for t in (out if isinstance(out, tuple) else (out,))]
