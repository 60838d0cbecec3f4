"""Calls a new user makes that used to fail deep inside the library or differ from HF's ``generate``: an n-gram ban
size HF treats as off, streamers without HF's protocol, a base model or a path where the causal LM is needed,
``hybrid_mode="snapshot"`` on a target without recurrent layers, prompts of the wrong shape, training settings that
train nothing. Each refusal must leave the next valid call equal to HF's own output. CPU, fp32, a tiny random target.
"""

from __future__ import annotations

import pytest
import torch
from models import tiny_model

import specdec
from specdec.train import TrainConfig

NEW = 8


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", scale=2.0)


def prompt(n: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def assert_next_call_equals_hf(target):
    """A valid call after a refused one: HF's greedy tokens."""
    ids = prompt(seed=3)
    out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3), max_new_tokens=NEW)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=NEW))


@pytest.mark.parametrize("size", [0, -1])
def test_a_no_repeat_ngram_size_of_zero_or_less_is_off_as_in_hf(target, size):
    """HF builds ``NoRepeatNGramLogitsProcessor`` only for a size > 0; -1 used to reach that class and raise."""
    ids = prompt()
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, no_repeat_ngram_size=size)
    drafter, tree = specdec.MTPDrafter.random(target, seed=1, std=0.3), specdec.DDTree(budget=8, topk=3)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, no_repeat_ngram_size=size)
    assert torch.equal(out.sequences, ref)


class _PutOnly:
    def __init__(self):
        self.calls = 0

    def put(self, value):
        self.calls += 1


@pytest.mark.parametrize(
    ("streamer", "match"),
    [
        (_PutOnly(), r"streamer=_PutOnly has no end\(\).*put\(token_ids\).*end\(\)"),
        (object(), r"streamer=object has no put\(\) or end\(\)"),
        (_PutOnly, r"streamer=_PutOnly is a class: pass an instance"),
    ],
)
def test_a_streamer_without_hfs_protocol_is_refused_before_decoding(target, streamer, match):
    """A streamer without ``end`` used to decode the whole sequence and fail at its end; a class failed at the first
    ``put``. Now a ``TypeError`` before anything runs (``put`` never called)."""
    with pytest.raises(TypeError, match=match):
        specdec.generate(target, prompt(), max_new_tokens=NEW, streamer=streamer)
    assert getattr(streamer, "calls", 0) == 0
    assert_next_call_equals_hf(target)


def test_a_streamer_with_put_and_end_still_receives_the_tokens(target):
    class Collect:
        def __init__(self):
            self.tokens, self.ended = [], False

        def put(self, value):
            self.tokens += value.reshape(-1).tolist()

        def end(self):
            self.ended = True

    ids, streamer = prompt(), Collect()
    out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3), max_new_tokens=NEW,
                           streamer=streamer)  # fmt: skip
    assert streamer.ended and streamer.tokens == target.generate(ids, do_sample=False, max_new_tokens=NEW)[0].tolist()
    assert torch.equal(out.sequences[0], torch.tensor(streamer.tokens))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda t: t.model, TypeError, r"target is a LlamaModel, which has no LM head.*\*ForCausalLM"),
        (lambda t: "some/model", TypeError, r"target='some/model' is a path.*from_pretrained\('some/model'\)"),
        (lambda t: None, TypeError, r"target must be an HF causal LM.*got NoneType"),
    ],
)
def test_a_target_that_is_no_causal_lm_is_named(target, make, error, match):
    """These used to be an ``AttributeError`` inside the target wrapper (``'NoneType' object has no attribute
    'weight'``, ``'str' object has no attribute '_parameters'``)."""
    with pytest.raises(error, match=match):
        specdec.generate(make(target), prompt(), max_new_tokens=NEW)
    with pytest.raises(error, match=match):
        specdec.SpeculativeModel(make(target))
    assert_next_call_equals_hf(target)


def test_a_model_drafter_of_a_base_model_is_named(target):
    with pytest.raises(TypeError, match=r"ModelDrafter's model is a LlamaModel, which has no LM head"):
        specdec.ModelDrafter(target.model)


