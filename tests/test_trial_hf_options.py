"""HF ``generate`` options a drop-in call passes in less common ways, each compared with HF's own ``generate`` of the
same call: an argument passed as None (which in HF overrides the target's ``generation_config``), ``renormalize_logits``
with ``output_scores``, ``forced_bos_token_id``, and ``SpeculativeModel`` used where an HF model is expected. CPU,
fp32, a tiny random target.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from models import tiny_model
from transformers import LogitsProcessorList, StoppingCriteriaList

import specdec

NEW = 8


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", scale=2.0)


def prompt(n: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def drafted(target):
    """A drafter and tree policy: an MTP head over a DDTree (every option runs through the tree's nodes)."""
    return specdec.MTPDrafter.random(target, seed=1, std=0.3), specdec.DDTree(budget=8, topk=3)


@pytest.fixture(scope="module")
def configured(target):
    """The target with a generation_config that sets lengths, an EOS, a minimum length and top-k (as shipped models'
    configs do)."""
    model = copy.deepcopy(target)
    ids = prompt()
    greedy = target.generate(ids, do_sample=False, max_new_tokens=12)[0, ids.shape[1] :].tolist()
    config = model.generation_config
    config.max_new_tokens, config.max_length, config.min_length = 6, 12, 3
    config.eos_token_id, config.min_new_tokens, config.top_k = greedy[8], 10, 3
    return model


@pytest.mark.parametrize("name", ["max_new_tokens", "eos_token_id", "min_new_tokens"])
def test_an_argument_passed_as_none_overrides_the_targets_generation_config(configured, name):
    """HF: ``generate(max_new_tokens=None)`` sets None over the target's value (then ``max_length`` rules); left out,
    the target's value holds. Each with its own tokens here."""
    ids = prompt()
    ref = configured.generate(ids, do_sample=False, **{name: None})
    assert not torch.equal(ref, configured.generate(ids, do_sample=False))  # the None changes HF's output
    drafter, tree = drafted(configured)
    out = specdec.generate(configured, ids, drafter=drafter, tree=tree, do_sample=False, **{name: None})
    assert torch.equal(out.sequences, ref)


def test_top_k_passed_as_none_samples_from_the_whole_vocabulary(configured):
    """The target's ``top_k=3``, the call's ``top_k=None``: HF applies no top-k; the first step's scores (before any
    sample is drawn) equal HF's."""
    ids = prompt()
    ref = configured.generate(ids, do_sample=True, top_k=None, output_scores=True, return_dict_in_generate=True)
    out = specdec.generate(configured, ids, do_sample=True, top_k=None, output_scores=True,
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert int(torch.isfinite(ref.scores[0]).sum()) > 3
    assert torch.allclose(out.scores[0], ref.scores[0], atol=1e-5)


def test_a_refused_option_of_the_target_is_overridden_by_passing_none(target):
    """The refusal names ``dola_layers=None`` as the fix; passing it must work (HF decodes without DoLa then)."""
    model = copy.deepcopy(target)
    model.generation_config.dola_layers = "high"
    ids = prompt()
    with pytest.raises(ValueError, match="dola_layers=None"):
        specdec.generate(model, ids, max_new_tokens=NEW)
    out = specdec.generate(model, ids, max_new_tokens=NEW, dola_layers=None)
    assert torch.equal(out.sequences, model.generate(ids, max_new_tokens=NEW, dola_layers=None))


def test_speculative_model_return_dict_passed_as_none(target):
    model = copy.deepcopy(target)
    model.generation_config.return_dict_in_generate = True
    wrapped = specdec.SpeculativeModel(model)
    ids = prompt()
    assert isinstance(model.generate(ids, max_new_tokens=NEW, return_dict_in_generate=None), torch.Tensor)
    assert isinstance(wrapped.generate(ids, max_new_tokens=NEW, return_dict_in_generate=None), torch.Tensor)
    assert not isinstance(wrapped.generate(ids, max_new_tokens=NEW), torch.Tensor)


@pytest.mark.parametrize("sampling", [False, True])
def test_renormalized_scores_equal_hfs(target, sampling):
    """``renormalize_logits=True``: HF log-softmaxes the scores after every processor and warper (tokens unchanged).
    Greedy: every step; sampling: the first step (later ones follow the token each drew)."""
    ids = prompt()
    options = dict(max_new_tokens=NEW, renormalize_logits=True, output_scores=True, suppress_tokens=[5],
                   do_sample=sampling, **({"top_k": 10} if sampling else {}))  # fmt: skip
    ref = target.generate(ids, return_dict_in_generate=True, **options)
    drafter, tree = drafted(target)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, generator=torch.Generator().manual_seed(0),
                           **options)  # fmt: skip
    steps = range(NEW) if not sampling else range(1)
    if not sampling:
        assert torch.equal(out.sequences, ref.sequences)
    for j in steps:
        assert torch.equal(torch.isinf(out.scores[j]), torch.isinf(ref.scores[j])), j
        assert torch.allclose(out.scores[j], ref.scores[j], atol=1e-4), (j, (out.scores[j] - ref.scores[j]).abs().max())


@pytest.mark.parametrize("width", [1, 7])
def test_forced_bos_token_id_equals_hf(target, width):
    """HF applies ``forced_bos_token_id`` to causal LMs too, where ``input_ids`` are one token wide (the first new
    token is forced); a wider prompt is never forced. Tokens and scores equal HF's, rows of a batch included."""
    ids = torch.cat([prompt(width, seed=0), prompt(width, seed=1)])
    options = dict(max_new_tokens=NEW, forced_bos_token_id=9, output_scores=True, do_sample=False)
    ref = target.generate(ids, return_dict_in_generate=True, **options)
    assert torch.equal(ref.sequences[:, width], torch.tensor([9, 9])) == (width == 1)
    drafter, tree = drafted(target)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, **options)
    assert torch.equal(out.sequences, ref.sequences)
    for j in range(NEW):
        assert torch.equal(torch.isinf(out.scores[j]), torch.isinf(ref.scores[j])), j
        assert torch.allclose(out.scores[j], ref.scores[j], atol=1e-4), j


