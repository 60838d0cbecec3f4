"""``DDTree(budget="auto")`` on CUDA graphs (zoo dense pair, fp32): every option of a span bucket is captured
when the bucket is first met (``Round.prepare``: warm-up runs undone, the capture runs nothing), so a second pass
over different prompts of the same lengths captures nothing (``stats.captures`` counted, not timed), and each
row's tokens equal the target's own greedy ``generate`` of the row alone."""

from __future__ import annotations

import pytest
import torch
from test_batch_cuda import left_pad
from test_generate_cuda import load

import specdec

pytestmark = pytest.mark.gpu


def test_auto_budget_second_pass_captures_nothing_on_cuda(zoo, cuda):
    model, drafter, prompts = load(zoo, "dense", torch.float32, cuda)
    tree = specdec.DDTree(budget="auto", topk=8, sizes=(3, 15, 31))
    lengths = (180, 60, 120)  # + 60 new tokens: the longest row crosses the first span bucket (256 slots)
    first = [p[:, -n:] for p, n in zip(prompts[:3], lengths, strict=True)]
    second = [p[:, -n:] for p, n in zip(prompts[3:6], lengths, strict=True)]
    outs = []
    for rows in (first, second):
        ids, mask = left_pad(rows, pad=0)
        out = specdec.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=60)
        assert out.stats.path == "graph"
        for b, p in enumerate(rows):
            want = model.generate(p, do_sample=False, max_new_tokens=60)[0, p.shape[1] :]
            got = out.sequences[b, ids.shape[1] : ids.shape[1] + want.numel()]
            assert torch.equal(got, want), b
        outs.append(out)
    budgets = [sorted(set(o.stats.budgets)) for o in outs]
    print(f"auto budget on CUDA: captures {[o.stats.captures for o in outs]}, capture_ms "
          f"{[round(o.stats.capture_ms, 1) for o in outs]}, budgets {budgets}")  # fmt: skip
    # every option (the three sizes, plain decoding with the drafter, the detached plain round) at both span
    # buckets, and the prefill
    assert outs[0].stats.captures == 2 * (3 + 2) + 1
    assert outs[1].stats.captures == 0 and outs[1].stats.capture_ms == 0.0
