"""Drop-in ``generate`` arguments: HF's own ``generate`` is the reference wherever it accepts the argument."""

import numpy as np
import pytest
import torch
from models import perturbed_copy, tiny_model
from transformers import GenerationConfig

import specdec
from specdec.hf_args import IGNORED, REFUSED, REFUSED_WHEN_SAMPLING, SUPPORTED


def prompt(n: int = 10, seed: int = 1) -> torch.Tensor:
    motif = torch.randint(3, 128, (n // 2,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([motif, motif]).unsqueeze(0)


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen3", scale=2.0)


@pytest.fixture(scope="module")
def drafter(target):
    return specdec.ModelDrafter(perturbed_copy(target, noise=0.01))


def frequent_token(target, ids) -> int:
    """The token greedy decoding emits most often early on (a stop token that must be suppressed repeatedly)."""
    free = target.generate(ids, do_sample=False, max_new_tokens=30)[0, ids.shape[1] :]
    return int(torch.mode(free[:12]).values)


def spec(target, ids, drafter=None, tree=None, **kw):
    return specdec.generate(target, ids, drafter=drafter, tree=tree, **kw).sequences


@pytest.mark.parametrize(
    "kw",
    [
        {"max_length": 25},
        {"max_length": 11},
        {"max_new_tokens": 6, "max_length": 100},  # max_new_tokens wins, as in HF
        {"max_new_tokens": 12, "pad_token_id": 0},
        {"max_new_tokens": 12, "use_cache": False},
        {"max_new_tokens": 12, "bos_token_id": 1, "length_penalty": 2.0},
    ],
    ids=["max_length", "max_length_one_token", "max_new_wins", "pad_token_id", "use_cache", "ignored_options"],
)
def test_generate_length_and_passthrough_arguments_match_hf(target, drafter, kw):
    ids = prompt()
    ref = target.generate(ids, do_sample=False, **kw)
    assert torch.equal(spec(target, ids, drafter, specdec.Chain(4), do_sample=False, **kw), ref)


def test_generate_default_length_matches_hf_for_long_prompts(target):
    ids = prompt(30)  # longer than HF's default max_length of 20: HF then generates 20 new tokens
    with pytest.warns(UserWarning):
        ref = target.generate(ids, do_sample=False)
    assert ref.shape[1] == 50
    assert torch.equal(spec(target, ids, specdec.NGramDrafter()), ref)


def test_generate_max_length_below_the_prompt_is_refused_like_hf(target):
    with pytest.raises(ValueError, match="max_length"):
        target.generate(prompt(), max_length=8)
    with pytest.raises(ValueError, match=r"prompt has 10 tokens but max_length=8"):
        spec(target, prompt(), max_length=8)


@pytest.mark.parametrize("tree", [specdec.Chain(6), specdec.DDTree(8, topk=3)], ids=["chain", "ddtree"])
@pytest.mark.parametrize("kw", [{"min_new_tokens": 9}, {"min_length": 19}], ids=["min_new_tokens", "min_length"])
def test_generate_min_new_tokens_matches_hf(target, drafter, tree, kw):
    ids = prompt()
    eos = frequent_token(target, ids)
    plain = target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
    ref = target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=eos, pad_token_id=0, **kw)
    assert plain.shape[1] < ids.shape[1] + 9 < ref.shape[1]  # HF really suppressed an early EOS
    out = spec(target, ids, drafter, tree, do_sample=False, max_new_tokens=30, eos_token_id=eos, **kw)
    assert torch.equal(out, ref)


def test_generate_min_new_tokens_when_sampling(target):
    """At temperature > 0 the stop token never comes before min_new_tokens, though it comes early without it."""
    ids = prompt()
    eos = frequent_token(target, ids)
    first_eos = {}
    for min_new in (0, 8):
        found = []
        for seed in range(6):
            gen = torch.Generator().manual_seed(seed)
            out = spec(target, ids, specdec.NGramDrafter(), specdec.DDTree(6), do_sample=True, temperature=0.7,
                       max_new_tokens=20, eos_token_id=eos, min_new_tokens=min_new, generator=gen)  # fmt: skip
            new = out[0, ids.shape[1] :].tolist()
            found.append(new.index(eos) if eos in new else len(new))
        first_eos[min_new] = found
    assert min(first_eos[0]) < 8
    assert min(first_eos[8]) >= 8


def test_generate_generation_config_merges_as_hf(target, drafter):
    ids = prompt()
    eos = frequent_token(target, ids)
    config = GenerationConfig(max_new_tokens=25, min_new_tokens=6, eos_token_id=eos, do_sample=False, pad_token_id=0)
    ref = target.generate(ids, generation_config=config)
    assert torch.equal(spec(target, ids, drafter, specdec.Chain(4), generation_config=config), ref)
    ref = target.generate(ids, generation_config=config, max_new_tokens=9)  # arguments win over the config
    assert torch.equal(spec(target, ids, drafter, specdec.Chain(4), generation_config=config, max_new_tokens=9), ref)


def test_generate_reads_the_targets_generation_config():
    target = tiny_model("llama", scale=2.0)
    ids = prompt()
    target.generation_config.max_new_tokens = 7
    ref = target.generate(ids, do_sample=False)
    assert ref.shape[1] == 17
    assert torch.equal(spec(target, ids, specdec.NGramDrafter()), ref)


@pytest.mark.parametrize(
    "eos_form",
    [lambda e: np.int64(e), lambda e: [[e], [3]], lambda e: (e,), lambda e: torch.tensor([e])],
    ids=["numpy_int", "nested_list", "tuple", "tensor"],
)
def test_generate_eos_forms_match_hf(target, drafter, eos_form):
    ids = prompt()
    eos = frequent_token(target, ids)
    ref = target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=eos_form(eos), pad_token_id=0)
    assert ref.shape[1] < ids.shape[1] + 30
    out = spec(target, ids, drafter, specdec.Chain(4), max_new_tokens=30, eos_token_id=eos_form(eos))
    assert torch.equal(out, ref)