def test_speculative_model_reads_as_the_hf_model(target):
    """Code written for the HF model: its other attributes and methods are the target's, ``train``/``half``-style
    casts return the wrapper (not the bare model, which would drop the speculation), and the wrapper keeps
    decoding as HF after them."""
    model = copy.deepcopy(target)
    wrapped = specdec.SpeculativeModel(model, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3))
    assert list(wrapped.parameters()) == list(model.parameters())
    assert wrapped.get_input_embeddings() is model.get_input_embeddings()
    assert wrapped.can_generate() and wrapped.main_input_name == "input_ids"
    assert wrapped.train() is wrapped and model.training
    assert wrapped.train(False) is wrapped and not model.training
    assert wrapped.double() is wrapped and model.dtype == torch.float64
    assert wrapped.float() is wrapped and model.dtype == torch.float32
    assert wrapped.cpu() is wrapped
    ids = prompt()
    assert torch.equal(wrapped.generate(ids, max_new_tokens=NEW), target.generate(ids, max_new_tokens=NEW))
    with pytest.raises(AttributeError, match="no_such_attribute"):
        wrapped.no_such_attribute  # noqa: B018
    copied = copy.deepcopy(wrapped)
    assert torch.equal(copied.generate(ids, max_new_tokens=NEW), target.generate(ids, max_new_tokens=NEW))


def test_a_speculative_model_passed_to_specdec_generate_is_named(target):
    wrapped = specdec.SpeculativeModel(target)
    with pytest.raises(TypeError, match=r"SpeculativeModel.*its own generate.*\.target\.model"):
        specdec.generate(wrapped, prompt(), max_new_tokens=NEW)


