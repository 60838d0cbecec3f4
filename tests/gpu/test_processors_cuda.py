"""HF's logits processors under trees on CUDA graphs (zoo dense pair, fp32): the round that applies them at every
node is captured (no host copy inside it), and its greedy tokens equal HF's ``generate`` with the same options;
a user ``logits_processor`` runs the round uncaptured, with the same tokens."""

from __future__ import annotations

import pytest
import torch
from test_generate_cuda import load
from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor

import specdec

pytestmark = pytest.mark.gpu

OPTIONS = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, sequence_bias={(11,): -2.0, (12, 13): 3.0},
               bad_words_ids=[[14, 15]], suppress_tokens=[16], forced_eos_token_id=0, min_new_tokens=4)  # fmt: skip


def test_processors_run_captured_and_equal_hf_on_cuda(zoo, cuda):
    model, drafter, prompts = load(zoo, "dense", torch.float32, cuda)
    for ids in prompts[:3]:
        want = model.generate(ids, do_sample=False, max_new_tokens=48, **OPTIONS)
        for tree in (specdec.Chain(k=8), specdec.DDTree(budget=32, topk=8)):
            out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=48, **OPTIONS)
            assert out.stats.path == "graph" and not out.stats.uncaptured
            assert torch.equal(out.sequences, want)


def test_a_user_processor_runs_uncaptured_on_cuda(zoo, cuda):
    model, drafter, prompts = load(zoo, "dense", torch.float32, cuda)
    ids = prompts[0]
    procs = LogitsProcessorList([NoRepeatNGramLogitsProcessor(3)])
    want = model.generate(ids, do_sample=False, max_new_tokens=32, logits_processor=procs)
    out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=16, topk=8), max_new_tokens=32,
                           logits_processor=procs)  # fmt: skip
    assert out.stats.path == "eager" and out.stats.uncaptured
    assert torch.equal(out.sequences, want)
