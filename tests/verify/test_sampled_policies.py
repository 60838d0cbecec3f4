"""The sampled tree policies draw from q processed with the call's settings (HF's warpers on ``logq``), build the
trees they document, and are deterministic at ``do_sample=False``.

Power: each chi-square test first checks by Monte Carlo (1000 simulated runs at its own sample size) that it
rejects a planted +0.02 (absolute) bias of the most likely cell with probability >= 0.99 and the true
distribution with probability <= 0.01 (``sampled_rounds.assert_fits``); 30000 trees per test. The expected
distributions are HF's warpers applied to the drafter's ``logq``.
"""

import math

import pytest
import torch
from oracles import assert_powerful, hf_probs, power_report
from sampled_rounds import ROOT, Table, V, assert_fits, draft_logq, planted

import specdec
from specdec.trees.build import chain_device, ddtree_device, trie_device
from specdec.types import DeviceTree, Proposal, SamplingParams
from specdec.verify.draws import node_proposals

SAMPLING = SamplingParams(do_sample=True, temperature=0.8, top_k=10, top_p=0.9)
LOGQ = draft_logq(Table(), noise=0.3)
TREES_PER_TEST = 30000


def build(policy, n: int, seed: int, sampling: SamplingParams = SAMPLING, logq=LOGQ) -> DeviceTree:
    policy = policy.with_sampling(sampling)
    gen = torch.Generator().manual_seed(seed)
    depth = min(policy.max_depth, logq.shape[0])
    noise = torch.rand(n, depth, V, generator=gen) if policy.stochastic else None
    return policy.build(Proposal(logq=logq[:depth].expand(n, -1, -1)), torch.full((n,), ROOT), depth, noise)


def q_of(depth: int) -> torch.Tensor:
    """HF's warpers on the drafter's logq row of ``depth`` (1-based)."""
    return hf_probs(LOGQ[depth - 1], temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, top_p=SAMPLING.top_p)


@pytest.mark.parametrize("depth", [1, 3])
def test_sampled_chain_draws_each_depth_from_processed_q(depth):
    tree = build(specdec.SampledChain(3), TREES_PER_TEST, seed=depth)
    assert torch.equal(tree.parents[0], torch.tensor([-1, 0, 1, 2]))
    assert_fits(tree.tokens[:, depth], q_of(depth))


@pytest.mark.parametrize("path", [0, 2])
def test_sampled_paths_draw_from_processed_q(path):
    """Unmerged, path m's depth-2 token sits at slot 1 + 3m + 1."""
    tree = build(specdec.SampledTrees(3, 3, merge=False), TREES_PER_TEST, seed=10 + path)
    assert_fits(tree.tokens[:, 1 + 3 * path + 1], q_of(2))


def test_sampled_paths_are_independent():
    """The depth-1 tokens of paths 0 and 1: their joint is q x q."""
    tree = build(specdec.SampledTrees(2, 1, merge=False), TREES_PER_TEST, seed=20)
    q = q_of(1)
    pairs = tree.tokens[:, 1] * V + tree.tokens[:, 2]
    assert_fits(pairs, (q[:, None] * q[None]).flatten())


def test_merged_paths_are_trie_device_of_the_unmerged_paths():
    merged = build(specdec.SampledTrees(4, 3), 300, seed=30)
    paths = build(specdec.SampledTrees(4, 3, merge=False), 300, seed=30).tokens[:, 1:].reshape(300, 4, 3)
    lengths = torch.full((4,), 3)
    for b in range(300):
        expect = trie_device(paths[b], lengths, torch.tensor(ROOT), budget=12, num_slots=13)
        assert all(torch.equal(x, y) for x, y in zip(expect, merged.row(b), strict=True))
    one = build(specdec.SampledTrees(4, 3), 1, seed=30)  # a round's batch of one takes trie_device itself
    assert torch.equal(one.tokens[0], merged.tokens[0])


def test_gumbel_topk_siblings_are_a_sample_without_replacement():
    """The first two children of the root: P(c1 = i, c2 = j) = q_i q_j / (1 - q_i) (the Plackett-Luce law of two
    draws without replacement from q); every depth-1 node has the same children."""
    tree = build(specdec.GumbelTopKTree((2, 2)), TREES_PER_TEST, seed=40)
    assert torch.equal(tree.parents[0], torch.tensor([-1, 0, 0, 1, 1, 2, 2]))
    assert torch.equal(tree.tokens[:, 3:5], tree.tokens[:, 5:7])
    q = q_of(1)
    law = q[:, None] * q[None] / (1 - q[:, None]).clamp(min=1e-300)
    law.fill_diagonal_(0.0)
    assert_fits(tree.tokens[:, 1] * V + tree.tokens[:, 2], law.flatten())


