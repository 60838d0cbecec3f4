"""A round whose CUDA graph capture fails runs eagerly on the caller's stream, and random ops work after it.

``torch.cuda.graph`` makes its capture stream current on entry and restores the caller's stream only when the
capture ends cleanly (``capture_end`` raises first when the body failed: the stream context is never left). Left
alone, every later launch of the process would run on that capture stream while the decode loop records the events
that tell it a round's result reached the host on the caller's stream: reads that return a slot's previous round.
The capture also leaves the device's default generator in capture mode, where every later random op fails.
These tests run ``Captured`` on the CPU against a stand-in for ``torch.cuda`` that keeps that behaviour of
``torch.cuda.graph`` (read from its ``__exit__``); ``tests/gpu/test_generate_cuda.py`` checks the same on a GPU.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from specdec.runtime import Captured


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class _Generator:
    """A device's default generator as a capture sees it: in capture mode from the capture's start to its clean end."""

    def __init__(self, capturing: bool = False) -> None:
        self.capturing = capturing

    def clone_state(self):
        return _Generator(self.capturing)

    def graphsafe_set_state(self, other) -> None:
        self.capturing = other.capturing


class _FakeCuda:
    """The ``torch.cuda`` calls ``Captured`` makes, with one current stream and one default generator; ``graph``
    behaves as torch's."""

    def __init__(self, fail: bool) -> None:
        self.default = _Stream("default")
        self.current = self.default
        self.capturing = False
        self.fail = fail
        self.graphs = 0
        self.default_generators = (_Generator(),)

    def current_device(self) -> int:
        return 0

    def current_stream(self, device=None):
        return self.current

    def set_stream(self, stream) -> None:
        self.current = stream

    def Stream(self, device=None):  # noqa: N802 (torch's name)
        return _Stream("side")

    @contextlib.contextmanager
    def stream(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def synchronize(self, device=None) -> None:
        pass

    def device(self, device):
        return contextlib.nullcontext()

    def CUDAGraph(self):  # noqa: N802 (torch's name)
        return _Graph(self)

    def graph(self, graph, pool=None, capture_error_mode="global"):
        return _GraphContext(self, graph)


class _Graph:
    def __init__(self, cuda: _FakeCuda) -> None:
        self.cuda, self.replays = cuda, 0

    def replay(self) -> None:
        self.replays += 1


class _GraphContext:
    """As ``torch.cuda.graph``: enter makes a capture stream current; exit ends the capture (which raises when the
    body failed, the capture being invalidated) and only then restores the caller's stream."""

    def __init__(self, cuda: _FakeCuda, graph: _Graph) -> None:
        self.cuda, self.graph = cuda, graph

    def __enter__(self) -> None:
        self.before = self.cuda.current
        self.cuda.current = _Stream("capture")
        self.cuda.capturing = True
        self.cuda.default_generators[0].capturing = True  # torch registers the default generator

    def __exit__(self, kind, value, tb) -> None:
        self.cuda.capturing = False
        if kind is not None:  # the capture's end raises before the stream and the generator are released
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        self.cuda.graphs += 1
        self.cuda.default_generators[0].capturing = False
        self.cuda.current = self.before


@pytest.fixture
def fake_cuda(monkeypatch, request):
    cuda = _FakeCuda(fail=request.param)
    names = ("current_stream", "set_stream", "Stream", "stream", "synchronize", "CUDAGraph", "graph", "device",
             "default_generators", "current_device")  # fmt: skip
    for name in names:
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    return cuda


def _host_read_fn(cuda: _FakeCuda, calls: list):
    """A round with an op a graph cannot hold when ``cuda.fail`` (a device value read on the host)."""

    def fn() -> None:
        calls.append(cuda.current.name)
        if cuda.capturing and cuda.fail:
            raise RuntimeError("operation not permitted when stream is capturing")

    return fn


@pytest.mark.parametrize("fake_cuda", [True], indirect=True)
def test_a_failed_capture_leaves_the_callers_stream_current(fake_cuda, caplog):
    calls: list[str] = []
    cap = Captured(_host_read_fn(fake_cuda, calls), device=torch.device("cuda"), graph=True)
    with caplog.at_level(logging.WARNING, logger="specdec.runtime"):
        cap()
    assert fake_cuda.current is fake_cuda.default  # not the capture stream of either try
    assert not fake_cuda.default_generators[0].capturing  # random ops work again
    assert cap.graph is None and not cap.use_graph
    assert "not permitted when stream is capturing" in cap.capture_failed
    assert any("capture failed" in r.getMessage() for r in caplog.records)
    # two warm-up runs on the side stream, one failed capture per capture mode, then the round called where the
    # caller launches: on its stream
    assert calls == ["side", "side", "capture", "capture", "default"]
    cap()
    assert calls[-1] == "default" and fake_cuda.current is fake_cuda.default


@pytest.mark.parametrize("fake_cuda", [True], indirect=True)
def test_prepare_after_a_failed_capture_keeps_the_stream(fake_cuda):
    """``Captured.capture`` (what ``Round.prepare`` calls for an adaptive policy's sizes) fails the same way."""
    calls: list[str] = []
    cap = Captured(_host_read_fn(fake_cuda, calls), device=torch.device("cuda"), graph=True)
    assert cap.capture() is False
    assert fake_cuda.current is fake_cuda.default and cap.capture_failed
    assert not fake_cuda.default_generators[0].capturing


@pytest.mark.parametrize("fake_cuda", [False], indirect=True)
def test_a_clean_capture_replays_on_the_callers_stream(fake_cuda):
    calls: list[str] = []
    cap = Captured(_host_read_fn(fake_cuda, calls), device=torch.device("cuda"), graph=True)
    cap()
    assert cap.graph is not None and cap.graph.replays == 1 and cap.capture_failed is None
    assert fake_cuda.current is fake_cuda.default and fake_cuda.graphs == 1
    assert calls == ["side", "side", "capture"]
