"""``MultiDraftRejection``: SpecInfer's recursive rejection sampling (``replacement=True``) and its
without-replacement form (RSD, ``replacement=False``), over every policy each is exact for; the combinations each
refuses, and why (a refused combination run anyway is biased).

Every expected distribution is HF's (its warpers on the target's logits, or the scores HF ``generate`` returns).
Power: each chi-square test first checks by Monte Carlo (1000 simulated runs at its own sample size) that it
rejects a planted +0.02 (absolute) bias of the most likely cell with probability >= 0.99 and the true
distribution with probability <= 0.01 (``sampled_rounds.assert_fits``): 16000 rounds per rule-level test (most
likely cell p ~ 0.15), 1200 calls for the joint of three tokens (512 cells, most likely p = 0.0046). Each test
rejects at p < ``ALPHA`` = 0.005.
"""

import pytest
import torch
from oracles import ALPHA, gof_pvalue
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
    probs,
    run_rounds,
)

import specdec
from specdec.types import SamplingParams
from specdec.verify.multidraft import recursive_rejection

WITH = specdec.MultiDraftRejection(replacement=True)
WITHOUT = specdec.MultiDraftRejection(replacement=False)
EXACT = {  # rule x policy pairs the rule is exact for
    "specinfer-chain": (specdec.SampledChain(3), WITH),
    "specinfer-paths": (specdec.SampledTrees(3, 3, merge=False), WITH),
    "rsd-chain": (specdec.SampledChain(3), WITHOUT),
    "rsd-trie": (specdec.SampledTrees(3, 3), WITHOUT),
    "rsd-paths": (specdec.SampledTrees(3, 3, merge=False), WITHOUT),  # duplicate siblings are skipped
    "rsd-gumbel-topk": (specdec.GumbelTopKTree((3, 2, 1)), WITHOUT),
    "rsd-stochastic-ddtree": (specdec.StochasticDDTree(8, 3), WITHOUT),  # DDTree shape, Gumbel-top-k tokens
}


SLOW = {"rsd-stochastic-ddtree"}  # one DDTree shape per round (row): ~5 s per 16000 rounds on a CPU
ROUND_PAIRS = [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in EXACT]


@pytest.mark.parametrize("pair", ROUND_PAIRS)
def test_first_token_after_root_follows_hf(pair):
    check_first_token(*EXACT[pair], seed=0)


@pytest.mark.parametrize("pair", ROUND_PAIRS)
def test_token_after_accepted_path_follows_hf(pair):
    check_after_path(*EXACT[pair], seed=1)


@pytest.mark.parametrize(
    "pair",
    ["rsd-trie", "specinfer-paths", "rsd-gumbel-topk", pytest.param("rsd-stochastic-ddtree", marks=pytest.mark.slow)],
)
def test_token_after_two_accepted_drafts_follows_hf(pair):
    check_after_two(*EXACT[pair], seed=2)


def test_generate_joint_of_three_tokens_matches_hf_generate():
    """The first three tokens of ``specdec.generate`` (the prompt's next token, then a round over a 3-path trie
    of depth 2): their joint fits HF ``generate``'s."""
    assert_generate_fits(specdec.SampledTrees(3, 2), WITHOUT, E2E_CALLS, 3, seed=0)


@pytest.mark.slow
def test_generate_joint_of_three_tokens_over_the_stochastic_ddtree_matches_hf_generate():
    """The same joint over ``StochasticDDTree(5, 2)`` (the DDTree's shape from the unperturbed q, its tokens drawn
    without replacement): the first three tokens of ``specdec.generate`` fit HF ``generate``'s."""
    assert_generate_fits(specdec.StochasticDDTree(5, 2), WITHOUT, E2E_CALLS, 3, seed=5)


@pytest.mark.parametrize("pair", list(EXACT))
def test_greedy_limit_is_the_targets_greedy_generate(pair):
    check_greedy_limit(*EXACT[pair])


def test_siblings_are_tested_in_turn():
    """Depth-1 rejections hand the residual on to the next sibling: with 3 paths, rounds accept a depth-1 draft
    that is not the first sibling (and more often than with one path)."""
    many = run_rounds(specdec.SampledTrees(3, 3), WITHOUT, 4000, seed=3)
    one = run_rounds(specdec.SampledChain(3), WITHOUT, 4000, seed=3)
    assert (many.num_path >= 2).double().mean() > (one.num_path >= 2).double().mean() + 0.05


@pytest.mark.parametrize(
    ("tree", "rule", "match"),
    [
        (specdec.SampledTrees(3, 3), WITH, "merge=True.*sample without replacement"),
        (specdec.GumbelTopKTree((2, 2)), WITH, "got tree=GumbelTopKTree"),
        (specdec.Chain(3), WITHOUT, "got tree=Chain"),
        (specdec.DDTree(8), WITH, "got tree=DDTree"),
        (specdec.StochasticDDTree(8, 2), WITH, "got tree=StochasticDDTree"),
    ],
    ids=["with-trie", "with-topk", "chain", "ddtree", "with-stochastic-ddtree"],
)
def test_refuses_what_it_is_not_exact_for(tree, rule, match):
    with pytest.raises(ValueError, match=match):
        rule.check(SamplingParams(do_sample=True), tree)


def test_with_replacement_on_the_merged_trie_is_biased():
    """Why the merged trie is refused with ``replacement=True``: a peaked q makes duplicate draws common, and the
    first token of 16000 such rounds misses HF's distribution (the same rounds with ``replacement=False`` fit)."""
    table = Table(scale=1.2)
    logq = draft_logq(table, noise=2.0)
    policy = specdec.SampledTrees(4, 1).with_sampling(SamplingParams(do_sample=True))
    rounds = 16000
    gen = torch.Generator().manual_seed(4)
    proposal = specdec.types.Proposal(logq=logq[:1].expand(rounds, -1, -1))
    tree = policy.build(proposal, torch.zeros(rounds, dtype=torch.long), 1, torch.rand(rounds, 1, V, generator=gen))
    noise = torch.rand(rounds, tree.num_slots, V, generator=gen)
    p = probs(table.after(), SamplingParams(do_sample=True)).expand(rounds, tree.num_slots, -1)
    q = torch.softmax(logq[0].double(), -1)
    q = q * (tree.depth > 0)[..., None]
    truth = probs(table.after(), SamplingParams(do_sample=True))
    pvalues = {}
    for replacement in (True, False):
        out = recursive_rejection(tree, p.double(), q, noise, 1, replacement)
        pvalues[replacement] = gof_pvalue(torch.bincount(out.tokens[:, 0], minlength=V).double(), truth)
    assert pvalues[True] < ALPHA < pvalues[False], pvalues
