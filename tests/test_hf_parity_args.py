"""Generation-argument edge cases where specdec does what HF's ``model.generate`` does: an empty ``bad_words_ids`` or
``stop_strings`` (HF refuses both before decoding, and so does specdec, naming the argument), ``pad_token_id`` as a
tensor (one integer id of shape () or (1,) is taken as HF takes it; the tensors HF fails on are refused) and
``pad_token_id=None`` passed explicitly (it overrides the target's pad id, so HF's EOS fallback applies and the mask
is no longer inferred from the pad tokens). Every expected value comes from HF itself. CPU, fp32, tiny random
targets, a few tokens.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from models import tiny_model
from test_cli import _main as cli_main
from transformers import AutoTokenizer, GenerationConfig

import specdec
from specdec.hf_args import NO_MASK_NO_PAD_WARNING

NEW = 6
PAD = 5  # the pad id passed as a tensor: not the target's own (0), so the output shows which one was used


@pytest.fixture(scope="module")
def target():
    """``generation_config.pad_token_id = 0`` (from the model config), no EOS id."""
    return tiny_model("llama", scale=2.0)


@pytest.fixture(scope="module")
def tokenizer(zoo):
    return AutoTokenizer.from_pretrained(zoo / "tokenizer")


def prompt(n: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(6, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def padded_batch(pad: int) -> torch.Tensor:
    """Two rows, the first left-padded with two ``pad`` tokens, passed without ``attention_mask``."""
    ids = torch.randint(6, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    ids[0, :2] = pad
    return ids


def early_eos(target, ids: torch.Tensor, pad: int) -> int:
    """An EOS id that ends row 1 at its second new token while row 0 goes on (HF then fills row 1 with the pad id)."""
    ref = target.generate(
        ids, attention_mask=(ids != pad).long(), do_sample=False, max_new_tokens=NEW, pad_token_id=pad
    )
    eos = int(ref[1, ids.shape[1] + 1])
    assert eos != pad and eos not in ref[0, ids.shape[1] :].tolist() and eos not in ref[1, ids.shape[1] :][:1].tolist()
    return eos


def chain(target, ids, **kwargs) -> torch.Tensor:
    drafter, tree = specdec.NGramDrafter(), specdec.Chain(3)
    return specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, **kwargs).sequences


def wrapped(target, ids, **kwargs) -> torch.Tensor:
    return specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.Chain(3)).generate(
        ids, max_new_tokens=NEW, **kwargs
    )


CALLS = [pytest.param(chain, id="generate"), pytest.param(wrapped, id="SpeculativeModel")]


def passed(name: str, value, source: str) -> dict:
    """``name=value`` as a call argument, or inside a ``generation_config``."""
    return {name: value} if source == "argument" else {"generation_config": GenerationConfig(**{name: value})}


class _Embeddings:
    """Counts the target's forward passes (every one reads the input embedding)."""

    def __init__(self, target):
        self.calls = 0
        self.handle = target.get_input_embeddings().register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.calls += 1


def refused_before_the_target_runs(target, call, ids, given: dict, match: str) -> None:
    """``call(target, ids, **given)`` raises a ``ValueError`` matching ``match`` before the target runs a forward."""
    forwards = _Embeddings(target)
    try:
        with pytest.raises(ValueError, match=match):
            call(target, ids, **given)
        assert forwards.calls == 0, "the refusal came after the target ran"
    finally:
        forwards.handle.remove()


# --- bad_words_ids=[] ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [[], ()], ids=["list", "tuple"])
@pytest.mark.parametrize("source", ["argument", "generation_config"])
@pytest.mark.parametrize("call", CALLS)
def test_an_empty_bad_words_ids_is_refused_before_decoding_as_hf_refuses_it(target, empty, source, call):
    ids = prompt()
    given = passed("bad_words_ids", empty, source)
    with pytest.raises(ValueError):
        target.generate(ids, do_sample=False, max_new_tokens=NEW, **given)
    refused_before_the_target_runs(target, call, ids, given, r"bad_words_ids=.*leave bad_words_ids out or pass None")
    out = call(target, ids, bad_words_ids=None)  # None is off, as in HF
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=NEW, bad_words_ids=None))


# --- stop_strings=[] ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [[], ()], ids=["list", "tuple"])
@pytest.mark.parametrize("with_tokenizer", [True, False], ids=["tokenizer", "no-tokenizer"])
@pytest.mark.parametrize("source", ["argument", "generation_config"])
@pytest.mark.parametrize("call", CALLS)
def test_empty_stop_strings_are_refused_before_decoding_as_hf_refuses_them(
    target, tokenizer, empty, with_tokenizer, source, call
):
    ids = prompt()
    given = passed("stop_strings", empty, source)
    if with_tokenizer:
        given["tokenizer"] = tokenizer
    with pytest.raises(ValueError):
        target.generate(ids, do_sample=False, max_new_tokens=NEW, **given)
    refused_before_the_target_runs(
        target, call, ids, given, r"stop_strings=.* holds no string.*leave stop_strings out or pass None"
    )


@pytest.mark.parametrize("strings", ["", [""], ["", "zz"]], ids=["empty", "list-of-empty", "empty-and-other"])
@pytest.mark.parametrize("call", CALLS)
def test_an_empty_stop_string_stops_where_hf_stops(target, tokenizer, strings, call):
    """An empty string ends every text: HF accepts it and stops at the first new token; so does specdec."""
    ids = prompt()
    want = target.generate(ids, do_sample=False, max_new_tokens=NEW, stop_strings=strings, tokenizer=tokenizer)
    assert want.shape[1] < ids.shape[1] + NEW  # HF stopped early: the case means something
    assert torch.equal(call(target, ids, stop_strings=strings, tokenizer=tokenizer), want)