@pytest.mark.parametrize("bad", ["299", ["2", 9], 2.0, True])
def test_generate_eos_strings_and_floats_are_refused(target, bad):
    with pytest.raises(TypeError, match="eos_token_id"):
        spec(target, prompt(), max_new_tokens=4, eos_token_id=bad)


@pytest.mark.parametrize(
    "name, value, why",
    [
        ("num_beams", 2, "beam search"),
        ("penalty_alpha", 0.6, "contrastive search"),
        ("dola_layers", "high", "DoLa"),
        ("output_attentions", True, "attention weights"),
        ("token_healing", True, "token healing"),
        ("guidance_scale", 1.5, "guidance"),
        ("prompt_lookup_num_tokens", 3, "drafter="),
        ("assistant_model", "a model", ""),
    ],
)
def test_generate_unsupported_options_raise_value_error_with_the_reason(target, name, value, why):
    with pytest.raises(ValueError, match=rf"{name}.*(unsupported|not supported).*{why}"):
        spec(target, prompt(), max_new_tokens=4, **{name: value})


def test_the_sampling_warpers_are_hfs_in_hfs_order(target):
    """specdec's warpers equal the list HF's generate builds for the same GenerationConfig (its order included)."""
    from transformers import GenerationConfig

    from specdec.types import SamplingParams
    from specdec.verify.processing import process_logits

    settings = dict(temperature=0.7, top_k=30, top_p=0.95, min_p=0.02, typical_p=0.9, epsilon_cutoff=3e-4,
                    eta_cutoff=1e-3)  # fmt: skip
    hf_list = target._get_logits_processor(GenerationConfig(do_sample=True, **settings), input_ids_seq_length=4)
    logits = torch.randn(6, 128, generator=torch.Generator().manual_seed(0)) * 3
    ours = process_logits(logits, SamplingParams(do_sample=True, **settings))
    assert torch.equal(ours, hf_list(torch.zeros(6, 4, dtype=torch.long), logits.clone()))
    ours_top_h = process_logits(logits, SamplingParams(do_sample=True, top_h=0.5))
    top_h = GenerationConfig(do_sample=True, top_h=0.5, top_k=0)
    hf_top_h = target._get_logits_processor(top_h, input_ids_seq_length=4)
    assert torch.equal(ours_top_h, hf_top_h(torch.zeros(6, 4, dtype=torch.long), logits.clone()))
    # greedy never reads them, as in HF
    ref = target.generate(prompt(), do_sample=False, max_new_tokens=6, typical_p=0.5)
    assert torch.equal(spec(target, prompt(), max_new_tokens=6, typical_p=0.5), ref)


def test_refused_option_from_the_targets_config_says_how_to_override():
    target = tiny_model("llama", scale=2.0)
    target.generation_config.num_beams = 2
    with pytest.raises(ValueError, match=r"set by the target's generation_config.*Pass num_beams=1"):
        spec(target, prompt(), max_new_tokens=6)
    ref = target.generate(prompt(), do_sample=False, max_new_tokens=6, num_beams=1)
    assert torch.equal(spec(target, prompt(), max_new_tokens=6, num_beams=1), ref)


def test_a_processor_set_by_the_targets_config_is_honoured():
    target = tiny_model("llama", scale=2.0)
    target.generation_config.repetition_penalty = 3.0
    ref = target.generate(prompt(), do_sample=False, max_new_tokens=12)
    assert torch.equal(spec(target, prompt(), specdec.NGramDrafter(), specdec.DDTree(8), max_new_tokens=12), ref)


