"""``num_return_sequences``: independent samples per prompt through the batch path; greedy refused as HF refuses it.

The statistical test draws N sequences of two new tokens for one prompt in one call, with a drafter whose
drafts are mostly accepted (so the second token often comes from an accepted draft, the rest from the bonus), and
compares the counts of the first token and of the second token's marginal with HF's exact distributions (the
target's logits through HF's own warpers; the marginal sums over every first token). Rows that shared their
randomness, or a wrong warper, fail it; the power against planted bugs is checked by Monte Carlo (>= 0.99 against
rows sharing one draw and against an inverted temperature; about 0.6 against a temperature 25 % off, which the
warper tests of ``tests/unit/test_verify_sampling.py`` cover). It takes about 4 s on CPU; a quicker test checks
that 64 rows are not copies of one draw.
"""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model
from oracles import ALPHA, assert_powerful, gof_pvalue, hf_probs, power_report, wrong_probs

import specdec

WARP = dict(temperature=0.5, top_k=30)
N = 600  # power (500 Monte-Carlo trials): >= 0.99 against shared randomness and an inverted temperature
_SETUP: list = []


def setup():
    if not _SETUP:
        target = tiny_model("qwen3", scale=4.0)
        drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.02))
        ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(5))
        _SETUP.append((target, drafter, ids))
    return _SETUP[0]


def test_greedy_is_refused_as_hf_refuses_it():
    target, drafter, ids = setup()
    with pytest.raises(ValueError, match="num_return_sequences"):
        target.generate(ids, do_sample=False, max_new_tokens=3, num_return_sequences=2)
    with pytest.raises(ValueError, match=r"num_return_sequences=2 needs do_sample=True"):
        specdec.generate(target, ids, drafter=drafter, max_new_tokens=3, num_return_sequences=2)
    with pytest.raises(ValueError, match="num_return_sequences"):
        specdec.generate(target, ids, max_new_tokens=3, num_return_sequences=0, do_sample=True)


def test_rows_are_the_prompts_repeated_in_place():
    target, drafter, ids = setup()
    other = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(6))
    batch = torch.cat([ids, other])
    ref = target.generate(batch, do_sample=True, max_new_tokens=5, num_return_sequences=3, eos_token_id=[], **WARP)
    out = specdec.generate(target, batch, drafter=drafter, tree=specdec.Chain(3), do_sample=True, max_new_tokens=5,
                           num_return_sequences=3, eos_token_id=[], **WARP)  # fmt: skip
    assert out.sequences.shape == ref.shape == (6, 13)
    assert torch.equal(out.sequences[:, :8], ref[:, :8])  # HF's order: prompt 0 three times, then prompt 1
    assert len(out.stats.rows) == 6


def test_rows_are_not_copies_of_one_draw():
    target, drafter, ids = setup()
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(2), do_sample=True, max_new_tokens=2,
                           num_return_sequences=64, eos_token_id=[], generator=torch.Generator().manual_seed(0),
                           **WARP)  # fmt: skip
    pairs = {tuple(row) for row in out.sequences[:, ids.shape[1] :].tolist()}
    assert len(pairs) >= 16, pairs  # the likeliest pair has probability < 0.25: 64 true samples give many pairs


def test_samples_are_independent_and_exact_first_token_and_after_a_draft():
    target, drafter, ids = setup()
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(2), do_sample=True, max_new_tokens=2,
                           num_return_sequences=N, eos_token_id=[], generator=torch.Generator().manual_seed(0),
                           **WARP)  # fmt: skip
    new = out.sequences[:, ids.shape[1] :]
    assert new.shape == (N, 2)
    assert sum(r.accept_lengths.count(1) for r in out.stats.rows) > N // 10  # second tokens that were drafts
    with torch.no_grad():
        p1 = hf_probs(target(ids).logits[0, -1], **WARP)  # [V]
        vocab = p1.shape[0]
        both = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
        p2 = (p1[:, None] * hf_probs(target(both).logits[:, -1], **WARP)).sum(0)  # the second token's marginal
    for probs, tokens in ((p1, new[:, 0]), (p2, new[:, 1])):
        counts = torch.bincount(tokens, minlength=vocab).double()
        assert gof_pvalue(counts, probs) > ALPHA
    logits = target(ids).logits[0, -1].detach()
    wrong = {"temperature_inverted": wrong_probs(logits, "temperature_inverted", **WARP)}
    wrong["shared_noise"] = torch.nn.functional.one_hot(p1.argmax(), vocab).double()  # every row one draw
    assert_powerful(power_report(p1, wrong, N, trials=500))
    assert float(p1.max()) < 0.25