def _ddtree(budget: int, topk: int, logq=LOGQ):
    """The deterministic DDTree of ``logq`` (the host-side builder's reference: ``ddtree_device``, one row)."""
    return ddtree_device(logq, torch.tensor(ROOT), budget=budget, topk=topk, num_slots=budget + 1)


def test_stochastic_ddtree_has_the_ddtree_shape_whatever_the_draws():
    """Parents, depths and sibling counts are the deterministic DDTree's over the unperturbed q in every tree
    (they never depend on the draws), siblings are distinct tokens, and at ``do_sample=False`` the tree is the
    DDTree itself."""
    tree = build(specdec.StochasticDDTree(10, 3), 500, seed=50)
    ref = _ddtree(10, 3)
    assert (tree.parents == ref.parents).all() and (tree.depth == ref.depth).all() and (tree.valid == ref.valid).all()
    real = tree.valid & (tree.depth > 0)
    same_parent = (tree.parents[:, :, None] == tree.parents[:, None, :]) & real[:, :, None] & real[:, None, :]
    same_token = tree.tokens[:, :, None] == tree.tokens[:, None, :]
    assert not (same_parent & same_token & ~torch.eye(tree.num_slots, dtype=torch.bool)).any()
    assert len({tuple(t) for t in tree.tokens[:, 1:4].tolist()}) > 20  # the tokens are drawn
    greedy = build(specdec.StochasticDDTree(10, 3), 2, seed=0, sampling=SamplingParams())
    assert all(torch.equal(x, y) for x, y in zip(ref, greedy.row(1), strict=True))


@pytest.mark.parametrize("budget, topk", [(10, 3), (15, 8), (6, 6)])
def test_stochastic_ddtree_tokens_are_the_draws_of_each_nodes_place(budget, topk):
    """Each real node holds draw number ``place`` of its depth, ``place`` = the real siblings before it under the
    same parent: the draws recomputed in Python from the same uniforms (an exponential race, ``q_j / log u_j``
    smallest first, over the processed q of ``hf_probs``), the places counted in Python over the tree's own
    parents. The shape is the deterministic DDTree's."""
    policy = specdec.StochasticDDTree(budget, topk).with_sampling(SAMPLING)
    depth = min(policy.max_depth, LOGQ.shape[0])
    noise = torch.rand(4, depth, V, generator=torch.Generator().manual_seed(budget))
    tree = policy.build(Proposal(logq=LOGQ[:depth].expand(4, -1, -1)), torch.full((4,), ROOT), depth, noise)
    ref = _ddtree(budget, topk, LOGQ[:depth])
    assert torch.equal(tree.parents[0], ref.parents) and torch.equal(tree.depth[0], ref.depth)
    races = {}
    for d in range(1, depth + 1):
        q = q_of(d).tolist()
        for b in range(4):
            u = noise[b, d - 1].tolist()
            keys = [(q[j] / math.log(u[j]) if q[j] > 0 else -0.0, j) for j in range(V)]
            races[b, d] = [j for _, j in sorted(keys)]  # increasing keys; ties (-0.0 outside q) by id
    parents, depths = ref.parents.tolist(), ref.depth.tolist()
    for b in range(4):
        assert tree.tokens[b, 0] == ROOT
        for i in range(1, int(ref.num_nodes)):
            place = sum(1 for j in range(1, i) if parents[j] == parents[i])
            assert tree.tokens[b, i] == races[b, depths[i]][place], (b, i, place)


def test_stochastic_ddtree_root_siblings_quick():
    """The default tier's chi-square of the stochastic DDTree: ``StochasticDDTree(2, 2)`` (the root's two children,
    the smallest tree with siblings), 6000 trees, their tokens against the Plackett-Luce law of two draws without
    replacement from the processed q. Power, checked first by Monte Carlo at this size: a planted +3 % on the most
    likely pair and i.i.d. siblings (with replacement: q x q, repeats included) each rejected with probability
    >= 0.99, the truth with probability <= 0.01."""
    n = 6000
    tree = build(specdec.StochasticDDTree(2, 2), n, seed=53)
    assert torch.equal(tree.parents[0], torch.tensor([-1, 0, 0]))
    q = q_of(1).double()
    law = q[:, None] * q[None] / (1 - q[:, None]).clamp(min=1e-300)
    law.fill_diagonal_(0.0)
    law = law.flatten()
    iid = (q[:, None] * q[None]).flatten()
    assert_powerful(power_report(law, {"planted_3pct": planted(law, 0.03), "with_replacement": iid}, n, trials=1000))
    assert_fits(tree.tokens[:, 1] * V + tree.tokens[:, 2], law, power=False)


