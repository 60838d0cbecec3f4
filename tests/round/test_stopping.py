"""HF's stopping options (``stopping_criteria``, ``stop_strings``, ``max_time``) stop exactly where HF stops.

The drafter is an exact copy of the target (``ModelDrafter``), so every round accepts its whole path and a stop
point chosen from a free run falls strictly inside a round's accepted tokens (checked on the run's chunks, as
``tests/unit/test_eos.py`` does for EOS): the round must be cut right after that token. Expected outputs come from
HF's own ``generate(do_sample=False)`` with the same options.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from models import tiny_model
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

import specdec

TREES = {"chain": specdec.Chain(k=4), "tree": specdec.DDTree(budget=8, topk=4)}
FREE = 24


class StopOnToken(StoppingCriteria):
    """Stops a row whose last token is ``token`` (HF's protocol: a bool tensor ``[B]``)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class Chunks:
    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def put(self, value):
        self.chunks.append(value.view(-1).tolist())

    def end(self):
        pass


def inside_positions(chunks: list[list[int]]) -> list[int]:
    """Generated positions j whose token first occurs at j and that a round accepted with more tokens after it."""
    tokens = [t for chunk in chunks for t in chunk]
    first: dict[int, int] = {}
    for j, t in enumerate(tokens):
        first.setdefault(t, j)
    found, start = [], len(chunks[0])
    for chunk in chunks[1:-1]:
        found += [start + i for i, t in enumerate(chunk[:-1]) if first[t] == start + i]
        start += len(chunk)
    return found


_TINY: list = []


def tiny():
    if not _TINY:
        target = tiny_model("qwen3", scale=2.0)
        ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(3))
        _TINY.append((target, ids, specdec.ModelDrafter(copy.deepcopy(target))))
    return _TINY[0]


def free_chunks(target, ids, drafter, tree, **kwargs) -> list[list[int]]:
    streamer = Chunks()
    specdec.generate(target, ids, drafter=drafter, tree=TREES[tree], max_new_tokens=FREE, eos_token_id=[],
                     streamer=streamer, **kwargs)  # fmt: skip
    return streamer.chunks[1:]


@pytest.mark.parametrize("tree", list(TREES))
def test_stopping_criteria_cuts_inside_an_accepted_run_like_hf(tree):
    target, ids, drafter = tiny()
    chunks = free_chunks(target, ids, drafter, tree)
    tokens = [t for chunk in chunks for t in chunk]
    where = inside_positions(chunks)
    assert where, f"no accepted run with tokens after a first occurrence: {chunks}"
    for j in where[:3]:
        criteria = StoppingCriteriaList([StopOnToken(tokens[j])])
        ref = target.generate(ids, do_sample=False, max_new_tokens=FREE, eos_token_id=[],
                              stopping_criteria=criteria, pad_token_id=0)  # fmt: skip
        out = specdec.generate(target, ids, drafter=drafter, tree=TREES[tree], max_new_tokens=FREE, eos_token_id=[],
                               stopping_criteria=criteria)  # fmt: skip
        assert ref.shape[1] == ids.shape[1] + j + 1  # HF stops right after position j
        assert torch.equal(out.sequences, ref), (j, out.sequences, ref)


def test_stopping_criteria_batch_rows_like_hf():
    target, ids, drafter = tiny()
    other = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    batch = torch.cat([ids, other])
    chunks = free_chunks(target, ids, drafter, "chain")
    tokens = [t for chunk in chunks for t in chunk]
    j = inside_positions(chunks)[0]
    criteria = StoppingCriteriaList([StopOnToken(tokens[j])])
    ref = target.generate(batch, do_sample=False, max_new_tokens=FREE, eos_token_id=5, pad_token_id=5,
                          stopping_criteria=criteria)  # fmt: skip
    out = specdec.generate(target, batch, drafter=drafter, tree=TREES["chain"], max_new_tokens=FREE, eos_token_id=5,
                           pad_token_id=5, stopping_criteria=criteria)  # fmt: skip
    assert torch.equal(out.sequences, ref)


def test_stopping_criteria_on_the_first_token_and_plain_decoding():
    target, ids, drafter = tiny()
    first = target.generate(ids, do_sample=False, max_new_tokens=1)[0, -1].item()
    criteria = StoppingCriteriaList([StopOnToken(first)])
    for d in (drafter, None):
        out = specdec.generate(target, ids, drafter=d, max_new_tokens=FREE, stopping_criteria=criteria)
        assert out.sequences.shape[1] == ids.shape[1] + 1


def test_max_time_zero_stops_after_the_first_token_like_hf():
    target, ids, drafter = tiny()
    ref = target.generate(ids, do_sample=False, max_new_tokens=FREE, max_time=0.0)
    out = specdec.generate(target, ids, drafter=drafter, max_new_tokens=FREE, max_time=0.0)
    assert torch.equal(out.sequences, ref)
    assert ref.shape[1] == ids.shape[1] + 1
    long = specdec.generate(target, ids, drafter=drafter, max_new_tokens=FREE, max_time=600.0, eos_token_id=[])
    assert long.sequences.shape[1] == ids.shape[1] + FREE


def test_stopping_errors_name_the_fix():
    target, ids, drafter = tiny()
    with pytest.raises(ValueError, match="tokenizer=tokenizer"):
        specdec.generate(target, ids, max_new_tokens=4, stop_strings=["x"])
    with pytest.raises(TypeError, match="StoppingCriteriaList"):
        specdec.generate(target, ids, max_new_tokens=4, stopping_criteria=StopOnToken(3))
    with pytest.raises(ValueError, match="max_time"):
        specdec.generate(target, ids, max_new_tokens=4, max_time=-1)


_ZOO: list = []


@pytest.mark.parametrize("tree", list(TREES))
def test_stop_strings_cut_inside_an_accepted_run_like_hf(zoo, tree):
    if not _ZOO:
        target = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
        row = json.loads((zoo / "prompts_dev.jsonl").read_text().splitlines()[1])
        ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -96:]
        _ZOO.append((target, tok, ids, specdec.ModelDrafter(copy.deepcopy(target))))
    target, tok, ids, drafter = _ZOO[0]
    chunks = free_chunks(target, ids, drafter, tree)
    tokens = [t for chunk in chunks for t in chunk]
    text = tok.decode(tokens)
    tried = 0
    for j in inside_positions(chunks):
        # a string that spans tokens j-1 and j and ends inside token j's text: HF matches it at token j
        piece = tok.decode(tokens[j - 1 : j + 1])
        if len(piece) < 3 or text.find(piece[1:]) < len(tok.decode(tokens[: j - 1])):
            continue
        stop = piece[1:]
        # the first case passes the stop string as an argument, the second through a generation_config
        given = {"stop_strings": stop} if tried == 0 else {"generation_config": GenerationConfig(stop_strings=[stop])}
        ref = target.generate(ids, do_sample=False, max_new_tokens=FREE, eos_token_id=[], tokenizer=tok, pad_token_id=0,
                              **given)  # fmt: skip
        out = specdec.generate(target, ids, drafter=drafter, tree=TREES[tree], max_new_tokens=FREE, eos_token_id=[],
                               tokenizer=tok, **given)  # fmt: skip
        assert ref.shape[1] == ids.shape[1] + j + 1, (stop, j)
        assert torch.equal(out.sequences, ref), (stop, out.sequences, ref)
        tried += 1
        if tried == 2:
            break
    assert tried, f"no stop string inside an accepted run: {chunks}"
