"""``topk_mask`` and ``processing.TopKThreshold``: HF's top-k warper with the ``k``-th largest value found by one
Triton launch. Every expected value comes from HF's own ``TopKLogitsWarper`` (or HF's warper list), never from
specdec: the reference (the CPU path) and, through Triton's interpreter, the kernel under each search plan, bit for
bit (signs of zeros included), on random rows, heavy ties straddling the ``k``-th position, -inf entries, rows of
-inf, fewer finite entries than ``k``, signed zeros, extreme and subnormal values, neighbouring floats (keys one
apart), bf16 scores cast to fp32, ``k`` from 1 to past ``V``, vocabularies of 7 to 32768 entries, strided, broadcast
and 3-D scores; ``process_logits`` against HF's warper list with the kernel in it; the warper's arguments, checks and
attributes as HF's; the dispatch. The kernel on CUDA and in a captured graph: ``tests/gpu/test_topk_mask_cuda.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import interpreted_outputs, poison_empty, topk_score_rows
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec.kernels.topk_mask import MAX_VOCAB, fits_triton, topk_mask, topk_mask_reference
from specdec.types import SamplingParams
from specdec.verify.processing import TopKThreshold, process_logits

# the kernel's search plans, each on every case (the default picks one by the row's length)
PLANS = {"interpolate": dict(interpolate=True), "bisect": dict(interpolate=False)}


def _ks(vocab: int) -> list[int]:
    return sorted({1, 2, min(50, vocab), max(vocab // 2, 1), max(vocab - 1, 1), vocab, vocab + 5})


def cases() -> list[dict]:
    out = []
    for vocab in (7, 64, 1000):
        x = topk_score_rows(vocab, 10, vocab)
        out += [dict(name=f"V{vocab}-k{k}", scores=x, k=k) for k in _ks(vocab)]
    gen = torch.Generator().manual_seed(3)
    wide = topk_score_rows(8192, 10, 8192)
    out += [dict(name=f"V8192-k{k}", scores=wide, k=k) for k in (1, 50, 4096, 8191)]
    big = torch.randn(2, 32768, generator=gen)
    big[1] = torch.randint(0, 6, (32768,), generator=gen).float()
    out += [dict(name=f"V32768-k{k}", scores=big, k=k) for k in (50, 32767)]
    bf16 = (torch.randn(8, 1000, generator=gen) * 3).bfloat16().float()  # as process_logits casts bf16 logits
    out += [dict(name="bf16-k50", scores=bf16, k=50), dict(name="bf16-k300", scores=bf16, k=300)]
    steps = torch.arange(5, dtype=torch.int32)  # neighbouring floats: keys one apart, ties on each
    near = torch.cat([(torch.tensor([1.5, -1.5]).view(torch.int32)[:, None] + steps).view(torch.float32),
                      torch.tensor([[0.0, -0.0, 1e-45, -1e-45, 2e-45]])])  # fmt: skip
    adjacent = near[torch.arange(3)[:, None], torch.randint(0, 5, (3, 1000), generator=gen)]
    out += [dict(name=f"adjacent-k{k}", scores=adjacent, k=k) for k in (1, 100, 200, 333, 500, 700, 999)]
    out.append(dict(name="3d", scores=torch.randn(2, 3, 300, generator=gen), k=10))
    out.append(dict(name="strided", scores=torch.randn(4, 600, generator=gen)[:, 50:550], k=20))
    out.append(dict(name="broadcast", scores=torch.randn(1, 900, generator=gen).expand(5, -1), k=33))
    return out


SAMPLINGS = [
    dict(top_k=50),
    dict(temperature=0.7, top_k=12, top_p=0.9),
    dict(temperature=1.3, top_k=5, min_p=0.05),
    dict(temperature=0.6, top_k=40, top_p=0.95, min_p=0.02),
    dict(top_k=1),
    dict(temperature=0.9, top_k=2000, top_p=0.8),  # top_k past the vocabulary
]


def sampling_logits() -> torch.Tensor:
    logits = (torch.randn(2, 6, 1000, generator=torch.Generator().manual_seed(7)) * 3).bfloat16()
    logits[0, 1, :60] = logits[0, 1, 0]  # ties at the top-k cut
    return logits


def hf_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    return TopKLogitsWarper(top_k=k)(None, scores)


def hf_processed(logits: torch.Tensor, kw: dict) -> torch.Tensor:
    """HF's warpers for ``kw`` in ``generate``'s order, on fp32 rows."""
    procs = LogitsProcessorList()
    if kw.get("temperature", 1.0) != 1.0:
        procs.append(TemperatureLogitsWarper(kw["temperature"]))
    procs.append(TopKLogitsWarper(top_k=kw["top_k"], min_tokens_to_keep=1))
    if "top_p" in kw:
        procs.append(TopPLogitsWarper(top_p=kw["top_p"], min_tokens_to_keep=1))
    if "min_p" in kw:
        procs.append(MinPLogitsWarper(min_p=kw["min_p"], min_tokens_to_keep=1))
    scores = logits.float()
    return procs(None, scores.reshape(-1, scores.shape[-1])).view(scores.shape)


def check(case: dict, got: torch.Tensor) -> None:
    want = hf_topk(case["scores"], case["k"])
    assert got.shape == want.shape and got.dtype == want.dtype, case["name"]
    assert torch.equal(got, want), case["name"]  # -inf where HF's is, the kept values as they are
    assert torch.equal(got.signbit(), want.signbit()), case["name"]  # -0.0 stays -0.0


def test_reference_equals_hfs_warper():
    for case in cases():
        before = case["scores"].clone()
        got = topk_mask(case["scores"], case["k"])  # CPU: the reference (or a copy for k >= V)
        check(case, got)
        assert torch.equal(case["scores"], before) and got.data_ptr() != case["scores"].data_ptr()
        if case["k"] <= case["scores"].shape[-1]:
            check(case, topk_mask_reference(case["scores"], case["k"]))


def test_the_warper_is_hfs():
    x = topk_score_rows(40, 10, 1)
    for top_k, keep in ((1, 1), (5, 1), (5, 9), (3, 60), (40, 1), (100, 1)):
        ours, theirs = TopKThreshold(top_k, min_tokens_to_keep=keep), TopKLogitsWarper(top_k, min_tokens_to_keep=keep)
        assert isinstance(ours, TopKLogitsWarper) and vars(ours) == vars(theirs)
        assert torch.equal(ours(None, x), theirs(None, x)), (top_k, keep)
    assert torch.equal(TopKThreshold(3, filter_value=-5.0)(None, x), TopKLogitsWarper(3, filter_value=-5.0)(None, x))
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="strictly positive integer"):
            TopKLogitsWarper(bad)
        with pytest.raises(ValueError, match="strictly positive integer"):
            TopKThreshold(bad)


def test_dispatch_and_refusals():
    x = torch.randn(3, 100)
    assert fits_triton(x) and fits_triton(x[:, :50]) and fits_triton(torch.randn(2, MAX_VOCAB))
    assert not fits_triton(x.bfloat16()) and not fits_triton(torch.randn(2, MAX_VOCAB + 1))
    assert not fits_triton(torch.randn(100, 3).t())  # the last dim strided
    assert not fits_triton(torch.randn(3, 100, requires_grad=True))
    with pytest.raises(ValueError, match="impl='triton' takes fp32"):
        topk_mask(x.bfloat16(), 5, impl="triton")
    with pytest.raises(ValueError, match="needs tensors on a GPU"):  # the CPU without the interpreter
        topk_mask(x, 5, impl="triton")
    for bad in (0, -2, 1.0, True):
        with pytest.raises(ValueError, match="pass a Python int >= 1"):
            topk_mask(x, bad)
    half = torch.randn(3, 100).bfloat16()  # other dtypes: HF's formula in that dtype
    assert torch.equal(topk_mask(half, 7), hf_topk(half, 7))
    assert topk_mask(torch.randn(0, 100), 5).shape == (0, 100)


def masked_by_keys(x: torch.Tensor, k: int, *, fold: bool = True, keep_ties: bool = True, rank: int = 0):
    """The kernel's selection as tensor ops: fp32 bits -> ordered integer keys (-0.0 folded onto +0.0 unless
    ``fold=False``), the ``k + rank``-th largest key as the threshold, keys below it (``keep_ties=False``: at or
    below it) set to -inf. The right settings are HF's warper; each other one is a bug the kernel could have."""
    bits = x.view(torch.int32).long()
    keys = torch.where(bits < 0, -(bits & 0x7FFFFFFF) - (0 if fold else 1), bits)
    thr = keys.topk(k + rank, dim=-1).values[..., -1:]
    return x.masked_fill(keys < thr if keep_ties else keys <= thr, float("-inf"))


