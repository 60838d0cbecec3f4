"""``output_scores`` / ``output_logits``: one ``[B, V]`` fp32 tensor per generated position, as HF returns them.

Greedy: compared step by step with HF's own ``generate(output_scores=True, output_logits=True,
return_dict_in_generate=True)`` (allclose in fp32), with ``min_new_tokens`` so that the processed scores differ
from the raw logits, for plain decoding and a drafter over a chain and a tree, a dense and a hybrid target, and a
batch. Sampling: HF's scores depend on the tokens HF drew, so the reference is the target's full forward over
specdec's own output, processed by HF's own warpers.
"""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model
from oracle_drafter import OracleDrafter
from state.hybrid_harness import tiny_hybrid
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import specdec

TREES = {"chain": specdec.Chain(k=4), "tree": specdec.DDTree(budget=8, topk=4)}
NEW = 14
_MODELS: dict = {}


def model(kind: str):
    if kind not in _MODELS:
        target = tiny_model("qwen3", scale=2.0) if kind == "dense" else tiny_hybrid("qwen3_5", scale=2.0)
        drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.05)) if kind == "dense" else None
        _MODELS[kind] = (target, drafter)
    return _MODELS[kind]


def prompt(seed: int = 3, n: int = 10) -> torch.Tensor:
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def assert_steps_close(ours, ref, what):
    assert ours is not None and len(ours) == len(ref), (what, None if ours is None else len(ours), len(ref))
    for j, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.shape == b.shape and a.dtype == torch.float32, (what, j, a.shape, b.shape, a.dtype)
        assert torch.equal(torch.isinf(a), torch.isinf(b)), (what, j)
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (what, j, (a - b).abs().max())


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("setup", ["plain", "chain", "tree"])
def test_greedy_scores_and_logits_match_hf(kind, setup):
    target, drafter = model(kind)
    ids = prompt()
    options = dict(max_new_tokens=NEW, min_new_tokens=5, eos_token_id=[7, 9], do_sample=False)
    ref = target.generate(ids, output_scores=True, output_logits=True, return_dict_in_generate=True, **options)
    if drafter is None:  # hybrid: a drafter that knows HF's continuation and plants mistakes on a schedule
        drafter = OracleDrafter(ref.sequences[0], depth=4)
    out = specdec.generate(target, ids, drafter=None if setup == "plain" else drafter,
                           tree=None if setup == "plain" else TREES[setup], output_scores=True, output_logits=True,
                           **options)  # fmt: skip
    assert torch.equal(out.sequences, ref.sequences)
    if setup != "plain":
        assert max(out.stats.accept_lengths) >= 2  # rounds accepted runs: scores came from several path nodes
    assert_steps_close(out.logits, ref.logits, "logits")
    assert_steps_close(out.scores, ref.scores, "scores")
    assert any(not torch.equal(s, lg) for s, lg in zip(out.scores, out.logits, strict=True))  # min_new_tokens shows


def test_batch_scores_match_hf():
    target, drafter = model("dense")
    ids = torch.cat([prompt(3), prompt(4)])
    options = dict(max_new_tokens=NEW, eos_token_id=[], do_sample=False, pad_token_id=0)
    ref = target.generate(ids, output_scores=True, output_logits=True, return_dict_in_generate=True, **options)
    out = specdec.generate(target, ids, drafter=drafter, tree=TREES["tree"], output_scores=True, output_logits=True,
                           **options)  # fmt: skip
    assert torch.equal(out.sequences, ref.sequences)
    assert_steps_close(out.logits, ref.logits, "logits")
    assert_steps_close(out.scores, ref.scores, "scores")


def test_speculative_model_returns_them_only_when_asked():
    target, drafter = model("dense")
    wrapped = specdec.SpeculativeModel(target, drafter=drafter)
    ids = prompt()
    out = wrapped.generate(ids, max_new_tokens=6, return_dict_in_generate=True, output_scores=True)
    assert out.scores is not None and len(out.scores) == 6 and out.logits is None
    plain = wrapped.generate(ids, max_new_tokens=6, return_dict_in_generate=True)
    assert plain.scores is None and plain.logits is None


def test_sampling_scores_are_the_processed_target_distribution_of_each_step():
    target, drafter = model("dense")
    ids = prompt()
    warp = dict(temperature=0.7, top_k=20, top_p=0.9)
    out = specdec.generate(target, ids, drafter=drafter, tree=TREES["chain"], max_new_tokens=NEW, do_sample=True,
                           eos_token_id=[], output_scores=True, output_logits=True,
                           generator=torch.Generator().manual_seed(0), **warp)  # fmt: skip
    full = target(out.sequences).logits[0, ids.shape[1] - 1 : -1].float()  # [NEW, V]: the logits before each token
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.9)])
    for j in range(NEW):
        assert torch.allclose(out.logits[j][0], full[j], atol=1e-4, rtol=1e-4), j
        ref = warpers(out.sequences[:, : ids.shape[1] + j], full[j : j + 1].clone())
        assert torch.equal(torch.isinf(out.scores[j]), torch.isinf(ref)), j
        assert torch.allclose(out.scores[j], ref, atol=1e-4, rtol=1e-4), j
        assert not torch.isinf(out.scores[j][0, out.sequences[0, ids.shape[1] + j]])  # the token drawn was allowed
