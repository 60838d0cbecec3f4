"""``BlockVerification`` over ``SampledChain``: rounds against a synthetic target, ``specdec.generate`` against HF
``generate(do_sample=True)``, the greedy limit, its gain over speculative sampling, and what it refuses.

Every expected distribution is HF's (its warpers on the target's logits, or the scores HF ``generate`` returns).
Power: each chi-square test first checks by Monte Carlo (1000 simulated runs at its own sample size) that it
rejects a planted +0.02 (absolute) bias of the most likely cell with probability >= 0.99 and the true
distribution with probability <= 0.01 (``sampled_rounds.assert_fits``): 16000 rounds per rule-level test (most
likely cell p ~ 0.15), 1200 calls for the joint of three tokens (512 cells, most likely p = 0.0046). Each test
rejects at p < ``ALPHA`` = 0.005.
"""

import pytest
from sampled_rounds import (
    E2E_CALLS,
    assert_generate_fits,
    check_after_path,
    check_after_two,
    check_first_token,
    check_greedy_limit,
    run_rounds,
)

import specdec
from specdec.types import SamplingParams

RULE = specdec.BlockVerification()


def test_first_token_after_root_follows_hf():
    check_first_token(specdec.SampledChain(3), RULE, seed=0)


def test_token_after_accepted_path_follows_hf():
    check_after_path(specdec.SampledChain(3), RULE, seed=1)


def test_token_after_two_accepted_drafts_follows_hf():
    check_after_two(specdec.SampledChain(3), RULE, seed=2)


def test_generate_joint_of_three_tokens_matches_hf_generate():
    assert_generate_fits(specdec.SampledChain(2), RULE, E2E_CALLS, 3, seed=1)


def test_greedy_limit_is_the_targets_greedy_generate():
    check_greedy_limit(specdec.SampledChain(3), RULE)


def test_accepts_at_least_as_much_as_speculative_sampling():
    """Block verification is optimal for one chain: on the same rounds' distribution its mean accepted length is
    not below speculative sampling's (by more than the noise of 16000 rounds)."""
    block = run_rounds(specdec.SampledChain(3), RULE, 16000, seed=5)
    token = run_rounds(specdec.SampledChain(3), specdec.SpeculativeSampling(), 16000, seed=5)
    gain = block.num_path.double().mean() - token.num_path.double().mean()
    assert gain > -0.02, gain


@pytest.mark.parametrize("tree", [specdec.Chain(3), specdec.SampledTrees(2, 2), specdec.GumbelTopKTree((2,))],
                         ids=lambda t: type(t).__name__)  # fmt: skip
def test_refuses_trees_not_sampled_as_a_chain(tree):
    with pytest.raises(ValueError, match=f"SampledChain.*got tree={type(tree).__name__}"):
        RULE.check(SamplingParams(do_sample=True), tree)
