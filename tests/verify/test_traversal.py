"""``TraversalVerification`` (leaf to root): over a sampled chain (where it is block verification), merged sampled
paths (siblings without replacement) and separate sampled paths (with replacement); its post-order, the greedy
limit, and what it refuses.

Every expected distribution is HF's (its warpers on the target's logits, or the scores HF ``generate`` returns).
Power: each chi-square test first checks by Monte Carlo (1000 simulated runs at its own sample size) that it
rejects a planted +0.02 (absolute) bias of the most likely cell with probability >= 0.99 and the true
distribution with probability <= 0.01 (``sampled_rounds.assert_fits``): 16000 rounds per rule-level test (most
likely cell p ~ 0.15), 1200 calls for the joint of three tokens (512 cells, most likely p = 0.0046). Each test
rejects at p < ``ALPHA`` = 0.005.
"""

import pytest
import torch
from sampled_rounds import (
    E2E_CALLS,
    Table,
    V,
    assert_generate_fits,
    check_after_path,
    check_after_two,
    check_first_token,
    check_greedy_limit,
    draft_logq,
)

import specdec
from specdec.types import DeviceTree, Proposal, SamplingParams
from specdec.verify.block import block_verify
from specdec.verify.draws import node_proposals, target_probs
from specdec.verify.traversal import postorder, traversal_verify

EXACT = {
    "chain": (specdec.SampledChain(3), specdec.TraversalVerification()),
    "trie": (specdec.SampledTrees(3, 3), specdec.TraversalVerification()),
    "paths": (specdec.SampledTrees(3, 3, merge=False), specdec.TraversalVerification(replacement=True)),
    "paths-without": (specdec.SampledTrees(3, 3, merge=False), specdec.TraversalVerification()),
}


@pytest.mark.parametrize("pair", list(EXACT))
def test_first_token_after_root_follows_hf(pair):
    check_first_token(*EXACT[pair], seed=0)


@pytest.mark.parametrize("pair", list(EXACT))
def test_token_after_accepted_path_follows_hf(pair):
    check_after_path(*EXACT[pair], seed=1)


@pytest.mark.parametrize("pair", ["trie", "paths"])
def test_token_after_two_accepted_drafts_follows_hf(pair):
    check_after_two(*EXACT[pair], seed=2)


def test_generate_joint_of_three_tokens_matches_hf_generate():
    assert_generate_fits(specdec.SampledTrees(3, 2), specdec.TraversalVerification(), E2E_CALLS, 3, seed=2)


@pytest.mark.parametrize("pair", list(EXACT))
def test_greedy_limit_is_the_targets_greedy_generate(pair):
    check_greedy_limit(*EXACT[pair])


def test_on_a_chain_it_is_block_verification():
    """Same chains, same uniforms: token for token the output of ``block_verify``."""
    sampling = SamplingParams(do_sample=True, temperature=0.9, top_k=12)
    table, rounds = Table(), 3000
    gen = torch.Generator().manual_seed(6)
    policy = specdec.SampledChain(3).with_sampling(sampling)
    proposal = Proposal(logq=draft_logq(table).expand(rounds, -1, -1))
    tree = policy.build(proposal, torch.zeros(rounds, dtype=torch.long), 3, torch.rand(rounds, 3, V, generator=gen))
    p = target_probs(table.node_logits(tree), sampling)
    q = node_proposals(tree, proposal, sampling)
    noise = torch.rand(rounds, tree.num_slots, V, generator=gen)
    block, traversal = block_verify(tree, p, q, noise, 3), traversal_verify(tree, p, q, noise, 3, replacement=True)
    assert all(torch.equal(a, b) for a, b in zip(block, traversal, strict=True))
    assert (block.num_path == 4).any() and (block.num_path == 1).any()


def _host_postorder(parents: list[int], valid: list[bool]) -> list[int]:
    children: dict[int, list[int]] = {}
    for i, (p, v) in enumerate(zip(parents, valid, strict=True)):
        if v and i > 0:
            children.setdefault(p, []).append(i)
    out: list[int] = []

    def visit(node: int) -> None:
        for child in children.get(node, []):
            visit(child)
        out.append(node)

    visit(0)
    return out + [i for i, v in enumerate(valid) if not v]


def test_postorder_matches_a_host_depth_first_walk():
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(200):
        n, slots = int(torch.randint(1, 12, (1,), generator=gen)), 12
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)] + [-1] * (slots - n)
        depth = [0] * slots
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        valid = [i < n for i in range(slots)]
        rows.append((parents, depth, valid, n))
    tree = DeviceTree(
        tokens=torch.zeros(len(rows), 12, dtype=torch.long),
        parents=torch.tensor([r[0] for r in rows]),
        depth=torch.tensor([r[1] for r in rows]),
        valid=torch.tensor([r[2] for r in rows]),
        num_nodes=torch.tensor([r[3] for r in rows]),
    )
    order = postorder(tree, 11)
    for b, (parents, _, valid, _) in enumerate(rows):
        assert order[b].tolist() == _host_postorder(parents, valid)


@pytest.mark.parametrize(
    ("tree", "rule", "match"),
    [
        (specdec.GumbelTopKTree((2, 2)), specdec.TraversalVerification(), "one draw per depth"),
        (specdec.SampledTrees(3, 3), specdec.TraversalVerification(replacement=True), "merge=True"),
        (specdec.DDTree(8), specdec.TraversalVerification(), "got tree=DDTree"),
        (specdec.StochasticDDTree(8, 2), specdec.TraversalVerification(), "StochasticDDTree: .*one draw per depth"),
    ],
    ids=["gumbel-topk", "trie-with", "ddtree", "stochastic-ddtree"],
)
def test_refuses_what_it_is_not_exact_for(tree, rule, match):
    with pytest.raises(ValueError, match=match):
        rule.check(SamplingParams(do_sample=True), tree)