@pytest.mark.parametrize("name, value", [("num_beams", 3), ("num_beams", 2)])
def test_refused_options_really_change_hf_output(target, name, value):
    """The refusals are not spurious: HF's own output changes with these options."""
    ids = prompt()
    assert not torch.equal(
        target.generate(ids, do_sample=False, max_new_tokens=20, top_k=4, **{name: value}),
        target.generate(ids, do_sample=False, max_new_tokens=20),
    )


def test_every_generation_config_field_is_classified():
    known = set(SUPPORTED) | set(REFUSED) | set(REFUSED_WHEN_SAMPLING) | IGNORED
    assert set(GenerationConfig().to_dict()) <= known


def test_generate_unknown_argument_is_a_value_error(target):
    with pytest.raises(ValueError, match="unknown argument 'max_new_token'"):
        spec(target, prompt(), max_new_token=4)
    with pytest.raises(ValueError, match="token_type_ids is a model input"):
        spec(target, prompt(), max_new_tokens=4, token_type_ids=torch.zeros(1, 10, dtype=torch.long))


def test_generate_bad_drafter_and_tree_types(target):
    with pytest.raises(TypeError, match=r"drafter=NGramDrafter is a class: pass an instance"):
        spec(target, prompt(), specdec.NGramDrafter, max_new_tokens=4)
    with pytest.raises(TypeError, match=r"drafter='ngram' is a string: pass a drafter instance"):
        spec(target, prompt(), "ngram", max_new_tokens=4)
    with pytest.raises(TypeError, match=r"tree=DDTree is a class: pass an instance"):
        spec(target, prompt(), specdec.NGramDrafter(), specdec.DDTree, max_new_tokens=4)
    with pytest.raises(TypeError, match="tree must implement the TreePolicy protocol .* got 15"):
        spec(target, prompt(), specdec.NGramDrafter(), 15, max_new_tokens=4)
    with pytest.raises(TypeError, match="drafter must implement the Drafter protocol"):
        spec(target, prompt(), object(), max_new_tokens=4)


def test_tree_specs_take_positional_arguments(target):
    assert specdec.DDTree(15) == specdec.DDTree(budget=15)
    assert specdec.DDTree(8, 3) == specdec.DDTree(budget=8, topk=3)
    assert specdec.Chain(4) == specdec.Chain(k=4)
    ref = target.generate(prompt(), do_sample=False, max_new_tokens=12)
    assert torch.equal(spec(target, prompt(), specdec.NGramDrafter(), specdec.DDTree(6), max_new_tokens=12), ref)


def test_generate_bad_input_ids_and_mask(target):
    with pytest.raises(ValueError, match="input_ids has dtype torch.float32"):
        spec(target, prompt().float(), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"attention_mask \(1, 9\) must be a tensor of the shape of input_ids"):
        spec(target, prompt(), max_new_tokens=4, attention_mask=torch.ones(1, 9, dtype=torch.long))
    ref = target.generate(prompt(), do_sample=False, max_new_tokens=6)
    assert torch.equal(spec(target, prompt().int(), max_new_tokens=6), ref)  # int32 ids are fine


def test_stats_accept_lengths(target, drafter):
    ids = prompt()
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(5), max_new_tokens=33)
    lengths = out.stats.accept_lengths
    assert len(lengths) == out.stats.rounds and all(1 <= n <= 6 for n in lengths)
    assert sum(lengths) == out.sequences.shape[1] - ids.shape[1] - 1  # every token after the prefill's
    assert out.stats.tau == pytest.approx(sum(lengths) / len(lengths))
    assert out.stats.as_dict()["accept_lengths"] == lengths


def test_speculative_model_surface(target):
    model = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.DDTree(6))
    assert model.config is target.config and model.generation_config is target.generation_config
    assert model.device == target.device
    text = repr(model)
    assert "Qwen3ForCausalLM" in text and "NGramDrafter" in text and "DDTree(budget=6" in text
    enc = {"input_ids": prompt(), "attention_mask": torch.ones(1, 10, dtype=torch.long)}  # a tokenizer's output
    ref = target.generate(**enc, do_sample=False, max_new_tokens=15)
    assert torch.equal(model.generate(**enc, do_sample=False, max_new_tokens=15), ref)
    assert torch.equal(model.generate(inputs=prompt(), max_new_tokens=15), ref)
    out = model.generate(prompt(), GenerationConfig(max_new_tokens=15, return_dict_in_generate=True))
    assert isinstance(out, specdec.GenerateOutput) and torch.equal(out.sequences, ref)
    with pytest.raises(TypeError, match="is a class"):
        specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter)
