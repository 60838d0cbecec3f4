"""``compile=True`` on CPU: the rounds are compiled by inductor and run uncaptured; the tokens stay HF's greedy ones
and the compile time is reported on the first call only."""

from __future__ import annotations

import pytest
import torch
from compile_faults import failing_backend
from models import tiny_model
from test_round import prompt, sharp_drafter

import specdec
from specdec.engine import Engine


@pytest.mark.slow
def test_compiled_rounds_equal_hf_greedy_and_report_their_compile_time():
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    tree = specdec.DDTree(budget=6, topk=3)
    kwargs = dict(drafter=drafter, tree=tree, max_new_tokens=20, compile=True)
    first = specdec.generate(target, ids, **kwargs)
    again = specdec.generate(target, ids, **kwargs)
    assert first.stats.path == again.stats.path == "eager"
    assert torch.equal(first.sequences, ref) and torch.equal(again.sequences, ref)
    assert first.stats.compile_ms > 0 and first.stats.capture_ms == 0  # nothing is captured on CPU
    assert again.stats.compile_ms == 0 and again.stats.capture_ms == 0  # the compiled round is reused
    plain = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=20)
    assert torch.equal(plain.sequences, ref) and plain.stats.compile_ms == plain.stats.capture_ms == 0


@pytest.mark.slow
def test_compiled_rounds_trace_the_routed_linear_layers(monkeypatch):
    """``SPECDEC_LINEAR_KERNEL=triton`` under ``compile=True``: dynamo traces the instance ``forward`` the scope
    sets on every ``nn.Linear`` (``skinny_linear``, its reference on CPU), the tokens stay HF's greedy ones, and the
    model is left without those forwards."""
    import specdec.kernels.skinny_linear as skinny
    from specdec.kernels.skinny_linear import routing as linear

    calls = []
    real = skinny.skinny_linear
    monkeypatch.setattr(skinny, "skinny_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(linear, "KERNEL", "triton")
    target = tiny_model("qwen3", scale=4.0)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    out = specdec.generate(target, ids, max_new_tokens=12, compile=True)
    assert out.stats.path == "eager" and out.stats.compile_ms > 0 and torch.equal(out.sequences, ref)
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

    from specdec.runtime import compile_fn

    x = torch.ones(4)
    before = counters["stats"]["unique_graphs"]
    for k in range(12):
        fn = compile_fn(_Variant(k).run)
        assert torch.equal(fn(x), x * k + 1)
    assert counters["stats"]["unique_graphs"] - before == 12


class _Layer(torch.nn.Module):
    """A stand-in for an attention layer whose kernel call ends the compiled region: dynamo compiles the rest of its
    forward on its own, specialised on ``layer_idx`` (as HF's cache update indexes with it)."""

    def __init__(self, idx: int) -> None:
        super().__init__()
        self.layer_idx = idx

    def forward(self, x: torch.Tensor, store: torch.Tensor) -> torch.Tensor:
        y = x + 1
        torch._dynamo.graph_break()
        store[self.layer_idx] = y.sum()
        return y * 2


class _Stack(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer(i) for i in range(layers))

    def forward(self, x: torch.Tensor, store: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, store)
        return x


def test_layer_forwards_compiled_per_layer_and_shape_all_stay_compiled(monkeypatch):
    """A Qwen3-8B round breaks the compiled region at every attention kernel call, so each of its 36 layers'
    forwards is compiled once per round shape: the AR step and one verify shape are 72 variants of one function,
    past the 64 specdec used to allow (layers 28-35 of the verify then ran uncompiled). 40 layers x 2 shapes here,
    on dynamo's own backend (the limits are dynamo's; inductor would only make it slow): every variant compiled."""
    from torch._dynamo.utils import counters

    from specdec import runtime as graphs

    real = torch.compile
    monkeypatch.setattr(graphs.torch, "compile", lambda fn, **kw: real(fn, backend="eager", dynamic=False))
    torch._dynamo.reset()
    counters.clear()
    stack = _Stack(40)
    fn = graphs.compile_fn(stack.forward)
    for rows in (1, 2):
        store, eager = torch.zeros(40), torch.zeros(40)
        x = torch.ones(rows, 4)
        assert torch.equal(fn(x, store), stack(x, eager)) and torch.equal(store, eager)
    # each layer forward's tail (after the break) compiled once per layer and shape; none ran eager past a limit
    assert counters["resumes"] and not any("recompile limit" in key for key in counters["unimplemented"])
    assert counters["stats"]["unique_graphs"] >= 2 * 40
    torch._dynamo.reset()


@pytest.mark.parametrize("graph, graphs", [("split", 5), ("whole", 1)])
def test_kernel_dispatch_ends_the_compiled_region_unless_whole(monkeypatch, graph, graphs):
    """Every Triton-backed kernel asks ``importable`` which implementation to run. Compiled, "split" (the default)
    breaks the graph there, once per call; "whole" keeps one graph (the check is a constant after ``compile_fn``),
    and never traces an import, which would break it too."""
    from specdec.kernels import _triton
    from specdec.kernels._triton import KERNEL_MODULES, importable
    from specdec.runtime import compile_fn

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


@pytest.mark.parametrize(
    "compile, error",
    [
        ("max-autotune", "max-autotune-no-cudagraphs"),  # a mode that captures graphs itself
        ({"triton.cudagraphs": True}, "captures the CUDA graphs itself"),
        ({}, "name the options"),
        ({"max_autotune_gem_backends": "ATEN"}, "not inductor options"),
        (3, "a bool, a mode name or a dict"),
    ],
)
def test_bad_compile_arguments_are_refused_before_anything_runs(compile, error):
    target = tiny_model("qwen3")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises((ValueError, TypeError), match=error):
        specdec.generate(target, prompt(), max_new_tokens=4, compile=compile)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    assert target not in Engine._engines and not any("forward" in m.__dict__ for m in target.modules())


@pytest.mark.slow
def test_compile_with_inductor_options_equals_hf_greedy():
    """``compile=`` a dict of inductor options (``torch.compile(options=...)``): the rounds compile with them and
    are cached under them (a second call compiles nothing)."""
    target = tiny_model("qwen3", scale=4.0)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=10, do_sample=False)
    options = {"epilogue_fusion": False, "max_autotune_gemm_backends": "ATEN"}
    first = specdec.generate(target, ids, max_new_tokens=10, compile=options)
    again = specdec.generate(target, ids, max_new_tokens=10, compile=dict(options))
    assert first.stats.path == "eager" and first.stats.compile_ms > 0 and again.stats.compile_ms == 0
    assert torch.equal(first.sequences, ref) and torch.equal(again.sequences, ref)


