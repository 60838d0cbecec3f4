"""The fast path's linear layers through ``specdec.kernels.skinny_linear`` (``SPECDEC_LINEAR_KERNEL=triton``).

On CPU ``skinny_linear`` runs its reference, so the in-process tests check the routing (which calls take the
kernel, that the model is restored) and HF-greedy identity; the interpreted test runs the Triton kernel itself,
through Triton's interpreter, inside a whole fast-path decode of a tiny fp32 model and compares it with HF greedy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import interpreted_outputs

import specdec
import specdec.kernels.skinny_linear as skinny
from specdec.fast import linear
from specdec.fast.attention import AttentionScope
from tests.models import tiny_model

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


def test_skinny_forward_takes_up_to_max_rows_in_the_weights_dtype(monkeypatch):
    calls = _spy(monkeypatch)
    layer = torch.nn.Linear(24, 10)
    for shape in [(1, 1, 24), (1, 64, 24), (64, 24)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(linear.skinny_forward(layer, x), layer(x))
    assert calls == [(1, 1, 24), (1, 64, 24), (64, 24)]
    calls.clear()
    for x in [torch.randn(1, 65, 24), torch.randn(2, 40, 24), torch.randn(3, 24, dtype=torch.float64)]:
        if x.dtype == torch.float64:
            with pytest.raises(RuntimeError):  # F.linear's own error on mixed dtypes, not a silent cast
                linear.skinny_forward(layer, x)
        else:
            torch.testing.assert_close(linear.skinny_forward(layer, x), layer(x))
    assert calls == []


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_fast_path_with_the_linear_kernel_equals_hf_greedy(monkeypatch, arch):
    calls = _spy(monkeypatch)
    monkeypatch.setattr(linear, "KERNEL", "triton")
    model = tiny_model(arch, scale=4.0)
    ids = torch.tensor(IDS)
    want = model.generate(ids, max_new_tokens=10, do_sample=False)
    out = specdec.generate(model, ids, max_new_tokens=10, cuda_graphs=True)
    assert out.stats.path == "fast" and torch.equal(out.sequences, want)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert len(calls) >= 10 * len(linears)  # every layer, every round (the prefill too)
    assert all(rows <= skinny.MAX_ROWS for *lead, _ in calls for rows in [int(torch.tensor(lead).prod())])
    assert all("forward" not in m.__dict__ for m in linears)  # the model is left as it was


def test_interpreted_kernel_in_a_fast_path_decode_equals_hf_greedy(tmp_path):
    """The Triton kernel itself (interpreter, fp32, split-K forced by a small SM count) in every linear layer of a
    fast-path decode."""
    pytest.importorskip("triton")
    out = interpreted_outputs(__file__, tmp_path, {"ids": IDS})
    assert out["triton_calls"] > 0 and out["split_calls"] > 0
    assert torch.equal(out["fast"], out["want"]), (out["fast"], out["want"])


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry (``TRITON_INTERPRET=1``): a fast-path decode with ``SPECDEC_LINEAR_KERNEL=triton``."""
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
    fast = specdec.generate(model, ids, max_new_tokens=6, cuda_graphs=True).sequences
    torch.save({"want": want, "fast": fast, **counts}, folder / "outputs.pt")


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
