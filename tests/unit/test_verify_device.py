"""Device-side verification: the accepted path of ``accept_walk`` and of the rules ``Greedy`` / ``SampleMatch``
equals the host oracle ``walk_tree``'s, and Gumbel-max samples HF's distribution."""

from __future__ import annotations

import math

import pytest
import torch
from device_trees import padded_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.host_trees import to_draft_tree
from oracles.walk import walk_tree
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec.kernels.tree_accept.reference import accept_walk
from specdec.trees.build import ancestor_matrix, ddtree_device
from specdec.types import DeviceTree, SamplingParams, TreeRow
from specdec.verify import Greedy, SampleMatch, gumbel_from_uniform, target_choices

SAMPLING = SamplingParams(do_sample=True, temperature=0.7, top_k=12, top_p=0.9)


@st.composite
def _trees_and_choices(draw, max_nodes: int = 24):
    """A random padded tree (chains, bushes, duplicate sibling tokens) and choices that often follow it."""
    n = draw(st.integers(1, max_nodes))
    shape = draw(st.sampled_from(["random", "chain", "bush"]))
    parents = [-1] + [{"chain": i - 1, "bush": 0}.get(shape) for i in range(1, n)]
    parents = [p if p is not None else draw(st.integers(0, i - 1)) for i, p in enumerate(parents)]
    parents[0] = -1
    tokens = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    slots = n + draw(st.integers(0, 5))
    choices = []
    for i in range(slots):
        kids = [tokens[j] for j in range(1, n) if parents[j] == i]
        pick = draw(st.integers(0, len(kids) + 1))
        choices.append(kids[pick] if pick < len(kids) else draw(st.integers(0, 4)))
    return padded_tree(tokens, parents, slots), torch.tensor(choices)


def _assert_accept_matches_walk(tree: TreeRow, choices: torch.Tensor, max_depth: int) -> int:
    n = int(tree.num_nodes)
    expected = walk_tree(to_draft_tree(tree), choices[:n].tolist())
    got = accept_walk(tree, choices, ancestor_matrix(tree, max_depth), max_depth=max_depth)
    steps = max_depth + 1
    assert got.path.shape == got.tokens.shape == (steps,) and got.num_path.shape == ()
    length = int(got.num_path)
    assert length == len(expected.path)
    assert got.path.tolist() == list(expected.path) + [expected.path[-1]] * (steps - length)
    assert got.tokens.tolist() == list(expected.tokens) + [0] * (steps - length)
    return length


@settings(max_examples=300, deadline=None)
@given(_trees_and_choices(), st.integers(0, 3))
def test_accept_walk_matches_walk_tree_on_random_trees(case, slack):
    tree, choices = case
    _assert_accept_matches_walk(tree, choices, int(tree.depth.max()) + slack)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 6), st.booleans())
def test_accept_walk_matches_walk_tree_on_ddtrees(seed, budget, topk, follow):
    gen = torch.Generator().manual_seed(seed)
    depth, vocab = 6, 5
    logq = torch.log_softmax(2.0 * torch.randn(depth, vocab, generator=gen), dim=-1)
    tree = ddtree_device(logq, torch.tensor(2), budget=budget, topk=topk, num_slots=budget + 4)
    choices = torch.randint(0, vocab, (budget + 4,), generator=gen)
    if follow:  # the target agrees with the drafter's argmax at every depth: long accepted paths
        choices = logq.argmax(-1)[tree.depth.clamp(max=depth - 1)]
    _assert_accept_matches_walk(tree, choices, depth)


