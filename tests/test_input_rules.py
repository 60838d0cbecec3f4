"""Prompts without ``attention_mask``: the mask is inferred from ``pad_token_id`` as HF's ``generate`` infers it.

Expected tokens come from HF's own ``model.generate`` called the same way (the same ``input_ids``, no mask, the
same generation arguments): left-padded batches and single rows with leading pad tokens, the pad id from the call,
a ``generation_config`` or the target's ``generation_config``, and HF's EOS fallback (a pad id equal to an EOS id
infers nothing, so HF decodes the pads as text, and so does specdec). A row that is not left-padded gets the error it
gets with an explicit mask. CPU, fp32, tiny random targets and the zoo's dense target.
"""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path

import pytest
import torch
from models import tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.utils import GenerationMixin

import specdec
from specdec import hf_args

LENGTHS = (5, 12, 8)
MAX_NEW = 12
ZOO_DRAFTER = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "zoo-dense"


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", scale=2.0)  # generation_config: pad_token_id=0, no EOS


def left_padded(pad: int, lengths=LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` left-padded with ``pad`` (real tokens never equal it) and the tokenizer's mask ``[B, T]``."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        row = torch.randint(4, 128, (n,), generator=gen)
        ids[b, width - n :] = torch.where(row == pad, pad + 1, row)
        mask[b, width - n :] = 1
    return ids, mask


def sharp_drafter(target) -> specdec.DFlashDrafter:
    """A random DFlash drafter with sharp distributions (as ``tests/round/test_round.py`` makes them)."""
    drafter = specdec.DFlashDrafter.for_target(
        target, mask_token_id=3, num_layers=1, block_size=6, target_layer_ids=(0, 1), intermediate_size=128, seed=1
    )
    with torch.no_grad():
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    return drafter


DRAFTERS = {
    "ar": lambda t: (None, None),
    "ngram": lambda t: (specdec.NGramDrafter(), specdec.Chain(4)),
    "dflash-tree": lambda t: (sharp_drafter(t), specdec.DDTree(budget=8, topk=3)),
    "mtp-tree": lambda t: (specdec.MTPDrafter.random(t, seed=1, std=0.3), specdec.DDTree(budget=8, topk=3)),
    "eagle3-tree": lambda t: (
        specdec.Eagle3Drafter.for_target(t, layer_ids=(2, 1, 2), seed=1),
        specdec.DDTree(budget=8),
    ),
}


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_padded_batch_without_mask_equals_hf(target, method):
    drafter, tree = DRAFTERS[method](target)
    ids, mask = left_padded(pad=0)
    ref = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)  # HF infers the mask from pad_token_id=0
    assert torch.equal(ref, target.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False))
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, ref)
    assert [r.new_tokens for r in out.stats.rows] == [MAX_NEW] * len(LENGTHS)


def test_one_row_with_leading_pads_equals_hf(target):
    ids, _ = left_padded(pad=0, lengths=(4, 9))
    row = ids[:1]  # 5 pad tokens, then 4 tokens
    ref = target.generate(row, max_new_tokens=MAX_NEW, do_sample=False)
    for drafter, tree in (DRAFTERS["ar"](target), DRAFTERS["dflash-tree"](target)):
        out = specdec.generate(target, row, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
        assert torch.equal(out.sequences, ref)


def test_speculative_model_infers_the_mask(target):
    model = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3))
    ids, _ = left_padded(pad=0)
    assert torch.equal(model.generate(ids, max_new_tokens=MAX_NEW), target.generate(ids, max_new_tokens=MAX_NEW))
    assert torch.equal(model.generate(input_ids=ids[2:], max_new_tokens=MAX_NEW),
                       target.generate(ids[2:], max_new_tokens=MAX_NEW))  # fmt: skip


@pytest.mark.parametrize("source", ["call", "generation_config"])
def test_pad_id_from_the_call_or_a_generation_config(target, source):
    """A pad id other than the target's (7): passed to the call, or in a ``generation_config``; the pad tokens are 7."""
    ids, _ = left_padded(pad=7)
    kw = {"pad_token_id": 7} if source == "call" else {"generation_config": GenerationConfig(pad_token_id=7)}
    ref = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, **kw)
    out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3), max_new_tokens=MAX_NEW,
                           **kw)  # fmt: skip
    assert torch.equal(out.sequences, ref)
    # the target's pad id (0) is not in these prompts: HF infers nothing and decodes the 7s, as specdec does
    plain = specdec.generate(target, ids, max_new_tokens=MAX_NEW)
    assert torch.equal(plain.sequences, target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False))
    assert not torch.equal(plain.sequences, ref)


def _merged_literals(fn) -> str:
    """The source of ``fn`` with adjacent string literals joined (HF splits its messages over lines)."""
    return re.sub(r'"\s*\n\s*(?:f)?"', "", inspect.getsource(fn))


def _hf_logger_output(call) -> list[str]:
    """HF's log records while ``call()`` runs (transformers' loggers do not propagate to the root logger)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    hf_logger = logging.getLogger("transformers.generation.utils")
    handler = Collect(level=logging.WARNING)
    hf_logger.addHandler(handler)
    try:
        call()
    finally:
        hf_logger.removeHandler(handler)
    return records


def test_eos_fallback_pad_equal_to_eos_infers_nothing(monkeypatch, caplog):
    """pad_token_id unset everywhere: HF takes the first EOS id as the pad id, which infers no mask (HF warns and
    decodes the pads as text); specdec gives HF's tokens and logs HF's warnings."""
    target = tiny_model("llama", scale=2.0)
    target.generation_config.pad_token_id = None
    eos = [5, 9]
    ids, _ = left_padded(pad=5)
    hf = {}
    hf_messages = _hf_logger_output(
        lambda: hf.setdefault("ref", target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos))
    )
    ref = hf["ref"]
    assert hf_args.NO_MASK_NO_PAD_WARNING in hf_messages
    source = _merged_literals(GenerationMixin._prepare_special_tokens)
    assert hf_args.NO_MASK_NO_PAD_WARNING in source and hf_args.PAD_IS_EOS_WARNING in source
    monkeypatch.setattr(hf_args, "_warned_once", set())
    with caplog.at_level(logging.WARNING, logger="specdec.hf_args"):
        out = specdec.generate(target, ids, max_new_tokens=MAX_NEW, eos_token_id=eos)
        specdec.generate(target, ids, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert torch.equal(out.sequences, ref)
    messages = [r.getMessage() for r in caplog.records if r.name == "specdec.hf_args"]
    assert messages.count(hf_args.NO_MASK_NO_PAD_WARNING) == 2  # every batched call, as HF's logger.warning
    assert messages.count(hf_args.PAD_IS_EOS_WARNING) == 1  # once, as HF's logger.warning_once
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specdec.hf_args"):
        specdec.generate(target, ids[:1], max_new_tokens=4, eos_token_id=eos)  # one row: HF does not warn
        specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, eos_token_id=eos)
    assert not [r for r in caplog.records if r.name == "specdec.hf_args"]


def test_eos_fallback_pad_from_eos_when_other_eos_in_prompts(target):
    """The target's pad id 0 is an EOS id too: nothing is inferred, even where 0 is the padding."""
    ids, _ = left_padded(pad=0)
    ref = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=[3, 0])
    out = specdec.generate(target, ids, max_new_tokens=MAX_NEW, eos_token_id=[3, 0])
    assert torch.equal(out.sequences, ref)


def test_sampling_with_inferred_mask(target):
    """Seeded sampling: the inferred mask gives the right shapes and the same draws as the explicit mask."""
    ids, mask = left_padded(pad=0)
    drafter, tree = DRAFTERS["dflash-tree"](target)
    kw = dict(drafter=drafter, tree=tree, max_new_tokens=MAX_NEW, do_sample=True, temperature=0.8, top_k=20)
    out = specdec.generate(target, ids, generator=torch.Generator().manual_seed(3), **kw)
    explicit = specdec.generate(target, ids, attention_mask=mask, generator=torch.Generator().manual_seed(3), **kw)
    assert out.sequences.shape == (len(LENGTHS), ids.shape[1] + MAX_NEW)
    assert torch.equal(out.sequences[:, : ids.shape[1]], ids)
    assert torch.equal(out.sequences, explicit.sequences)
    assert [r.new_tokens for r in out.stats.rows] == [MAX_NEW] * len(LENGTHS)


@pytest.mark.parametrize(
    "row, match",
    [
        ([5, 6, 0, 0], "Row 1 of (attention_mask|input_ids) is not left-padded .*padding_side='left'"),  # right
        ([5, 0, 6, 7], "Row 1 of (attention_mask|input_ids) is not left-padded .*padding_side='left'"),  # a pad inside
        ([0, 0, 0, 0], "Row 1 of (attention_mask|input_ids) is all padding"),
    ],
    ids=["right_padded", "pad_inside", "all_padding"],
)
def test_bad_padding_same_error_as_with_explicit_mask(target, row, match):
    ids = torch.tensor([[5, 6, 7, 8], row])
    with pytest.raises(ValueError, match=match):
        specdec.generate(target, ids, attention_mask=(ids != 0).long(), max_new_tokens=4)
    with pytest.raises(ValueError, match=match) as err:
        specdec.generate(target, ids, max_new_tokens=4)
    assert "pad_token_id=0" in str(err.value) and "inferred from pad_token_id" in str(err.value)
    with pytest.raises(ValueError, match=match):
        specdec.SpeculativeModel(target).generate(ids, max_new_tokens=4)


def test_zoo_tokenizer_batch_without_mask_equals_hf(zoo):
    """A tokenizer's left-padded batch, passing only ``input_ids`` (pad 1, EOS 0 in the target's config)."""
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    tok.padding_side = "left"
    ids = tok(["def f(x):", "The capital of France is", "import os\n"], return_tensors="pt", padding=True).input_ids
    assert (ids == tok.pad_token_id).any()
    ref = model.generate(ids, max_new_tokens=10, do_sample=False)
    drafter = specdec.DFlashDrafter.from_pretrained(ZOO_DRAFTER, target=model)
    out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=8, topk=4), max_new_tokens=10)
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("bad", [-3, 128, 10**6])
def test_token_ids_outside_the_embedding_are_refused_before_anything_is_built(target, bad):
    """A prompt id past the embedding (or negative) is named with the fix before the prefill (it would fail inside
    the embedding, on CUDA as a device assert); an id at a padding position is not read; the next call equals HF."""
    rows = target.get_input_embeddings().weight.shape[0]
    ids = torch.tensor([[5, 6, bad, 8]])
    with pytest.raises(ValueError, match=rf"token id {bad}, outside the target's embedding of {rows} rows"):
        specdec.generate(target, ids, max_new_tokens=4)
    padded = torch.tensor([[bad, 6, 7, 8]])  # the bad id sits in the padding
    out = specdec.generate(target, padded, attention_mask=torch.tensor([[0, 1, 1, 1]]), max_new_tokens=4)
    want = target.generate(padded[:, 1:], max_new_tokens=4, do_sample=False)
    assert torch.equal(out.sequences[:, 1:], want)
