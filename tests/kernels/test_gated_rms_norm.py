"""``gated_rms_norm``: the reference against HF's own gated norms (Qwen3.5 and Qwen3-Next, after the cast of the
recurrence's fp32 output), the probe that routes a layer's norm (those two pass; Mamba2's gate-first norm and a
norm with another eps placement fail), ``gated_norm``'s fallbacks, the Triton version through the interpreter and
compiled on CUDA against the reference (fp32 within a few ulps: the sum's order and the GPU's ``exp``; bf16 / fp16
within one ulp of the output dtype), and planted bugs (no rounding of the fp32 input, the gate without silu) that
the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty
from torch import nn

import specdec.kernels.gated_rms_norm as gated
from specdec.kernels.gated_rms_norm import fits_triton, gated_norm, gated_rms_norm, gated_rms_norm_reference, probe

# (rows R = nodes * value heads, D, x dtype, weight dtype, model dtype, row stride padding of x)
SPECS = [
    (32, 128, torch.float32, torch.bfloat16, torch.bfloat16, 0),  # the 8 B hybrid's AR step: 32 heads of 128
    (33 * 8, 64, torch.float32, torch.bfloat16, torch.bfloat16, 0),  # the zoo hybrid's 33-node tree
    (7, 48, torch.float32, torch.float32, torch.float32, 16),  # no power of two, strided rows
    (5, 64, torch.float32, torch.float16, torch.float16, 0),
    (6, 32, torch.bfloat16, torch.float32, torch.bfloat16, 8),  # an fp32 weight: the product stays fp32
]


def make_case(seed: int, rows, dim, x_dtype, w_dtype, dtype, pad) -> dict:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, dim + pad, generator=gen) * 2).to(x_dtype)[:, :dim]  # row stride dim + pad
    x[0] = 0.0  # an all-zero row: rsqrt(eps)
    gate = (torch.randn(rows, dim, generator=gen) * 4).to(dtype)
    weight = torch.randn(dim, generator=gen).to(w_dtype)
    return dict(x=x, gate=gate, weight=weight, eps=1e-6, dtype=dtype)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def args(case: dict, device: str = "cpu") -> tuple:
    return case["x"].to(device), case["gate"].to(device), case["weight"].to(device), case["eps"]


def check(case: dict, got: torch.Tensor) -> None:
    want = gated_rms_norm_reference(*args(case), dtype=case["dtype"])
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype == case["dtype"]
    if case["dtype"] == torch.float32:
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6)
    else:  # the fp32 value before the last rounding may differ in its last bits: one ulp of the output dtype, and
        # that rarely (a missing intermediate rounding moves far more than 1 % of the elements)
        torch.testing.assert_close(got.float(), want.float(), rtol=torch.finfo(case["dtype"]).eps, atol=1e-6)
        assert (got != want).float().mean().item() <= 0.01


def _hf_norms() -> list[type]:
    out = []
    for mod, name in (("qwen3_5.modeling_qwen3_5", "Qwen3_5RMSNormGated"),
                      ("qwen3_next.modeling_qwen3_next", "Qwen3NextRMSNormGated")):  # fmt: skip
        module = pytest.importorskip(f"transformers.models.{mod}")
        out.append(getattr(module, name))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_is_the_layers_own_norm(dtype):
    """Exactly HF's module applied to the recurrence's output cast to the model dtype (the adapter's former ops)."""
    for cls in _hf_norms():
        gen = torch.Generator().manual_seed(1)
        norm = cls(96, eps=1e-6).to(dtype)
        norm.weight.data = torch.randn(96, generator=gen).to(dtype)
        x = torch.randn(2, 5, 96, generator=gen) * 3  # fp32, as the scan returns it
        gate = (torch.randn(2, 5, 96, generator=gen) * 3).to(dtype)
        want = norm(x.to(dtype), gate)
        assert torch.equal(gated_rms_norm_reference(x, gate, norm.weight, 1e-6, dtype=dtype), want)
        assert probe(norm)
        assert torch.equal(gated_norm(norm, x, gate, dtype), want)  # CPU: the module's own forward


class _GateFirst(nn.Module):
    """A gated norm of another formula (the gate applied before the norm)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = 1e-6

    def forward(self, x, gate):
        return gated_rms_norm_reference(x * torch.sigmoid(gate) * gate, torch.full_like(gate, 30.0), self.weight,
                                        self.variance_epsilon)  # fmt: skip


class _EpsOutside(_GateFirst):
    """``rsqrt(mean) + eps``-style slip: equal to the reference only for some inputs."""

    def forward(self, x, gate):
        h = x.float()
        h = h / (h.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)
        return (self.weight * h.to(x.dtype) * torch.nn.functional.silu(gate.float())).to(x.dtype)


def test_probe_refuses_other_formulas():
    mamba = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    # gate first, then the norm (named MambaRMSNormGated before transformers 5.18)
    if hasattr(mamba, "Mamba2RMSNormGated"):
        norm = mamba.Mamba2RMSNormGated(64, group_size=64, eps=1e-6)
    else:
        norm = mamba.MambaRMSNormGated(64, eps=1e-6)
    assert not probe(norm)
    assert not probe(_GateFirst(64))
    assert not probe(_EpsOutside(64))
    assert not probe(nn.LayerNorm(64))  # no variance_epsilon / a bias


def test_gated_norm_keeps_the_modules_forward_where_the_kernel_does_not_apply(monkeypatch):
    """With the kernel forced on (interpreter or not), a module that fails the probe runs its own forward."""
    monkeypatch.setattr(gated, "IMPL", "torch")
    module = _GateFirst(32)
    x, gate = torch.randn(4, 32), torch.randn(4, 32)
    assert torch.equal(gated_norm(module, x, gate, torch.float32), module(x, gate))


def test_planted_bugs_fail_the_check():
    case = cases()[0]
    x, gate, weight, eps = args(case)
    unrounded = gated_rms_norm_reference(x, gate, weight.float(), eps, dtype=torch.float32).to(case["dtype"])
    with pytest.raises(AssertionError):
        check(case, unrounded)  # the fp32 input not rounded to the model dtype first
    no_silu = gated_rms_norm_reference(x, torch.full_like(gate, 30.0), weight, eps, dtype=case["dtype"]) * gate
    with pytest.raises(AssertionError):
        check(case, no_silu.to(case["dtype"]))


def test_fits_and_refusals():
    case = cases()[1]
    x, gate, weight, eps = args(case)
    assert fits_triton(x, gate, weight, torch.bfloat16)
    assert not fits_triton(x.double(), gate, weight, torch.bfloat16)
    assert not fits_triton(x.t(), gate.t(), weight, torch.bfloat16)  # the last dim strided
    assert not fits_triton(x, gate[:, :10], weight, torch.bfloat16)
    got = gated_rms_norm(x, gate, weight, eps, dtype=torch.bfloat16)  # CPU auto: the reference
    assert torch.equal(got, gated_rms_norm_reference(x, gate, weight, eps, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="impl='triton' takes x and gate"):
        gated_rms_norm(x.double(), gate, weight, eps, impl="triton")
    with pytest.raises(ValueError, match="eps="):
        gated_rms_norm(x, gate, weight, torch.tensor(1e-6))


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("gated_rms_norm"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got)
    assert len(interpreted["routed"]) == len(_hf_norms()) == interpreted["kernel_calls"] - len(SPECS)
    for got in interpreted["routed"]:  # gated_norm with the kernel on, HF's norms holding case 1's weight
        check(cases()[1], got)


def _run_interpreted(folder: Path) -> None:
    import specdec.kernels.gated_rms_norm.triton as kernel

    data = torch.load(folder / "cases.pt")
    poison_empty()
    calls, launch = [], kernel.gated_rms_norm_triton
    kernel.gated_rms_norm_triton = lambda *a, **k: (calls.append(1), launch(*a, **k))[1]  # counts the launches
    out = {"outputs": [gated_rms_norm(*args(c), dtype=c["dtype"], impl="triton") for c in data["cases"]]}
    case, routed = data["cases"][1], []
    for cls in _hf_norms():
        norm = cls(case["x"].shape[-1], eps=case["eps"]).to(case["dtype"])
        norm.weight.data = case["weight"]
        routed.append(gated_norm(norm, case["x"], case["gate"], case["dtype"]))  # auto: Triton in the interpreter
    out["routed"], out["kernel_calls"] = routed, len(calls)
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    for case in cases():
        check(case, gated_rms_norm(*args(case, "cuda"), dtype=case["dtype"], impl="triton"))
        check(case, gated_rms_norm(*args(case, "cuda"), dtype=case["dtype"]))  # auto: Triton on CUDA
    case = cases()[1]
    static = args(case, "cuda")
    graph, out = capture_without_host_reads(lambda: gated_rms_norm(*static, dtype=case["dtype"]))
    graph.replay()
    check(case, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