# --- the command line: sampling.bad_words_ids=[] and sampling.stop_strings=[] --------------------------------------


def _error_line(args: list[str], tmp_path, monkeypatch, capsys) -> str:
    """``python -m specdec ARGS`` in this process: its one ``error:`` line (status 2, no traceback)."""
    code, err = cli_main(args, tmp_path, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    return line


@pytest.mark.parametrize(
    ("key", "fix"),
    [
        ("bad_words_ids", "leave bad_words_ids out or pass None"),
        ("stop_strings", "leave stop_strings out or pass None"),
    ],
)
def test_the_command_line_refuses_an_empty_list_as_hf_does(target, tokenizer, key, fix, tmp_path, monkeypatch, capsys):
    with pytest.raises(ValueError):
        target.generate(prompt(), do_sample=False, max_new_tokens=NEW, tokenizer=tokenizer, **{key: []})
    line = _error_line([f"sampling.{key}=[]"], tmp_path, monkeypatch, capsys)
    assert f"sampling.{key}=[]" in line and fix in line, line


# --- pad_token_id as a tensor -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pad",
    [torch.tensor(PAD), torch.tensor([PAD]), torch.tensor(PAD, dtype=torch.int32), np.array([PAD]), np.array(PAD)],
    ids=["0-d", "1-elem", "int32", "numpy-1-elem", "numpy-0-d"],
)
@pytest.mark.parametrize("call", CALLS)
def test_a_pad_token_id_tensor_of_one_id_is_taken_as_hf_takes_it(target, pad, call):
    """The pad id infers the mask of the unmasked batch and fills the row that ended early: both need its value."""
    ids = padded_batch(PAD)
    eos = early_eos(target, ids, PAD)
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad)
    assert (ref[1, ids.shape[1] + 2 :] == PAD).all()  # the fill is the tensor's id
    assert torch.equal(call(target, ids, eos_token_id=eos, pad_token_id=pad), ref)
    config = GenerationConfig(pad_token_id=pad, eos_token_id=eos)
    assert torch.equal(call(target, ids, generation_config=config), ref)


@pytest.mark.parametrize(
    ("pad", "error", "match"),
    [
        (torch.tensor([PAD, 1]), ValueError, r"pad_token_id is a tensor of shape \(2,\): it must hold one token id"),
        (torch.tensor([[PAD]]), ValueError, r"pad_token_id is a tensor of shape \(1, 1\): it must hold one token id"),
        (torch.tensor([], dtype=torch.long), ValueError, r"pad_token_id is a tensor of shape \(0,\)"),
        (torch.tensor(float(PAD)), TypeError, r"pad_token_id is a tensor of dtype torch.float32: .* an integer"),
        (torch.tensor(True), TypeError, r"pad_token_id is a tensor of dtype torch.bool"),
    ],
    ids=["two-ids", "2-d", "empty", "float", "bool"],
)
@pytest.mark.parametrize("call", CALLS)
def test_a_pad_token_id_tensor_hf_fails_on_is_refused_by_name(target, pad, error, match, call):
    ids = padded_batch(PAD)
    eos = early_eos(target, ids, PAD)
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=pad)
    with pytest.raises(error, match=match):
        call(target, ids, eos_token_id=eos, pad_token_id=pad)


# --- pad_token_id=None passed explicitly ---------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self, name: str):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.logger = logging.getLogger(name)
        self.logger.addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())

    def close(self):
        self.logger.removeHandler(self)
        super().close()


def _with_warnings(fn):
    """``fn()``'s result and whether HF's "attention mask and the pad token id were not set" warning was logged (HF's
    logger or specdec's)."""
    hf, ours = _Records("transformers"), _Records("specdec.hf_args")
    try:
        out = fn()
    finally:
        hf.close(), ours.close()
    return out, any(NO_MASK_NO_PAD_WARNING in m for m in hf.messages + ours.messages)


@pytest.mark.parametrize("eos", [None, "early"])
@pytest.mark.parametrize("call", CALLS)
def test_an_explicit_pad_token_id_none_overrides_the_targets_pad_id_as_in_hf(target, eos, call):
    """The target's pad id is 0 and the batch is left-padded with 0 (no ``attention_mask``). Unset, 0 infers the mask;
    passed as None, HF has no pad id: it falls back to the first EOS id (with its warning, a pad id equal to EOS infers
    no mask) or, without EOS, to no mask at all, so the zeros are read as text, and a finished row is filled with the
    EOS id."""
    ids = padded_batch(0)
    assert target.generation_config.pad_token_id == 0
    stop = {} if eos is None else {"eos_token_id": early_eos(target, ids, 0)}
    ref_unset = target.generate(ids, do_sample=False, max_new_tokens=NEW, **stop)
    ref_none, hf_warned = _with_warnings(
        lambda: target.generate(ids, do_sample=False, max_new_tokens=NEW, pad_token_id=None, **stop)
    )
    assert not torch.equal(ref_none, ref_unset)  # the case tells the two apart
    out_none, warned = _with_warnings(lambda: call(target, ids, pad_token_id=None, **stop))
    assert torch.equal(out_none, ref_none)
    assert warned == hf_warned == (eos is not None)
    assert torch.equal(call(target, ids, **stop), ref_unset)
    # a generation_config's pad_token_id=None is unset (the target's 0 applies), in HF and in specdec
    config = GenerationConfig(pad_token_id=None, **stop)
    assert torch.equal(target.generate(ids, do_sample=False, max_new_tokens=NEW, generation_config=config), ref_unset)
    assert torch.equal(call(target, ids, generation_config=config), ref_unset)
