"""``topk_mask`` on CUDA (the Triton kernel the sampling rounds run as HF's top-k warper): equal to HF's own
``TopKLogitsWarper`` bit for bit on random rows, heavy ties, -inf entries and rows, signed zeros, bf16 scores cast to
fp32, k from 1 to past V and several vocabularies; ``process_logits`` equal to HF's warper list; and the launch
captured in a CUDA graph (no host reads) and replayed with new scores. The fixed rows: HF's warper on the CPU; the
processed logits: HF's warpers on the same device (their softmax and cumulative sums are the device's)."""

from __future__ import annotations

import pytest
import torch
from kernel_harness import capture_without_host_reads, topk_score_rows
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec.kernels.topk_mask import topk_mask
from specdec.types import SamplingParams
from specdec.verify.processing import process_logits

pytestmark = pytest.mark.gpu

VOCABS = (7, 1000, 8192, 32000, 32768)


def hf(scores: torch.Tensor, k: int) -> torch.Tensor:
    return TopKLogitsWarper(top_k=k)(None, scores.clone())


@pytest.mark.parametrize("vocab", VOCABS)
def test_kernel_equals_hfs_warper_on_cuda(cuda, vocab):
    x = topk_score_rows(vocab, 16, vocab)
    for k in sorted({1, 2, min(50, vocab), vocab // 2 or 1, vocab - 1 or 1, vocab, vocab + 5}):
        got, want = topk_mask(x.to(cuda), k).cpu(), hf(x, k)
        assert torch.equal(got, want), k
        assert torch.equal(got.signbit(), want.signbit()), k  # -0.0 stays -0.0
        assert torch.equal(hf(x.to(cuda), k).cpu(), want), k  # HF's warper itself: the same on CUDA


def test_process_logits_equals_hfs_warpers_on_cuda(cuda):
    logits = (torch.randn(2, 24, 8192, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    for kw in (dict(top_k=50), dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.3, top_k=8, min_p=0.05),
               dict(temperature=0.6, top_k=40, top_p=0.95, min_p=0.02)):  # fmt: skip
        procs = LogitsProcessorList()
        if kw.get("temperature", 1.0) != 1.0:
            procs.append(TemperatureLogitsWarper(kw["temperature"]))
        procs.append(TopKLogitsWarper(top_k=kw["top_k"]))
        if "top_p" in kw:
            procs.append(TopPLogitsWarper(top_p=kw["top_p"]))
        if "min_p" in kw:
            procs.append(MinPLogitsWarper(min_p=kw["min_p"]))
        want = procs(None, logits.to(cuda).float().reshape(-1, 8192)).view(2, 24, 8192)  # HF on CUDA
        got = process_logits(logits.to(cuda), SamplingParams(do_sample=True, **kw))
        assert torch.equal(got, want), kw


def test_captured_and_replayed_with_new_scores(cuda):
    static = topk_score_rows(8192, 16, 0).to(cuda)
    graph, out = capture_without_host_reads(lambda: topk_mask(static, 50))
    for seed in (1, 2, 3):
        x = topk_score_rows(8192, 16, seed)
        static.copy_(x)
        graph.replay()
        assert torch.equal(out.cpu(), hf(x, 50)), seed
