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


def _random_round(gen: torch.Generator, batch: int, slots: int, vocab: int, depth: int):
    """A batch of random trees of at most ``depth`` levels (duplicate siblings, padding, ragged sizes), a target
    close to the draft (so that deep paths get accepted), a draft with a cut support, and the round's uniforms."""
    tokens = torch.randint(vocab, (batch, slots), generator=gen)
    parents = torch.full((batch, slots), -1)
    depths = torch.zeros(batch, slots, dtype=torch.long)
    sizes = torch.randint(1, slots + 1, (batch,), generator=gen)
    for b in range(batch):
        for j in range(1, int(sizes[b])):
            choices = [i for i in range(j) if depths[b, i] < depth]
            parents[b, j] = choices[int(torch.randint(len(choices), (1,), generator=gen))]
            depths[b, j] = depths[b, parents[b, j]] + 1
    valid = torch.arange(slots) < sizes[:, None]
    tokens = torch.where(valid, tokens, tokens[:, :1])
    tree = specdec.types.DeviceTree(tokens, parents, depths, valid, sizes)
    logits = torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    q_logits = logits.roll(1, dims=1) + 0.5 * torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64)
    q_logits[..., : vocab // 4] = -torch.inf  # tokens past q's support: drafted there, they are no draws
    q = torch.softmax(q_logits, -1).gather(1, parents.clamp(min=0)[..., None].expand(-1, -1, vocab))  # per parent
    q = q * (valid & (depths > 0))[..., None]
    noise = torch.rand(batch, slots, vocab, generator=gen)
    return tree, p, q, noise


@pytest.mark.parametrize("replacement", [True, False], ids=["with", "without"])
def test_rank_by_rank_equals_the_one_slot_at_a_time_definition(replacement):
    """The rule tests every node's children at once, rank by rank; the definition walks the slots one test at a
    time. With the same uniforms both give the same path, tokens and bonus, on random trees of any shape (and with
    the policy's bound on children where it states one)."""
    from oracles.rejection import rejection_one_slot_at_a_time

    gen = torch.Generator().manual_seed(11)
    reached = []
    for trial in range(60):
        slots, depth = int(torch.randint(2, 12, (1,), generator=gen)), int(torch.randint(1, 6, (1,), generator=gen))
        tree, p, q, noise = _random_round(gen, 3, slots, 8, depth)
        want = rejection_one_slot_at_a_time(tree, p, q, noise, depth, replacement)
        real = tree.valid & (tree.depth > 0)
        widest = max([int(tree.parents[b][real[b]].bincount().max()) for b in range(3) if real[b].any()] or [1])
        for bound in (None, widest):
            got = recursive_rejection(tree._replace(max_children=bound), p, q, noise, depth, replacement)
            for field in ("path", "num_path", "tokens"):
                assert torch.equal(getattr(got, field), getattr(want, field)), (trial, bound, field)
        reached.append(want.num_path)
    reached = torch.cat(reached)
    assert (reached >= 3).any() and (reached == 1).any()  # deep accepts and first-child rejections both occur


def test_children_by_rank_lists_each_nodes_children_in_slot_order():
    from specdec.kernels.tree_rejection import children_by_rank, rank_width

    tree = specdec.types.DeviceTree(
        tokens=torch.tensor([[5, 1, 2, 3, 4, 6, 5]]),
        parents=torch.tensor([[-1, 0, 0, 1, 0, 1, -1]]),
        depth=torch.tensor([[0, 1, 1, 2, 1, 2, 0]]),
        valid=torch.tensor([[True] * 6 + [False]]),
        num_nodes=torch.tensor([6]),
    )
    table = children_by_rank(tree.parents, tree.depth, tree.valid, rank_width(7, None))
    assert table.shape == (1, 7, 6)
    assert table[0, 0, :3].tolist() == [1, 2, 4] and (table[0, 0, 3:] == 7).all()
    assert table[0, 1, :2].tolist() == [3, 5] and (table[0, 1, 2:] == 7).all()
    assert (table[0, 2:] == 7).all()
    assert children_by_rank(tree.parents, tree.depth, tree.valid, rank_width(7, 3)).shape == (1, 7, 3)