def test_a_round_that_fails_to_compile_is_put_back_and_runs_uncompiled(caplog):
    """The compiled function has run its first graph (a state update) when its second graph fails to compile: the
    snapshot puts the state back, the uncompiled function takes over, and the state is updated exactly once."""
    from specdec.runtime import Captured

    state = torch.zeros(3)

    def step() -> None:
        state.add_(1)  # the first graph: runs before the second one is compiled
        torch._dynamo.graph_break()
        state.mul_(2)

    def snapshot():
        saved = state.clone()
        return lambda: state.copy_(saved)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=failing_backend(2))
    cap = Captured(compiled, device=torch.device("cpu"), graph=False, snapshot=snapshot, uncompiled=step)
    with caplog.at_level("WARNING", logger="specdec.runtime"):
        cap()
    assert torch.equal(state, torch.full((3,), 2.0))  # (0 + 1) * 2 once; without the snapshot it would be 6
    assert cap.fn is step and "shared memory" in cap.compile_failed
    assert any("runs uncompiled" in r.getMessage() and "shared memory" in r.getMessage() for r in caplog.records)
    cap()
    assert torch.equal(state, torch.full((3,), 6.0))
    # without an uncompiled fallback the error reaches the caller
    bare = Captured(torch.compile(step, backend=failing_backend(1)), device=torch.device("cpu"), graph=False)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="shared memory"):
        bare()
    torch._dynamo.reset()


def test_generate_when_compiling_fails_runs_the_rounds_uncompiled_and_equals_hf_greedy(monkeypatch, caplog):
    """``compile=True`` where the backend cannot compile the rounds (here: one that fails on its first graph): the
    call still equals HF greedy on the rounds' uncompiled code, and a warning names the error."""
    from specdec import engine as round_engine

    monkeypatch.setattr(
        round_engine, "compile_fn", lambda fn, mode: torch.compile(fn, backend=failing_backend(1), dynamic=False)
    )
    target = tiny_model("qwen3", scale=2.0)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger="specdec.runtime"):
        out = specdec.generate(
            target, ids, drafter=sharp_drafter(target), tree=specdec.DDTree(budget=4, topk=2), max_new_tokens=12,
            compile=True,
        )  # fmt: skip
    assert out.stats.path == "eager" and torch.equal(out.sequences, ref)
    assert any("runs uncompiled" in r.getMessage() for r in caplog.records)
    rounds = [r for r in Engine._engines[target][1]._rounds.values() if r.compile]
    assert rounds and all(r.captured.compile_failed for r in rounds)
    assert out.stats.compile_fallbacks == len(rounds) and out.stats.as_dict()["compile_fallbacks"] == len(rounds)
    again = specdec.generate(
        target, ids, drafter=sharp_drafter(target), tree=specdec.DDTree(budget=4, topk=2), max_new_tokens=12,
        compile=True,
    )  # fmt: skip
    assert torch.equal(again.sequences, ref) and again.stats.compile_fallbacks == len(rounds)  # still uncompiled
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_auto_rounds_equal_hf_greedy_and_deliver_their_expectations():
    """``DDTree(budget="auto")`` with ``compile=True``: the expectations that a compiled round writes into its output
    copy (float64 columns viewed from the int64 output) reach the controller: every tree round's are those of a
    drafter that predicts something (not the zeros of a write lost to the compiled graph), and tokens are HF's."""
    from specdec.budget import AutoBudget

    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    seen: list = []

    class Observed(AutoBudget):
        def observe(self, size, expected, accepted, ms, rows=None):
            if size > 0:
                seen.append(expected)
            super().observe(size, expected, accepted, ms, rows)

    class Tree(specdec.DDTree):
        def controller(self, batch):
            return Observed(self.sizes, batch)

    tree = Tree(budget="auto", topk=3, sizes=(2, 6, 12))
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=24, compile=True)
    assert torch.equal(out.sequences, ref)
    assert seen and all(row[0] > 0 for expected in seen for row in expected), seen
