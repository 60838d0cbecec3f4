"""``compile=True`` on CPU: the rounds are compiled by inductor and run uncaptured; the tokens stay HF's greedy ones
and the compile time is reported on the first call only."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from test_fast_path import prompt, sharp_drafter

import specdec


@pytest.mark.slow
def test_compiled_rounds_equal_hf_greedy_and_report_their_compile_time():
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    tree = specdec.DDTree(budget=6, topk=3)
    kwargs = dict(drafter=drafter, tree=tree, max_new_tokens=20, cuda_graphs=True, compile=True)
    first = specdec.generate(target, ids, **kwargs)
    again = specdec.generate(target, ids, **kwargs)
    assert first.stats.path == again.stats.path == "fast"
    assert torch.equal(first.sequences, ref) and torch.equal(again.sequences, ref)
    assert first.stats.compile_ms > 0 and first.stats.capture_ms == 0  # nothing is captured on CPU
    assert again.stats.compile_ms == 0 and again.stats.capture_ms == 0  # the compiled round is reused
    plain = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=20, cuda_graphs=True)
    assert torch.equal(plain.sequences, ref) and plain.stats.compile_ms == plain.stats.capture_ms == 0


@pytest.mark.slow
def test_compiled_rounds_trace_the_routed_linear_layers(monkeypatch):
    """``SPECDEC_LINEAR_KERNEL=triton`` under ``compile=True``: dynamo traces the instance ``forward`` the scope
    sets on every ``nn.Linear`` (``skinny_linear``, its reference on CPU), the tokens stay HF's greedy ones, and the
    model is left without those forwards."""
    import specdec.kernels.skinny_linear as skinny
    from specdec.fast import linear

    calls = []
    real = skinny.skinny_linear
    monkeypatch.setattr(skinny, "skinny_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(linear, "KERNEL", "triton")
    target = tiny_model("qwen3", scale=4.0)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    out = specdec.generate(target, ids, max_new_tokens=12, cuda_graphs=True, compile=True)
    assert out.stats.path == "fast" and out.stats.compile_ms > 0 and torch.equal(out.sequences, ref)
    assert calls  # traced through the routed forwards
    assert all("forward" not in m.__dict__ for m in target.modules() if type(m) is torch.nn.Linear)


class _Variant:
    """A stand-in for a round: the same method compiled once per instance, specialised on an attribute."""

    def __init__(self, k: int) -> None:
        self.k = k

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k + 1


@pytest.mark.slow
def test_more_compiled_rounds_than_dynamos_default_limit_all_stay_compiled():
    """Every round compiles the same function (one variant per drafter, tree, sampling and span); past dynamo's
    default of 8 variants the rest would run uncompiled. Twelve variants give twelve compiled graphs."""
    from torch._dynamo.utils import counters

    from specdec.fast.graphs import compile_fn

    x = torch.ones(4)
    before = counters["stats"]["unique_graphs"]
    for k in range(12):
        fn = compile_fn(_Variant(k).run)
        assert torch.equal(fn(x), x * k + 1)
    assert counters["stats"]["unique_graphs"] - before == 12


@pytest.mark.parametrize("graph, graphs", [("split", 5), ("whole", 1)])
def test_kernel_dispatch_ends_the_compiled_region_unless_whole(monkeypatch, graph, graphs):
    """Every Triton-backed kernel asks ``importable`` which implementation to run. Compiled, "split" (the default)
    breaks the graph there, once per call; "whole" keeps one graph (the check is a constant after ``compile_fn``),
    and never traces an import, which would break it too."""
    from specdec.fast.graphs import compile_fn
    from specdec.kernels import _triton
    from specdec.kernels._triton import KERNEL_MODULES, importable

    monkeypatch.setattr(_triton, "COMPILE_GRAPH", graph)

    def dispatch(x: torch.Tensor) -> torch.Tensor:  # no loop: a graph break inside one skips the whole frame
        a, b, c, d, e = KERNEL_MODULES[:5]
        x = x + (1 if importable(a) else 2)
        x = x + (1 if importable(b) else 2)
        x = x + (1 if importable(c) else 2)
        x = x + (1 if importable(d) else 2)
        x = x + (1 if importable(e) else 2)
        return x * 3

    compile_fn(dispatch)  # primes the imports (compiles lazily: nothing runs here)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(dispatch)(torch.zeros(4))
    # split: the region before the first dispatch holds no op, so five graphs, one after each dispatch
    assert explained.graph_count == graphs, explained.break_reasons
    assert all("User-inserted graph break" in str(reason) for reason in explained.break_reasons)  # not an import
    torch._dynamo.reset()