def test_snapshot_mode_on_a_target_without_recurrent_layers_is_refused(target):
    """The round runs ``hybrid_mode="exact"`` only (docs/api.md: ``hybrid_mode="snapshot"`` is a ``ValueError``); on a
    dense target the mode used to be accepted and ignored."""
    model = specdec.SpeculativeModel(target, hybrid_mode="snapshot")
    with pytest.raises(ValueError, match=r"hybrid_mode='snapshot'.*no recurrent layers; use hybrid_mode='exact'"):
        model.generate(prompt(), max_new_tokens=NEW)
    assert_next_call_equals_hf(target)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (prompt()[0], r"input_ids is a tensor of shape \(7,\).*input_ids\[None\]"),
        (prompt()[0].tolist(), r"input_ids is a list.*torch.tensor\(\[ids\]\)"),
        (prompt()[None], r"input_ids is a tensor of shape \(1, 1, 7\): it must be a LongTensor of shape \[batch"),
    ],
)
def test_a_prompt_of_the_wrong_shape_names_what_was_given_and_the_fix(target, ids, match):
    with pytest.raises(ValueError, match=match):
        specdec.generate(target, ids, max_new_tokens=NEW)
    assert_next_call_equals_hf(target)


@pytest.mark.parametrize(
    ("field", "value", "least"),
    [("num_layers", 0, 1), ("num_layers", -1, 1), ("block_size", 1, 2), ("batch_size", 0, 1), ("num_anchors", 0, 1),
     ("log_every", 0, 1), ("intermediate_size", 0, 1), ("eval_every", -1, 0)],
)  # fmt: skip
def test_training_settings_that_train_nothing_are_refused(field, value, least):
    """``num_layers=0`` used to train (and save) a drafter without layers; ``log_every=0`` divided by zero at the
    first step."""
    with pytest.raises(ValueError, match=rf"{field}={value}: give an int >= {least}"):
        TrainConfig(target="t", corpus="c", out_dir="o", **{field: value})
    TrainConfig(target="t", corpus="c", out_dir="o", eval_every=0, save_every=0)  # 0 = only at the end, documented


def test_a_single_logits_processor_is_named_with_the_fix(target):
    """HF's protocol is a list; one processor used to be a ``TypeError: ... object is not iterable`` inside the
    library (as ``stopping_criteria`` already names it)."""
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    with pytest.raises(TypeError, match=r"logits_processor must be a list.*LogitsProcessorList\(\[processor\]\)"):
        specdec.generate(target, prompt(), max_new_tokens=NEW, logits_processor=RepetitionPenaltyLogitsProcessor(1.3))
    ids = prompt()
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)])
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, logits_processor=processors)
    out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3), max_new_tokens=NEW,
                           logits_processor=list(processors))  # fmt: skip
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize(
    ("processor", "given"),
    [(lambda ids, scores: None, "NoneType"), (lambda ids, scores: scores[:, :5], r"\(1, 5\)")],
)
def test_a_logits_processor_that_returns_no_scores_is_named(target, processor, given):
    """Used to be ``can't assign a NoneType to a torch.FloatTensor`` or a shape mismatch inside the round."""
    drafter, tree = specdec.NGramDrafter(), specdec.Chain(3)
    with pytest.raises(ValueError, match=rf"returned {given} for scores of shape \(1, 128\).*same shape"):
        specdec.generate(target, prompt(), drafter=drafter, tree=tree, max_new_tokens=NEW, logits_processor=[processor])
    assert_next_call_equals_hf(target)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(past_key_values=5), r"past_key_values=5 \(int\) is no cache"),
        (dict(cuda_graphs="yes"), r"cuda_graphs='yes' \(str\): pass True, False or None"),
    ],
)
def test_options_of_the_wrong_type_are_named(target, options, match):
    """``past_key_values=5`` and ``cuda_graphs="yes"`` used to be accepted without a word."""
    with pytest.raises(TypeError, match=match):
        specdec.generate(target, prompt(), max_new_tokens=NEW, **options)
    assert_next_call_equals_hf(target)


def test_an_hf_cache_as_past_key_values_is_still_accepted(target):
    """docs/api.md: an HF cache is accepted and not read (the prompt is prefilled from scratch, same tokens)."""
    ids = prompt()
    first = target.generate(ids, do_sample=False, max_new_tokens=3, return_dict_in_generate=True)
    whole = torch.cat([first.sequences, prompt(3, seed=5)], 1)
    ref = target.generate(whole, do_sample=False, max_new_tokens=NEW)
    out = specdec.generate(target, whole, max_new_tokens=NEW, past_key_values=first.past_key_values)
    assert torch.equal(out.sequences, ref)
