"""The MTP drafter on CUDA, its round replayed from a CUDA graph: fp32 greedy output token-identical to HF's
``generate`` on tiny random Qwen3-Next / Qwen3.5 targets (a random head), batch 1 and a left-padded batch of 2; the
proposals inside the captured round equal those of the eager round."""

from __future__ import annotations

import pytest
import torch
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec.drafters.mtp import MTPDrafter

pytestmark = pytest.mark.gpu

TREES = {"chain": specdec.Chain(k=3), "ddtree": specdec.DDTree(budget=8, topk=3)}


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_mtp_cuda_graph_fp32_matches_hf(cuda, family, tree):
    target = tiny_hybrid(family).to(cuda)
    drafter = MTPDrafter.random(target, seed=3, std=0.3)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 12), generator=gen).to(cuda)
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    for rows in (ids[:1], ids):
        m = mask[: rows.shape[0]]
        ref = target.generate(rows, attention_mask=m, max_new_tokens=24, do_sample=False, pad_token_id=0)
        out = specdec.generate(target, rows, attention_mask=m, drafter=drafter, tree=TREES[tree], max_new_tokens=24)
        # HF's fp32 expert layers (Qwen3-Next) read their group sizes on the host: those rounds run uncaptured
        assert out.stats.path == "graph" and (out.stats.capture_fallbacks == 0 or family == "qwen3_next")
        assert torch.equal(out.sequences, ref), (family, tree, rows.shape[0])
        eager = specdec.generate(target, rows, attention_mask=m, drafter=drafter, tree=TREES[tree], max_new_tokens=24,
                                 cuda_graphs=False)  # fmt: skip
        assert torch.equal(eager.sequences, ref)
        assert out.stats.accept_hist == eager.stats.accept_hist  # the same drafts accepted
