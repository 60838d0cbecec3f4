"""Bad input gets a clear error naming the problem and the fix, before any cache is touched."""

import pytest
import torch
from models import tiny_model

import specdec
from specdec.target import TargetModel


@pytest.fixture(scope="module")
def target():
    return TargetModel(tiny_model("llama", scale=2.0))


IDS = torch.tensor([[5, 6, 7, 8]])


def gen(target, ids=IDS, **kw):
    kw.setdefault("max_new_tokens", 5)
    return specdec.generate(target, ids, **kw)


def test_error_drafter_vocab_mismatch(target):
    draft = specdec.ModelDrafter(tiny_model("llama", vocab_size=200))
    with pytest.raises(ValueError, match=r"vocabulary \(200\) differs from the target's \(128\)"):
        gen(target, drafter=draft)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: specdec.DDTree(budget=0), "budget must be an int >= 1"),
        (lambda: specdec.DDTree(budget=4, topk=0), "topk must be an int >= 1"),
        (lambda: specdec.Chain(k=0), "k must be an int >= 1"),
    ],
)
def test_error_bad_tree_spec(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_error_empty_prompt(target):
    with pytest.raises(ValueError, match="prompt is empty"):
        gen(target, ids=torch.zeros(1, 0, dtype=torch.long))


def test_error_too_long(target):
    with pytest.raises(ValueError, match="needs 516 positions but the target handles 512"):
        gen(target, max_new_tokens=512)


def test_error_batch(target):
    with pytest.raises(ValueError, match="Batch size 2 is not supported yet"):
        gen(target, ids=IDS.repeat(2, 1))


def test_error_padding(target):
    with pytest.raises(ValueError, match="attention_mask contains padding"):
        gen(target, attention_mask=torch.tensor([[0, 1, 1, 1]]))


def test_error_bad_max_new_tokens(target):
    with pytest.raises(ValueError, match="max_new_tokens=0 must be an int >= 1"):
        gen(target, max_new_tokens=0)


def test_error_device_mismatch(target):
    with pytest.raises(ValueError, match="input_ids are on meta but the target is on cpu"):
        gen(target, ids=IDS.to("meta"))


def test_error_draft_device_mismatch(target):
    draft = specdec.ModelDrafter(tiny_model("llama").to("meta"))
    with pytest.raises(ValueError, match="Draft model is on meta but the target is on cpu"):
        gen(target, drafter=draft)


def test_error_attention_implementation():
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match='attn_implementation="sdpa"'):
        TargetModel(model)


def test_error_sampling_params(target):
    with pytest.raises(ValueError, match="temperature=0.0 must be > 0"):
        gen(target, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match=r"top_p=1.5 must be in \(0, 1\]"):
        gen(target, do_sample=True, top_p=1.5)


def test_errors_leave_the_cache_untouched(target):
    out = gen(target, drafter=specdec.NGramDrafter(), max_new_tokens=8)
    cache, length = target.cache, target.length
    snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    for bad in (dict(ids=IDS.repeat(2, 1)), dict(max_new_tokens=10_000), dict(attention_mask=torch.zeros(1, 4))):
        with pytest.raises(ValueError):
            gen(target, **bad)
    assert target.cache is cache and target.length == length
    for layer, (k, v) in zip(cache.layers, snapshot, strict=True):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert out.stats.new_tokens == 8


def test_failed_round_rolls_back_the_target_cache(target):
    gen(target, max_new_tokens=3)
    length = target.length
    bad = specdec.DraftTree(torch.tensor([5, 10_000]), torch.tensor([-1, 0]))  # token id out of range
    with pytest.raises(IndexError):
        target.verify(bad)
    assert target.cache.get_seq_length() == length == target.length