@pytest.mark.slow  # one DDTree shape per tree: ~9 s for 30000 trees on a CPU
def test_stochastic_ddtree_siblings_are_a_sample_without_replacement():
    """The root's first two children: P(c1 = i, c2 = j) = q_i q_j / (1 - q_i) (Plackett-Luce), the law of two draws
    without replacement from the processed q of depth 1; a depth-2 child follows q of depth 2."""
    tree = build(specdec.StochasticDDTree(8, 3), TREES_PER_TEST, seed=51)
    ref = _ddtree(8, 3)
    root_children = (ref.parents == 0).nonzero()[:, 0].tolist()
    assert len(root_children) >= 2
    q = q_of(1)
    law = q[:, None] * q[None] / (1 - q[:, None]).clamp(min=1e-300)
    law.fill_diagonal_(0.0)
    first, second = root_children[:2]
    assert_fits(tree.tokens[:, first] * V + tree.tokens[:, second], law.flatten())
    deeper = (ref.depth == 2).nonzero()[0, 0]
    assert_fits(tree.tokens[:, deeper], q_of(2), power=False)


def test_deterministic_at_do_sample_false():
    greedy = SamplingParams()
    chain = build(specdec.SampledChain(3), 2, seed=0, sampling=greedy)
    expect = chain_device(LOGQ, torch.tensor(ROOT), k=3, num_slots=4)
    assert all(torch.equal(x, y) for x, y in zip(expect, chain.row(1), strict=True))
    trie = build(specdec.SampledTrees(3, 3), 2, seed=0, sampling=greedy)
    assert torch.equal(trie.tokens[1, :4], expect.tokens) and int(trie.num_nodes[1]) == 4  # equal paths: a chain
    top = build(specdec.GumbelTopKTree((2, 1)), 1, seed=0, sampling=greedy)
    assert top.tokens[0, 1:3].tolist() == LOGQ[0].topk(2).indices.tolist()
    policies = (specdec.SampledChain(), specdec.SampledTrees(), specdec.GumbelTopKTree(), specdec.StochasticDDTree())
    for policy in policies:
        assert not policy.with_sampling(greedy).stochastic and policy.with_sampling(SAMPLING).stochastic


def test_drafted_depth_below_the_policys():
    """A drafter that drafts fewer depths than the policy's: the trees stop there (padding after)."""
    policies = (specdec.SampledChain(3), specdec.SampledTrees(2, 3), specdec.GumbelTopKTree((2, 2, 2)),
                specdec.StochasticDDTree(8, 2))  # fmt: skip
    for policy in policies:
        tree = build(policy, 4, seed=1, logq=LOGQ[:2])
        assert tree.num_slots == policy.budget + 1
        assert int(tree.depth.max()) == 2
        assert not tree.valid[:, int(tree.num_nodes.max()) :].any()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: specdec.SampledChain(0), "k must be an int >= 1"),
        (lambda: specdec.SampledTrees(2, 0), "depth must be an int >= 1"),
        (lambda: specdec.SampledTrees(2, 2, merge=1), "merge must be True or False"),
        (lambda: specdec.GumbelTopKTree(()), "non-empty tuple"),
        (lambda: specdec.GumbelTopKTree((2, 0)), "widths"),
        (lambda: specdec.StochasticDDTree(0), "budget must be an int >= 1"),
        (lambda: specdec.StochasticDDTree(8, 0), "topk must be an int >= 1"),
    ],
)
def test_arguments_are_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_registered_by_name():
    assert specdec.TREES["sampled-chain"] is specdec.SampledChain
    assert specdec.TREES["sampled-trees"] is specdec.SampledTrees
    assert specdec.TREES["gumbel-topk"] is specdec.GumbelTopKTree
    assert specdec.TREES["stochastic-ddtree"] is specdec.StochasticDDTree
    assert specdec.GumbelTopKTree([3, 2]).widths == (3, 2)  # a list (from a config file) becomes a tuple


@pytest.mark.parametrize("make", [lambda: specdec.SampledChain(3), lambda: specdec.StochasticDDTree(6, 3),
                                  lambda: specdec.SampledTrees(3, 3), lambda: specdec.SampledTrees(3, 3, merge=False)],
                         ids=["sampled-chain", "stochastic-ddtree", "trie", "paths"])  # fmt: skip
def test_the_q_a_sampled_tree_carries_is_hf_processed_q_at_each_nodes_depth(make):
    """A sampled policy hands the rules the distribution it drew from (``tree.draft_probs``), so that the round
    processes q once: at every real node that is HF's warpers on ``logq``'s row of the node's depth, the q the
    rule computed itself before (``node_proposals`` reads the tree's)."""
    tree = build(make(), 4, seed=40)
    assert tree.draft_probs is not None
    q = node_proposals(tree, None, SAMPLING)
    nodes = 0
    for b in range(4):
        for s in range(1, tree.tokens.shape[1]):
            if tree.valid[b, s]:
                torch.testing.assert_close(q[b, s].double(), q_of(int(tree.depth[b, s])), rtol=1e-5, atol=1e-7)
                nodes += 1
    assert nodes >= 4 * 3