@settings(max_examples=60, deadline=None)
@given(st.lists(_trees_and_choices(max_nodes=12), min_size=1, max_size=3), st.integers(0, 2**31 - 1))
def test_rules_accept_matches_walk_tree_per_row(cases, seed):
    """``Greedy().accept`` (target argmax) and ``SampleMatch().accept`` (a Gumbel-max sample per slot) on a batch of
    trees ``[B, S]``: each row's path and tokens are ``walk_tree``'s along the same choices."""
    slots = max(tree.tokens.numel() for tree, _ in cases)
    rows = [_repad(tree, slots) for tree, _ in cases]
    batch = DeviceTree.stack(rows)
    max_depth = int(batch.depth.max())
    gen = torch.Generator().manual_seed(seed)
    vocab = 6
    logits = torch.randn(len(rows), slots, vocab, generator=gen)
    for b, (_, choices) in enumerate(cases):  # make the argmax follow the chosen children
        logits[b, torch.arange(choices.numel()), choices.clamp(max=vocab - 1)] += 10.0
    noise = torch.rand(len(rows), slots, vocab, generator=gen)
    sampling = SamplingParams(do_sample=True, temperature=0.9, top_k=4)
    for rule, sp, u in ((Greedy(), SamplingParams(), None), (SampleMatch(), sampling, noise)):
        got = rule.accept(batch, logits, sp, u, max_depth)
        assert got.path.shape == got.tokens.shape == (len(rows), max_depth + 1)
        assert got.num_path.shape == (len(rows),)
        choices = logits.argmax(-1) if u is None else target_choices(logits, sp, u)
        for b, row in enumerate(rows):
            n = int(row.num_nodes)
            want = walk_tree(to_draft_tree(row), choices[b, :n].tolist())
            length = len(want.path)
            assert int(got.num_path[b]) == length
            assert got.path[b].tolist() == list(want.path) + [want.path[-1]] * (max_depth + 1 - length)
            assert got.tokens[b].tolist() == list(want.tokens) + [0] * (max_depth + 1 - length)


def _repad(tree: TreeRow, slots: int) -> TreeRow:
    n = int(tree.num_nodes)
    return padded_tree(tree.tokens[:n].tolist(), tree.parents[:n].tolist(), slots)


def test_accept_walk_first_duplicate_sibling_wins():
    # Nodes 1 and 2 both carry token 7 under the root; the walk takes node 1 and then its child 3.
    tree = padded_tree([0, 7, 7, 8, 9], [-1, 0, 0, 1, 2], 7)
    got = accept_walk(tree, torch.tensor([7, 8, 9, 5, 5, 7, 7]), ancestor_matrix(tree, 2), max_depth=3)
    assert got.path.tolist() == [0, 1, 3, 3] and int(got.num_path) == 3
    assert got.tokens.tolist() == [7, 8, 5, 0]


def test_accept_walk_never_accepts_padding():
    # Padding slots carry the root token under parent -1; a choice equal to it must not extend the path.
    tree = padded_tree([4, 1], [-1, 0], 4)
    got = accept_walk(tree, torch.tensor([4, 4, 4, 4]), ancestor_matrix(tree, 1), max_depth=1)
    assert got.path.tolist() == [0, 0] and int(got.num_path) == 1 and got.tokens.tolist() == [4, 0]


def test_target_choices_greedy_is_first_maximum():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-2, 2, (64, 9), generator=gen).float()  # many tied maxima
    rows = logits.tolist()
    expected = [min(j for j, x in enumerate(row) if x == max(row)) for row in rows]
    assert target_choices(logits, SamplingParams()).tolist() == expected


