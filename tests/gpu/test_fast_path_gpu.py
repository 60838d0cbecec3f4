"""Captured rounds on CUDA (``stats.path == "graph"``): equal HF greedy in fp32 and the eager path in bf16 (share
reported).

Sized for ``make test-gpu`` (the whole GPU suite within 8 minutes on one H200): 4 prompts per tree, the compiled
rounds (cold ``torch.compile``) on two prompts, the hybrid on two."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import specdec
from specdec.drafters.dflash import DFlashDrafter

pytestmark = pytest.mark.gpu
logger = logging.getLogger(__name__)


def _setup(zoo, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not torch.cuda.is_available():
        pytest.fail("gpu tests need a CUDA device")
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=dtype).cuda().eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-dense", target=model)
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
    prompts = [tok(r["prompt"], return_tensors="pt").input_ids.cuda() for r in rows[:8]]
    return model, drafter, prompts


_HF: dict[tuple, torch.Tensor] = {}  # HF greedy outputs by (dtype, prompt, max_new_tokens), shared by the tests


def hf_greedy(model, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    key = (model.dtype, model.config.model_type, tuple(ids[0].tolist()), max_new_tokens)
    if key not in _HF:
        _HF[key] = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return _HF[key]


TREES = [None, specdec.Chain(k=15), specdec.DDTree(budget=15, topk=8), specdec.DDTree(budget=40, topk=8)]


@pytest.mark.parametrize("tree", TREES, ids=str)
def test_fast_path_fp32_equals_hf_greedy(zoo, tree):
    model, drafter, prompts = _setup(zoo, torch.float32)
    for ids in prompts[:4]:
        ref = hf_greedy(model, ids, 48)
        out = specdec.generate(model, ids, drafter=drafter if tree else None, tree=tree, max_new_tokens=48)
        assert out.stats.path == "graph"
        assert torch.equal(out.sequences, ref)


def test_fast_path_fp32_across_span_buckets(zoo):
    """Long generations cross span buckets (a second captured graph per round kind), DFlash norms in one launch."""
    import specdec.drafters.dflash_static as dflash_static
    from specdec.engine import SPAN_MIN, Engine

    model, drafter, prompts = _setup(zoo, torch.float32)
    # read when the engine builds the drafter's static forwards
    saved, dflash_static._NORM_IMPL = dflash_static._NORM_IMPL, "auto"
    try:
        Engine._engines.pop(model, None)
        for ids in prompts[:2]:
            new = SPAN_MIN + 64
            ref = hf_greedy(model, ids, new)
            out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=32, topk=8),
                                   max_new_tokens=new)  # fmt: skip
            assert out.stats.path == "graph" and torch.equal(out.sequences, ref)
        spans = {rnd.span for rnd in Engine._engines[model][1]._rounds.values()}
        assert len(spans) > 1, spans
    finally:
        dflash_static._NORM_IMPL = saved


def test_compiled_fast_path_with_triton_kernels_equals_hf_greedy(zoo, monkeypatch):
    """compile=True on CUDA with the drafter's one-launch norms (the default) and every linear layer of the target
    through the split-K skinny kernel (SPECDEC_LINEAR_KERNEL=triton, fp32 IEEE dots) inside the compiled graph:
    torch.compile hands the norm kernel its eps as fp64, which once failed to compile. fp32 outputs equal HF
    greedy; the same prompt again reuses the compiled rounds (compile time 0). One prompt: every shape compiled
    is a minute of this test."""
    import specdec.drafters.dflash_static as dflash_static
    from specdec.engine import Engine
    from specdec.kernels.skinny_linear import routing as linear
    from specdec.kernels.skinny_linear import triton as kernel

    calls = []
    real = kernel.skinny_linear_triton
    monkeypatch.setattr(kernel, "skinny_linear_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(linear, "KERNEL", "triton")
    monkeypatch.setattr(dflash_static, "_NORM_IMPL", "auto")
    model, drafter, prompts = _setup(zoo, torch.float32)
    Engine._engines.pop(model, None)
    tree = specdec.DDTree(budget=15, topk=8)
    ref = hf_greedy(model, prompts[0], 24)
    for i in range(2):
        out = specdec.generate(model, prompts[0], drafter=drafter, tree=tree, max_new_tokens=24, compile=True)
        assert out.stats.path == "graph" and torch.equal(out.sequences, ref)
        assert (out.stats.compile_ms > 0) == (i == 0), out.stats.compile_ms
    assert calls  # traced or launched: the kernel took part
    Engine._engines.pop(model, None)


def test_fast_path_fp32_with_the_linear_kernel_equals_hf_greedy(zoo, monkeypatch):
    """SPECDEC_LINEAR_KERNEL=triton: every linear layer of the target through the split-K skinny kernel (CUDA,
    fp32 IEEE dots), in the captured round; outputs equal HF greedy (inside torch.compile: the test above)."""
    from specdec.engine import Engine
    from specdec.kernels.skinny_linear import routing as linear
    from specdec.kernels.skinny_linear import triton as kernel

    calls = []
    real = kernel.skinny_linear_triton
    monkeypatch.setattr(kernel, "skinny_linear_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(linear, "KERNEL", "triton")
    model, drafter, prompts = _setup(zoo, torch.float32)
    Engine._engines.pop(model, None)
    for ids in prompts[:2]:
        ref = hf_greedy(model, ids, 24)
        out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=15, topk=8), max_new_tokens=24)
        assert out.stats.path == "graph" and torch.equal(out.sequences, ref)
    assert calls  # launched: the kernel took part
    Engine._engines.pop(model, None)


def test_fast_path_bf16_matches_eager_share(zoo):
    model, drafter, prompts = _setup(zoo, torch.bfloat16)
    tree = specdec.DDTree(budget=32, topk=8)
    same_eager = same_hf = 0
    for ids in prompts:
        ref = hf_greedy(model, ids, 48)
        fast = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=48)
        eager = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=48, cuda_graphs=False)
        same_eager += torch.equal(fast.sequences, eager.sequences)
        same_hf += torch.equal(fast.sequences, ref)
    logger.warning(
        "bf16 fast path: %d/%d equal to eager, %d/%d equal to HF greedy",
        same_eager,
        len(prompts),
        same_hf,
        len(prompts),
    )
    assert same_eager >= 0.75 * len(prompts)


def test_fast_path_sampling_runs_and_reuses_graphs(zoo):
    model, drafter, prompts = _setup(zoo, torch.bfloat16)
    tree = specdec.DDTree(budget=15, topk=8)
    gen = torch.Generator(device="cuda").manual_seed(0)
    first = specdec.generate(
        model, prompts[0], drafter=drafter, tree=tree, max_new_tokens=32, do_sample=True, temperature=0.8, generator=gen
    )
    again = specdec.generate(
        model, prompts[1], drafter=drafter, tree=tree, max_new_tokens=32, do_sample=True, temperature=0.8, generator=gen
    )
    assert first.stats.path == again.stats.path == "graph"
    assert again.stats.capture_ms == 0.0  # the graph of the first call is replayed


@pytest.mark.parametrize("prefill", ["model", "scan"])
def test_fast_path_hybrid_fp32_equals_hf_greedy(zoo, prefill, monkeypatch):
    """The zoo hybrid (Gated DeltaNet + attention) captured on the fast path, with either hybrid prefill: HF greedy;
    and the eager path with the same prefill (Triton tree scans and path replay on the HF cache): HF greedy with the
    same accepted lengths."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", prefill)

    model = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).cuda().eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-hybrid", target=model)
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
    for row in rows[:2]:
        ids = tok(row["prompt"], return_tensors="pt").input_ids.cuda()
        ref = hf_greedy(model, ids, 48)
        for tree in (None, specdec.Chain(k=15), specdec.DDTree(budget=32, topk=8)):
            kwargs = dict(drafter=drafter if tree else None, tree=tree, max_new_tokens=48)
            fast = specdec.generate(model, ids, **kwargs)
            assert fast.stats.path == "graph"
            assert torch.equal(fast.sequences, ref)
            if isinstance(tree, specdec.DDTree):
                eager = specdec.generate(model, ids, cuda_graphs=False, **kwargs)
                assert eager.stats.path == "eager" and torch.equal(eager.sequences, ref)
                assert eager.stats.accept_hist == fast.stats.accept_hist