def _warnings(call) -> list[str]:
    """Warning records of transformers' and specdec's loggers while ``call()`` runs (HF's do not propagate)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect(level=logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("transformers", "specdec")]
    for each in loggers:
        each.addHandler(handler)
    try:
        call()
    finally:
        for each in loggers:
            each.removeHandler(handler)
    return records


@pytest.mark.parametrize("options", [dict(max_new_tokens=4, max_length=9),
                                     dict(max_new_tokens=4, min_new_tokens=2, min_length=9, eos_token_id=3),
                                     dict(max_new_tokens=4, top_p=0.8),
                                     dict(),  # HF's default length
                                     dict(max_new_tokens=4, min_new_tokens=9, eos_token_id=3),
                                     dict(max_new_tokens=4, min_length=30, eos_token_id=3)])  # fmt: skip
def test_hfs_warnings_about_the_settings_are_given(target, options, monkeypatch):
    """HF warns where ``max_new_tokens`` wins over ``max_length`` (and ``min_new_tokens`` over ``min_length``), where
    a sampling flag is set without ``do_sample``, where its default length is used and where a minimum length is past
    the maximum; specdec gives the same words. HF's flag warning is logged once per process, so its once-cache is
    emptied before each call."""
    import warnings

    from transformers.utils import logging as hf_logging

    ids = prompt()
    topics = ("seem to have been set", "generation flags", "model-agnostic default", "Unfeasible length")

    def words(call) -> set[str]:
        monkeypatch.setattr(hf_logging.logging.Logger, "warning_once", hf_logging.logging.Logger.warning, raising=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logged = _warnings(call)
        return {m for m in logged + [str(w.message) for w in caught] if any(t in m for t in topics)}

    ref = words(lambda: target.generate(ids, **options))
    assert ref  # HF warns
    assert words(lambda: specdec.generate(target, ids, **options)) == ref


def test_speculative_model_eval_reaches_the_drafters_modules(target):
    """``eval()`` as ``nn.Module.eval`` reaches children: a draft LM left in training mode would draft with dropout
    (a random acceptance from call to call)."""
    draft = copy.deepcopy(target).train()
    drafter = specdec.ModelDrafter(draft)
    wrapped = specdec.SpeculativeModel(target, drafter=drafter, tree=specdec.Chain(3))
    assert wrapped.eval() is wrapped and not draft.training and not target.training
    head = specdec.MTPDrafter.random(target, seed=1, std=0.3)
    head.model.train()
    specdec.SpeculativeModel(target, drafter=head).eval()
    assert not head.model.training


def test_output_scores_is_not_called_ignored_where_it_is_returned(target, monkeypatch):
    """HF warns that ``output_scores`` without ``return_dict_in_generate`` is ignored: true of ``model.generate`` and
    of ``SpeculativeModel.generate``, not of ``specdec.generate``, which returns the scores."""
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(hf_logging.logging.Logger, "warning_once", hf_logging.logging.Logger.warning, raising=False)
    ids = prompt()

    def flags(call) -> list[str]:
        return [m for m in _warnings(call) if "generation flags" in m and "output_scores" in m]

    assert flags(lambda: target.generate(ids, max_new_tokens=3, output_scores=True))
    assert flags(lambda: specdec.SpeculativeModel(target).generate(ids, max_new_tokens=3, output_scores=True))
    assert not flags(lambda: specdec.generate(target, ids, max_new_tokens=3, output_scores=True))
    wrapped = specdec.SpeculativeModel(target)
    assert not flags(lambda: wrapped.generate(ids, max_new_tokens=3, output_scores=True, return_dict_in_generate=True))


def _custom_cases():
    from transformers.generation import logits_process as hp

    eos = 81  # a token of the greedy continuation of prompt() (its 6th), so that the minimum lengths show
    return {
        # repetition_penalty builds HF's RepetitionPenaltyLogitsProcessor; the call's own of that class replaces it
        "repetition": (lambda: [hp.RepetitionPenaltyLogitsProcessor(1.5)], dict(repetition_penalty=1.2)),
        "ngram": (lambda: [hp.NoRepeatNGramLogitsProcessor(3)], dict(no_repeat_ngram_size=2)),
        # HF builds MinLength (16) only; the custom MinLength (9) replaces it, at HF's place (before forced EOS)
        "min_length": (lambda: [hp.MinLengthLogitsProcessor(9, eos)], dict(min_length=16, eos_token_id=eos)),
        "min_length_before_forced_eos": (lambda: [hp.MinLengthLogitsProcessor(30, eos)],
                                         dict(forced_eos_token_id=eos, eos_token_id=eos, min_length=3)),
    }


@pytest.mark.parametrize("case", list(_custom_cases()))
def test_a_custom_processor_of_a_class_hf_builds_takes_its_place(target, case):
    """HF's merge (``_merge_criteria_processor_list``): a ``logits_processor`` entry of the class HF builds from the
    settings replaces HF's own at its place (with HF's warning), rather than running after it."""
    make, options = _custom_cases()[case]
    ids = prompt()
    options = dict(max_new_tokens=14, do_sample=False, **options)
    ref = target.generate(ids, logits_processor=LogitsProcessorList(make()), **options)
    for drafter, tree in ((None, None), drafted(target)):
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, logits_processor=make(), **options)
        assert torch.equal(out.sequences, ref), (case, drafter)


def test_begin_suppress_tokens_after_a_forced_bos(target):
    """A one-token prompt with ``forced_bos_token_id``: HF suppresses ``begin_suppress_tokens`` at the second new
    token (its ``begin_index`` moves past the forced one)."""
    ids = prompt(1)
    second = target.generate(ids, max_new_tokens=2, forced_bos_token_id=9)[0, 2].item()
    options = dict(max_new_tokens=6, do_sample=False, forced_bos_token_id=9, begin_suppress_tokens=[9, second])
    ref = target.generate(ids, **options)
    assert ref[0, 1] == 9 and ref[0, 2] != second
    drafter, tree = drafted(target)
    assert torch.equal(specdec.generate(target, ids, drafter=drafter, tree=tree, **options).sequences, ref)


def _criteria_cases():
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

    greedy = [12, 12, 121, 51, 21, 81, 21, 81]  # prompt()'s greedy continuation (checked in the test)
    return greedy, {
        "max_length_beyond_max_new_tokens": (lambda: [MaxLengthCriteria(max_length=26)], dict(max_new_tokens=10)),
        "max_length_beyond_the_default": (lambda: [MaxLengthCriteria(max_length=33)], dict()),
        # HF stops at the custom EosTokenCriteria's id only, not at the call's eos_token_id (51)
        "eos": (lambda: [EosTokenCriteria(eos_token_id=81)], dict(max_new_tokens=20, eos_token_id=51)),
        "max_time": (lambda: [MaxTimeCriteria(600.0)], dict(max_new_tokens=12, max_time=0.0)),
    }


@pytest.mark.parametrize("case", list(_criteria_cases()[1]))
def test_a_custom_criterion_of_a_class_hf_builds_takes_its_place(target, case):
    """HF's merge of ``stopping_criteria``: an entry of the class HF builds from the settings replaces HF's own
    (``MaxLengthCriteria`` the length limit, ``EosTokenCriteria`` the stop tokens, ``MaxTimeCriteria`` max_time)."""
    greedy, cases = _criteria_cases()
    make, options = cases[case]
    ids = prompt()
    assert target.generate(ids, do_sample=False, max_new_tokens=8)[0, ids.shape[1] :].tolist() == greedy
    ref = target.generate(ids, do_sample=False, stopping_criteria=StoppingCriteriaList(make()), **options)
    for drafter, tree in ((None, None), drafted(target)):
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, stopping_criteria=make(), **options)
        assert torch.equal(out.sequences, ref), (case, drafter)