def test_planted_bugs_fail_the_check():
    """The check tells the kernel's selection from the bugs it could have: the threshold one rank too low, ties
    with the threshold removed (``<=``), -0.0 ranked below +0.0."""
    for case in cases():
        if case["k"] < case["scores"].shape[-1]:
            check(case, masked_by_keys(case["scores"], case["k"]))
    by_name = {c["name"]: c for c in cases()}
    bugs = [(dict(rank=1), "V1000-k50"), (dict(keep_ties=False), "V1000-k50"), (dict(fold=False), "V1000-k50"),
            (dict(fold=False), "V7-k2"), (dict(rank=1), "V8192-k4096")]  # fmt: skip
    for bug, name in bugs:
        case = by_name[name]
        with pytest.raises(AssertionError):
            check(case, masked_by_keys(case["scores"], case["k"], **bug))


def _plan_cases(cases: list[dict]) -> list[dict]:
    """The cases that launch the kernel: ``k < V`` (``k >= V`` is a copy)."""
    return [c for c in cases if c["k"] < c["scores"].shape[-1]]


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    data = {"cases": cases(), "logits": sampling_logits()}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("topk_mask"), data)


@pytest.mark.interpreter
def test_interpreted_equals_hfs_warper(interpreted):
    launched = _plan_cases(interpreted["cases"])
    for name in PLANS:
        for case, got in zip(launched, interpreted["by_plan"][name], strict=True):
            check({**case, "name": f"{case['name']}-{name}"}, got)
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):  # impl="auto"
        check(case, got)
    assert interpreted["kernel_calls"] == len(launched)  # none for k >= V