def _hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """HF's processed distribution: its own warpers in ``generate``'s order, then a softmax (float64)."""
    scores = TemperatureLogitsWarper(temperature)(None, logits.float())
    scores = TopKLogitsWarper(top_k=top_k)(None, scores)
    scores = TopPLogitsWarper(top_p=top_p)(None, scores)
    return torch.softmax(scores.double(), dim=-1)


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; a sample outside the support gives 0, cells with expectation < 5 pool."""
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big & (probs > 0)].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big & (probs > 0)].sum(0, keepdim=True)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def _sample_counts(logits: torch.Tensor, sampling: SamplingParams, draws: int, seed: int) -> torch.Tensor:
    """``[S, V]`` counts of ``draws`` Gumbel-max samples per row (all rows drawn in one batched call)."""
    slots, vocab = logits.shape
    gen = torch.Generator().manual_seed(seed)
    noise = torch.rand(draws * slots, vocab, generator=gen)
    picks = target_choices(logits.repeat(draws, 1), sampling, noise).view(draws, slots)
    return torch.stack([torch.bincount(picks[:, s], minlength=vocab) for s in range(slots)]).double()


def _fixture_logits() -> torch.Tensor:
    return 1.5 * torch.randn(3, 32, generator=torch.Generator().manual_seed(0))  # [S, V]


# 20000 draws per row (3 rows), each row passes at p > 1e-3 (false alarms: 0.35 % of 2000 simulated runs). Power,
# by Monte Carlo (2000 runs of 20000 multinomial draws per row from a wrong distribution, scored by this check):
# temperature x 1.3 even on the correct support (total variation 0.05-0.08 per row), and a top-p cut-off one token
# short or one token long (TV 0.02-0.09) each failed the test in 2000 of 2000 runs: power > 0.99.
_DRAWS = 20000


def test_target_choices_samples_hf_processed_distribution():
    logits = _fixture_logits()
    counts = _sample_counts(logits, SAMPLING, _DRAWS, seed=1)
    probs = _hf_probs(logits, SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p)
    for row in range(logits.shape[0]):
        assert _chi2_pvalue(counts[row], probs[row]) > 1e-3


@pytest.mark.parametrize(
    "wrong",
    [
        SamplingParams(do_sample=True, temperature=0.7 * 1.3, top_k=12, top_p=0.9),
        SamplingParams(do_sample=True, temperature=0.7, top_k=12, top_p=0.97),
        SamplingParams(do_sample=True, temperature=0.7, top_k=12, top_p=0.8),
    ],
    ids=["temperature-x1.3", "top-p-0.97", "top-p-0.8"],
)
def test_chi_square_check_rejects_wrong_parameters(wrong):
    # The same check on samples from mis-processed logits must fail on some row, or the test above proves nothing.
    logits = _fixture_logits()
    counts = _sample_counts(logits, wrong, _DRAWS, seed=1)
    probs = _hf_probs(logits, SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p)
    assert min(_chi2_pvalue(counts[row], probs[row]) for row in range(logits.shape[0])) < 1e-3


def test_target_choices_never_picks_a_processed_out_token():
    # Adversarial noise: tokens outside the top-k get the largest Gumbel value possible, kept ones the smallest.
    logits = _fixture_logits()
    sampling = SamplingParams(do_sample=True, temperature=0.5, top_k=3)
    kept = logits.topk(3, dim=-1).indices
    inside = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, kept, True)
    noise = torch.where(inside, 0.0, 1.0)
    picks = target_choices(logits, sampling, noise)
    assert inside.gather(1, picks.unsqueeze(-1)).all()


def test_gumbel_from_uniform_is_finite_and_exact_inside():
    u = torch.tensor([0.0, 1e-30, 0.25, 0.5, 0.9, 1.0])
    g = gumbel_from_uniform(u)
    assert torch.isfinite(g).all()
    for x, y in zip(u[2:5].tolist(), g[2:5].tolist(), strict=True):
        assert y == pytest.approx(-math.log(-math.log(x)), rel=1e-6)
    assert bool((g[1:] >= g[:-1]).all())  # monotone, clamped ends included


def test_target_choices_needs_noise_when_sampling():
    with pytest.raises(ValueError, match="noise"):
        target_choices(torch.zeros(2, 5), SAMPLING)
    with pytest.raises(ValueError, match="noise"):
        target_choices(torch.zeros(2, 5), SAMPLING, torch.rand(2, 4))
    with pytest.raises(ValueError, match="max_depth"):
        tree = padded_tree([0], [-1], 1)
        accept_walk(tree, torch.zeros(1, dtype=torch.long), ancestor_matrix(tree, 0), max_depth=-1)
