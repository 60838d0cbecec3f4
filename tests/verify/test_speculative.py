"""``SpeculativeSampling`` over ``SampledChain``: rounds against a synthetic target (``sampled_rounds.Table``),
``specdec.generate`` against HF ``generate(do_sample=True)``, the greedy limit, and the policies it refuses.

Every expected distribution is HF's (its warpers on the target's logits, or the scores HF ``generate`` returns).
Power: each chi-square test first checks by Monte Carlo (1000 simulated runs at its own sample size) that it
rejects a planted +0.02 (absolute) bias of the most likely cell with probability >= 0.99 and the true
distribution with probability <= 0.01 (``sampled_rounds.assert_fits``): 16000 rounds per rule-level test (most
likely cell p ~ 0.15), 1200 calls for the joint of three tokens (512 cells, most likely p = 0.0046). The
first-token tests (here and in the other rules' files) also check that power against two bugs acting only on the
tokens where p / q > 1 (``sampled_rounds.ratio_bugs``: those accepted with probability 0.9 instead of 1, TV 0.02;
the residual squared). Each test rejects at p < ``ALPHA`` = 0.005.
"""

import pytest
import torch
from sampled_rounds import (
    E2E_CALLS,
    GREEDY_PROMPT,
    assert_generate_fits,
    check_after_path,
    check_first_token,
    check_greedy_limit,
)

import specdec
from specdec.types import SamplingParams

RULE = specdec.SpeculativeSampling()


def test_first_token_after_root_follows_hf():
    check_first_token(specdec.SampledChain(3), RULE, seed=0)


def test_token_after_accepted_path_follows_hf():
    check_after_path(specdec.SampledChain(3), RULE, seed=1)


def test_generate_joint_of_three_tokens_matches_hf_generate():
    """The first three tokens of ``specdec.generate`` (the prompt's next token, then a round's drafts / residual /
    bonus): their joint fits HF ``generate``'s."""
    assert_generate_fits(specdec.SampledChain(2), RULE, E2E_CALLS, 3, seed=0)


def test_greedy_limit_is_the_targets_greedy_generate():
    check_greedy_limit(specdec.SampledChain(3), RULE)


def test_speculative_model_takes_the_verifier():
    from sampled_rounds import _GREEDY

    check_greedy_limit(specdec.SampledChain(2), RULE)  # builds the cached models
    model = specdec.SpeculativeModel(_GREEDY["target"], drafter=_GREEDY["drafter"], tree=specdec.SampledChain(2),
                                     verifier=RULE)  # fmt: skip
    ids = model.generate(GREEDY_PROMPT, max_new_tokens=12, do_sample=False)
    assert torch.equal(ids, _GREEDY["ref"][:, : GREEDY_PROMPT.shape[1] + 12])
    assert model.last_stats.tau > 1.5


@pytest.mark.parametrize("tree", [specdec.Chain(3), specdec.DDTree(6), specdec.SampledTrees(2, 2),
                                  specdec.GumbelTopKTree((2, 1))], ids=lambda t: type(t).__name__)  # fmt: skip
def test_refuses_trees_not_sampled_as_a_chain(tree):
    with pytest.raises(ValueError, match=f"SampledChain.*got tree={type(tree).__name__}"):
        RULE.check(SamplingParams(do_sample=True), tree)


def test_refuses_a_chain_bound_to_other_settings():
    tree = specdec.SampledChain(3).with_sampling(SamplingParams(do_sample=True, temperature=0.5))
    with pytest.raises(ValueError, match="same settings"):
        RULE.check(SamplingParams(do_sample=True), tree)


def test_generate_rebinds_a_tree_bound_to_other_settings():
    """``generate`` binds the tree to the call's settings, whatever it was bound to before."""
    tree = specdec.SampledChain(3).with_sampling(SamplingParams(do_sample=True, temperature=0.5))
    check_greedy_limit(tree, RULE)