@pytest.mark.interpreter
def test_interpreted_process_logits_equals_hfs_warpers(interpreted):
    logits = interpreted["logits"]
    for kw, got in zip(SAMPLINGS, interpreted["processed"], strict=True):
        assert torch.equal(got, hf_processed(logits, kw)), kw
    assert interpreted["process_calls"] == sum(kw["top_k"] < logits.shape[-1] for kw in SAMPLINGS)


def _run_interpreted(folder: Path) -> None:
    import specdec.kernels.topk_mask.triton as kernel

    data = torch.load(folder / "cases.pt")
    poison_empty()
    calls, launch = [], kernel.topk_mask_triton
    kernel.topk_mask_triton = lambda *a, **kw: (calls.append(1), launch(*a, **kw))[1]
    out = {"by_plan": {name: [launch(c["scores"], c["k"], **plan) for c in _plan_cases(data["cases"])]
                       for name, plan in PLANS.items()}}  # fmt: skip
    out["outputs"] = [topk_mask(c["scores"], c["k"]) for c in data["cases"]]  # auto: Triton in the interpreter
    out["kernel_calls"] = len(calls)
    calls.clear()
    out["processed"] = [process_logits(data["logits"], SamplingParams(do_sample=True, **kw)) for kw in SAMPLINGS]
    out["process_calls"] = len(calls)
    torch.save(out, folder / "outputs.pt")


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
