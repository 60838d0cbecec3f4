"""``silu_mul``: the reference against HF's gated MLP (Llama / Qwen3), the probe that routes MLP modules (HF's and the
DFlash drafter's pass; a GELU MLP and another formula keep their forward), the routed forward equal to the module's
own, the Triton version through the interpreter and compiled on CUDA against the reference (bf16 / fp16 within one
ulp of the output and rarely: the GPU's ``exp``; fp32 within a few ulps), autograd and mismatched shapes left to the
reference, and a planted bug (the SiLU not rounded to the gate's dtype) that the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty
from torch import nn

from specdec.kernels.silu_mul import fits_triton, mlp_forward, mlp_modules, silu_mul, silu_mul_reference

# (rows, width, gate dtype, up dtype, strided)
SPECS = [
    (1, 12288, torch.bfloat16, torch.bfloat16, False),  # a Qwen3-8B AR step
    (33, 384, torch.bfloat16, torch.bfloat16, True),  # the zoo's 33-node verify, gate and up as chunks of one product
    (5, 100, torch.float32, torch.float32, False),
    (7, 1500, torch.float16, torch.float16, True),
]


def make_case(seed: int, rows, width, gate_dtype, up_dtype, strided) -> dict:
    gen = torch.Generator().manual_seed(seed)
    if strided:  # [gate | up] halves of one [R, 2F] product, as a packed gate_up projection hands them over
        both = torch.randn(rows, 2 * width, generator=gen) * 4
        gate, up = both[:, :width].to(gate_dtype), both[:, width:].to(up_dtype)
        gate, up = torch.cat([gate, up], 1)[:, :width], torch.cat([gate, up], 1)[:, width:]
    else:
        gate = (torch.randn(rows, width, generator=gen) * 4).to(gate_dtype)
        up = (torch.randn(rows, width, generator=gen) * 4).to(up_dtype)
    return dict(gate=gate, up=up)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def check(case: dict, got: torch.Tensor) -> None:
    want = silu_mul_reference(case["gate"], case["up"])
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 * torch.finfo(want.dtype).eps, atol=1e-6)
        assert (got != want).float().mean().item() <= 0.01


def _llama_mlp(dtype=torch.float32, act="silu"):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act=act)
    mlp = LlamaMLP(config).to(dtype)
    for p in mlp.parameters():
        nn.init.normal_(p, std=0.3)
    return mlp


def test_reference_is_hfs_mlp_activation():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        mlp = _llama_mlp(dtype)
        x = torch.randn(4, 32).to(dtype)
        want = mlp(x)
        assert torch.equal(mlp.down_proj(silu_mul_reference(mlp.gate_proj(x), mlp.up_proj(x))), want)
        assert torch.equal(mlp_forward(mlp, x), want)  # CPU auto: the reference


class _Swapped(nn.Module):
    """Gate and up exchanged: a formula the probe must refuse."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(8, 12), nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x):
        return self.down_proj(F.silu(self.up_proj(x)) * self.gate_proj(x))


def test_probe_routes_the_gated_silu_mlps_only():
    from types import SimpleNamespace

    from specdec.drafters.dflash_model import DFlashMLP

    silu, gelu, swapped = _llama_mlp(), _llama_mlp(act="gelu_pytorch_tanh"), _Swapped()
    dflash = DFlashMLP(SimpleNamespace(hidden_size=32, intermediate_size=48))
    holder = nn.ModuleList([silu, gelu, swapped, dflash])
    assert {id(m) for m in mlp_modules(holder, None)} == {id(silu), id(dflash)}


def test_a_scope_routes_a_models_mlps_and_restores_them():
    from models import tiny_model

    from specdec.attention import AttentionScope

    model = tiny_model("qwen3")
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        scope = AttentionScope(model, grouped=False, mlps=True)
        assert len(scope.mlps) == model.config.num_hidden_layers
        with scope:
            assert all("forward" in m.__dict__ for m in scope.mlps)
            got = model(ids).logits
    assert not any("forward" in m.__dict__ for m in scope.mlps)
    assert torch.equal(got, want)


def test_autograd_and_other_shapes_take_the_reference():
    gate = torch.randn(3, 8, requires_grad=True)
    up = torch.randn(3, 8)
    assert not fits_triton(gate, up)
    with torch.no_grad():
        assert fits_triton(gate, up)
    assert not fits_triton(torch.randn(3, 8), torch.randn(3, 9))
    assert not fits_triton(torch.randn(8, 3).t(), torch.randn(3, 8))  # the last dim strided
    with pytest.raises(ValueError, match="impl='triton' takes gate and up"):
        silu_mul(torch.randn(3, 8), torch.randn(3, 9), impl="triton")
    out = silu_mul(gate, up)  # CPU auto: the reference, with its gradient
    out.sum().backward()
    assert gate.grad is not None


def test_the_silu_not_rounded_first_fails_the_check():
    case = cases()[0]
    unrounded = (F.silu(case["gate"].float()) * case["up"].float()).to(torch.bfloat16)
    with pytest.raises(AssertionError):
        check(case, unrounded)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("silu_mul"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got)
    want, got = interpreted["mlp"]
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)
    assert interpreted["kernel_calls"] == len(SPECS) + 1  # the routed MLP launched the kernel


def _run_interpreted(folder: Path) -> None:
    import specdec.kernels.silu_mul.triton as kernel

    data = torch.load(folder / "cases.pt")
    poison_empty()
    calls, launch = [], kernel.silu_mul_triton
    kernel.silu_mul_triton = lambda *a: (calls.append(1), launch(*a))[1]
    out = {"outputs": [silu_mul(c["gate"], c["up"], impl="triton") for c in data["cases"]]}
    mlp = _llama_mlp(torch.bfloat16)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        out["mlp"] = (mlp(x), mlp_forward(mlp, x))  # auto: Triton in the interpreter
    out["kernel_calls"] = len(calls)
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    for case in cases():
        gate, up = case["gate"].cuda(), case["up"].cuda()
        check(case, silu_mul(gate, up, impl="triton"))
        check(case, silu_mul(gate, up))  # auto: Triton on CUDA
    case = cases()[1]
    gate, up = case["gate"].cuda(), case["up"].cuda()
    graph, out = capture_without_host_reads(lambda: silu_mul(gate, up))
    graph.replay()
    check(case, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
