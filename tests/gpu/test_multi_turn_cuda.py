"""Multi-turn reuse and the EAGLE-3 round on CUDA graphs (zoo dense target, fp32): a conversation's later turns
prefill only their new tokens and equal HF's ``generate`` of the whole prompt; a random EAGLE-3 head's captured
round keeps the target's greedy tokens, and so does the head trained for the zoo hybrid target on that target, with
drafts accepted."""

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
    trees = (specdec.Chain(k=4), specdec.DDTree(budget=16, topk=4),
             specdec.DynamicTree(depth=5, topk=4, total_tokens=16))  # fmt: skip
    for tree in trees:
        ids = prompts[1]
        out = specdec.generate(model, ids, drafter=head, tree=tree, max_new_tokens=32)
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32)
        assert out.stats.path == "graph" and torch.equal(out.sequences, want)


def test_hybrid_eagle3_head_is_captured_and_exact_on_cuda(zoo, cuda):
    """The shipped head of the zoo hybrid target (``assets/drafters/zoo-hybrid-eagle3``) on that target, fp32,
    captured: HF's greedy tokens under ``Chain``, ``DDTree`` and ``DynamicTree``, with drafts accepted."""
    from specdec.loading import asset_path

    model, _, prompts = load(zoo, "hybrid", torch.float32, cuda)
    head = specdec.Eagle3Drafter.from_pretrained(asset_path("drafters/zoo-hybrid-eagle3"), target=model)
    trees = (specdec.Chain(k=4), specdec.DDTree(budget=15),
             specdec.DynamicTree(depth=5, topk=4, total_tokens=16))  # fmt: skip
    ids = prompts[1]
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48)
    for tree in trees:
        out = specdec.generate(model, ids, drafter=head, tree=tree, max_new_tokens=48)
        assert out.stats.path == "graph" and torch.equal(out.sequences, want), tree
        assert max(out.stats.accept_lengths) > 1, tree


def test_eagle3_reused_state_drafts_as_a_fresh_one_on_cuda(zoo, cuda):
    """The head's state is reused by the next call on the same engine (``refresh`` runs before it) and the captured
    round reads its tensors by address: a tensor replaced in ``refresh`` left the graph reading freed memory, so
    later calls drafted wrong ids (fewer tokens accepted, then an out-of-bounds ``index_copy_``). The same prompt
    decoded again must accept exactly what the first call accepted, with allocations in between."""
    from specdec.loading import asset_path

    model, _, prompts = load(zoo, "dense", torch.float32, cuda)
    head = specdec.Eagle3Drafter.from_pretrained(asset_path("drafters/zoo-dense-eagle3"), target=model)
    ids = prompts[2]
    first = specdec.generate(model, ids, drafter=head, tree=specdec.Chain(k=4), max_new_tokens=48, reuse_prefix=False)
    assert first.stats.path == "graph" and max(first.stats.accept_lengths) > 1, "the shipped head drafts nothing"
    for other in prompts[3:6]:  # other calls, and memory freed and allocated between them
        specdec.generate(model, other, drafter=head, tree=specdec.Chain(k=4), max_new_tokens=16, reuse_prefix=False)
        junk = [torch.randint(0, 2**30, (1 << 16,), device=cuda) for _ in range(8)]
        del junk
    again = specdec.generate(model, ids, drafter=head, tree=specdec.Chain(k=4), max_new_tokens=48, reuse_prefix=False)
    assert torch.equal(again.sequences, first.sequences)
    assert again.stats.accept_lengths == first.stats.accept_lengths
