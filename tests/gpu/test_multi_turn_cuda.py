"""Multi-turn reuse and the EAGLE-3 round on CUDA graphs (zoo dense target, fp32): a conversation's later turns
prefill only their new tokens and equal HF's ``generate`` of the whole prompt; a random EAGLE-3 head's captured
round keeps the target's greedy tokens."""

from __future__ import annotations

import pytest
import torch
from test_generate_cuda import load

import specdec

pytestmark = pytest.mark.gpu


def test_a_conversation_reuses_its_prefix_on_cuda(zoo, cuda):
    model, drafter, prompts = load(zoo, "dense", torch.float32, cuda)
    ids = torch.cat([prompts[0], prompts[1]], 1)  # longer than a captured prefill: later turns reuse the storage
    assert ids.shape[1] > 512
    for turn in range(3):
        out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=32, topk=8), max_new_tokens=48)
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48)
        assert out.stats.path == "graph" and torch.equal(out.sequences, want), turn
        assert (out.stats.reused_tokens > 0) == (turn > 0), turn
        ids = torch.cat([out.sequences, prompts[turn + 2][:, -32:]], 1)


def test_eagle3_round_is_captured_and_exact_on_cuda(zoo, cuda):
    model, _, prompts = load(zoo, "dense", torch.float32, cuda)
    head = specdec.Eagle3Drafter.for_target(model, seed=0)
    for tree in (specdec.Chain(k=4), specdec.DDTree(budget=16, topk=4)):
        ids = prompts[1]
        out = specdec.generate(model, ids, drafter=head, tree=tree, max_new_tokens=32)
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32)
        assert out.stats.path == "graph" and torch.equal(out.sequences, want)
