"""The round's linear layers through ``specdec.kernels.skinny_linear`` (``SPECDEC_LINEAR_KERNEL=triton``).

On CPU ``skinny_linear`` runs its reference, so the in-process tests check the routing (which calls take the
kernel, that the model is restored) and HF-greedy identity; the interpreted test runs the Triton kernel itself,
through Triton's interpreter, inside a whole decode of a tiny fp32 model and compares it with HF greedy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import interpreted_outputs
from models import tiny_model

import specdec
import specdec.kernels.skinny_linear as skinny
from specdec.attention import AttentionScope
from specdec.kernels.skinny_linear import routing as linear

IDS = [[5, 9, 2, 77, 31, 8]]


def _spy(monkeypatch) -> list:
    calls = []
    real = skinny.skinny_linear

    def spy(x, weight, bias=None, **kwargs):
        calls.append(tuple(x.shape))
        return real(x, weight, bias, **kwargs)

    monkeypatch.setattr(skinny, "skinny_linear", spy)
    return calls


def test_linear_kernel_choice(monkeypatch):
    monkeypatch.setattr(linear, "KERNEL", "torch")
    assert not linear.linear_kernel_for()
    monkeypatch.setattr(linear, "KERNEL", "triton")
    assert linear.linear_kernel_for()
    monkeypatch.setattr(linear, "KERNEL", "cublas")
    with pytest.raises(ValueError, match="SPECDEC_LINEAR_KERNEL='cublas'"):
        linear.linear_kernel_for()


def test_scope_routes_the_linear_layers_and_restores_them():
    model = tiny_model("qwen3")
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    own = linears[0]
    own.forward = lambda x: F.linear(x, own.weight)  # a forward of the user's own is left alone
    scope = AttentionScope(model, grouped=False, linear=True)
    with scope:
        with scope:  # re-entered: still routed
            assert all("forward" in m.__dict__ for m in linears)
        assert all(m.forward.__func__ is linear.skinny_forward for m in linears[1:])
        assert own.forward.__name__ == "<lambda>"
    assert all("forward" not in m.__dict__ for m in linears[1:]) and "forward" in own.__dict__
    with pytest.raises(RuntimeError, match="boom"), scope:
        raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in linears[1:])
    with AttentionScope(model, grouped=False):  # linear=False (the default): nothing routed
        assert all("forward" not in m.__dict__ for m in linears[1:])


def test_scope_keeps_an_accelerate_style_hook_in_the_call_chain():
    """A module whose instance ``forward`` is a hook calling ``_old_forward`` (what accelerate's device-placement
    hooks set) is routed through ``_old_forward``: the hook still runs, then the skinny forward."""
    model = tiny_model("qwen3")
    head = model.lm_head
    seen = []
    head._old_forward = head.forward

    def hook(*args, **kwargs):
        seen.append("hook")
        return head._old_forward(*args, **kwargs)

    head.forward = hook
    x = torch.randn(1, 3, head.in_features)
    with AttentionScope(model, grouped=False, linear=True):
        assert head._old_forward.__func__ is linear.skinny_forward and head.forward is hook
        torch.testing.assert_close(head(x), F.linear(x, head.weight))
    assert seen == ["hook"] and head.forward is hook and head._old_forward.__func__ is torch.nn.Linear.forward


def test_skinny_forward_is_skinny_linear_of_the_layer(monkeypatch):
    calls = _spy(monkeypatch)
    layer = torch.nn.Linear(24, 10)
    for shape in [(1, 1, 24), (1, 64, 24), (64, 24), (1, 65, 24)]:  # skinny_linear picks F.linear past 64 rows
        x = torch.randn(*shape)
        torch.testing.assert_close(linear.skinny_forward(layer, x), layer(x))
    assert calls == [(1, 1, 24), (1, 64, 24), (64, 24), (1, 65, 24)]
    with pytest.raises(ValueError, match="weight is torch.float32, x torch.float64"):  # a clear error, no cast
        linear.skinny_forward(layer, torch.randn(3, 24, dtype=torch.float64))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_round_with_the_linear_kernel_equals_hf_greedy(monkeypatch, arch):
    calls = _spy(monkeypatch)
    monkeypatch.setattr(linear, "KERNEL", "triton")
    model = tiny_model(arch, scale=4.0)
    ids = torch.tensor(IDS)
    want = model.generate(ids, max_new_tokens=10, do_sample=False)
    out = specdec.generate(model, ids, max_new_tokens=10)
    assert out.stats.path == "eager" and torch.equal(out.sequences, want)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert len(calls) >= 10 * len(linears)  # every layer, every round (the prefill too)
    assert all("forward" not in m.__dict__ for m in linears)  # the model is left as it was


def test_routed_forwards_keep_one_host_read_per_round(monkeypatch):
    """With the linear routing and the Triton attention choice on, a call still reads the host once per round, once
    for the prefill's first token and once of the prompt (its pad tokens: tests/test_input_rules.py): the new
    forwards decide from shapes and dtypes only."""
    from host_reads import spy_round_reads

    from specdec import attention

    monkeypatch.setattr(linear, "KERNEL", "triton")
    monkeypatch.setattr(attention, "KERNEL", "triton")
    target = tiny_model("qwen3", scale=4.0)
    reads = spy_round_reads(monkeypatch, everywhere=True)
    out = specdec.generate(target, torch.tensor(IDS), max_new_tokens=12)
    assert out.stats.path == "eager" and out.stats.rounds > 0
    assert len(reads) == out.stats.rounds + 2, reads


def test_interpreted_kernel_in_a_decode_equals_hf_greedy(tmp_path):
    """The Triton kernel itself (interpreter, fp32, split-K forced by a small SM count) in every linear layer of a
    decode."""
    pytest.importorskip("triton")
    out = interpreted_outputs(__file__, tmp_path, {"ids": IDS})
    assert out["triton_calls"] > 0 and out["split_calls"] > 0
    assert torch.equal(out["got"], out["want"]), (out["got"], out["want"])


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry (``TRITON_INTERPRET=1``): a decode with ``SPECDEC_LINEAR_KERNEL=triton``."""
    from specdec.kernels.skinny_linear import triton as kernel

    linear.KERNEL = "triton"
    counts = {"triton_calls": 0, "split_calls": 0}
    real = kernel.skinny_linear_triton

    def counted(x2d, weight, bias=None, **kwargs):
        counts["triton_calls"] += 1
        plan = kernel.split_plan(x2d.shape[0], weight.shape[0], x2d.shape[1], 4, itemsize=x2d.element_size())
        counts["split_calls"] += plan["SPLIT_K"] > 1
        return real(x2d, weight, bias, sms=4, **kwargs)  # 4 SMs: the small layers split K too

    kernel.skinny_linear_triton = counted
    data = torch.load(folder / "cases.pt")
    model = tiny_model("qwen3", scale=4.0)
    ids = torch.tensor(data["ids"])
    want = model.generate(ids, max_new_tokens=6, do_sample=False)
    got = specdec.generate(model, ids, max_new_tokens=6).sequences
    torch.save({"want": want, "got": got, **counts}, folder / "outputs.pt")


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
