"""A round whose CUDA graph capture fails (a forward that reads a device value on the host) runs eagerly, on the
caller's stream, and reads each round's own result: fp32 greedy output equal to HF's ``generate``.

The hook that breaks the capture also sleeps on the device after its host read, so that the device runs well behind
the host at each round's end: a result copied on another stream than the one the loop's events are recorded on would
be read before it arrives (the previous round's tokens)."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model

import specdec
from specdec.runtime import Captured

pytestmark = pytest.mark.gpu


def test_captured_fn_with_a_host_read_runs_on_the_callers_stream(cuda):
    x = torch.arange(8.0, device=cuda)
    out = torch.zeros(8, device=cuda)

    def fn():
        out.copy_(x * (1 + int(x.sum().item() > 0)))  # a host read: the capture fails

    stream = torch.cuda.current_stream(cuda)
    cap = Captured(fn, device=cuda, graph=True)
    cap()
    assert torch.cuda.current_stream(cuda) == stream
    assert cap.graph is None and cap.capture_failed
    assert torch.equal(out, x * 2)


def test_random_ops_work_after_a_failed_capture(cuda):
    """A failed capture leaves the default generator in capture mode (every later random op would raise "Offset
    increment outside graph capture"): its state from before is put back, so the stream of numbers continues as if
    the capture had not been tried."""
    torch.manual_seed(5)
    want = torch.stack([torch.rand(3, device=cuda) for _ in range(2)])
    torch.manual_seed(5)
    first = torch.rand(3, device=cuda)
    x = torch.arange(4.0, device=cuda)
    cap = Captured(lambda: x.mul_(int(x.sum().item() > 0)), device=cuda, graph=True)
    cap()
    assert cap.capture_failed
    assert torch.equal(torch.stack([first, torch.rand(3, device=cuda)]), want)
    torch.nn.Linear(4, 4, device=cuda)  # a module initialised on the device (as the next test's model is)


@pytest.mark.parametrize("tree", ["chain", "ddtree"])
def test_uncaptured_rounds_read_their_own_results(cuda, tree):
    target = tiny_model("llama", scale=2.0).to(cuda)

    def host_read(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        int(hidden.sum().item() > 0)  # a host read inside the round's forward: no graph
        torch.cuda._sleep(5_000_000)  # the device falls behind the host for the rest of the round

    handle = target.model.layers[-1].register_forward_hook(host_read)
    try:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 128, (1, 12), generator=gen).to(cuda)
        ref = target.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
        policy = specdec.Chain(k=3) if tree == "chain" else specdec.DDTree(budget=8, topk=3)
        stream = torch.cuda.current_stream(cuda)
        out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=policy, max_new_tokens=24)
        assert torch.cuda.current_stream(cuda) == stream
        assert out.stats.capture_fallbacks >= 1
        assert torch.equal(out.sequences, ref)
    finally:
        handle.remove()
