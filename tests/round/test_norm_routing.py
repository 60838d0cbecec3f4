"""The target's RMSNorm layers through ``rms_norm`` (``specdec.kernels.rms_norm.routing``, ``Backends.target_norm``):
which modules are routed (a probe against the reference's two formulas, Llama's and Gemma's / Qwen3-Next's
``x / rms * (1 + w)``, so a norm of another formula keeps its own forward), that the round routes them only while
it runs and restores the model, and that the tokens stay HF's. On CPU ``rms_norm`` is its reference; the kernel
itself is tested in ``tests/kernels/test_rms_norm.py`` and ``test_rms_norm_unit_offset.py``."""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model
from state.hybrid_harness import tiny_hybrid
from torch import nn

import specdec
from specdec.kernels.rms_norm import routing


class PlusTwoRMSNorm(nn.Module):
    """A norm of another formula under a matching name: ``x / rms * (2 + w)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = 1e-6

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (2.0 + self.weight.float())).to(x.dtype)


def _types(modules) -> set[str]:
    return {type(m).__name__ for m in modules}


def test_the_probe_routes_the_reference_formula_only():
    assert _types(routing.norm_modules(tiny_model("qwen3"))) == {"Qwen3RMSNorm"}
    assert len(routing.norm_modules(tiny_model("qwen3"))) == 2 * 4 + 1  # 2 layers x (input, post, q, k) + final
    assert _types(routing.norm_modules(tiny_model("llama"))) == {"LlamaRMSNorm"}
    gemma = routing.norm_modules(tiny_model("gemma3"))  # x / rms * (1 + w)
    assert _types(gemma) == {"Gemma3RMSNorm"} and {routing._formula(m) for m in gemma} == {"unit_offset"}
    hybrid = tiny_hybrid("qwen3_5")
    routed = routing.norm_modules(hybrid)
    assert _types(routed) == {"Qwen3_5RMSNorm"} and {routing._formula(m) for m in routed} == {"unit_offset"}
    gated = [m for m in hybrid.modules() if "Gated" in type(m).__name__]
    assert gated and not set(map(id, gated)) & set(map(id, routed))  # a gated norm keeps its own forward
    assert {routing._formula(m) for m in routing.norm_modules(tiny_model("qwen3"))} == {"plain"}
    assert routing.norm_modules(nn.Sequential(PlusTwoRMSNorm(16))) == []
    model = tiny_model("qwen3")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    routing.norm_modules(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the probe touched nothing


def test_norm_kernel_choice(monkeypatch):
    monkeypatch.setattr(routing, "KERNEL", "auto")
    assert not routing.norm_kernel_for("cpu")  # auto: where the Triton kernel runs (CUDA)
    monkeypatch.setattr(routing, "KERNEL", "triton")
    assert routing.norm_kernel_for("cpu")
    monkeypatch.setattr(routing, "KERNEL", "torch")
    assert not routing.norm_kernel_for("cuda")
    monkeypatch.setattr(routing, "KERNEL", "fused")
    with pytest.raises(ValueError, match="SPECDEC_TARGET_NORM='fused'"):
        routing.norm_kernel_for("cpu")


@pytest.mark.parametrize("arch", ["qwen3", "llama", "phi3", "gemma3"])
def test_routed_round_equals_hf_and_restores_the_model(arch, monkeypatch):
    model = tiny_model(arch, scale=4.0)
    calls = []
    real = routing.norm_forward
    monkeypatch.setattr(routing, "norm_forward", lambda m, x: calls.append(type(m).__name__) or real(m, x))
    ids = torch.tensor([[5, 9, 2, 77, 31, 8, 40]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False)
    drafter = specdec.ModelDrafter(perturbed_copy(model, noise=0.05))
    for tree in (None, specdec.DDTree(budget=6, topk=2)):
        calls.clear()
        out = specdec.generate(model, ids, drafter=drafter if tree else None, tree=tree, max_new_tokens=12,
                               backends={"target_norm": "triton"})  # fmt: skip
        assert torch.equal(out.sequences, want), tree
        assert calls and all(name.endswith("RMSNorm") for name in calls)
    assert not any("forward" in m.__dict__ for m in model.modules())  # every forward restored
    calls.clear()
    specdec.generate(model, ids, max_new_tokens=4, backends={"target_norm": "torch"})
    assert calls == []


def test_routed_hybrid_round_equals_hf(monkeypatch):
    """Qwen3.5's ``x / rms * (1 + w)`` norms routed (its gated norms not), plain decoding and n-gram chain rounds."""
    model = tiny_hybrid("qwen3_5")
    calls = []
    real = routing.norm_forward
    monkeypatch.setattr(routing, "norm_forward", lambda m, x: calls.append(type(m).__name__) or real(m, x))
    ids = torch.tensor([[5, 9, 2, 77, 5, 9, 2, 77, 31, 8, 40, 5, 9]])  # repeats: the n-gram drafter proposes
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    drafter = specdec.NGramDrafter()
    for tree in (None, specdec.Chain(4)):
        calls.clear()
        out = specdec.generate(model, ids, drafter=drafter if tree else None, tree=tree, max_new_tokens=10,
                               backends={"target_norm": "triton"})  # fmt: skip
        assert torch.equal(out.sequences, want), tree
        assert calls and set(calls) == {"Qwen3_5RMSNorm"}


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_routed_pair_is_one_cat_launch_equal_to_the_routed_forwards(arch):
    """``norm_cat_routed``: None unless both modules are routed right now (the caller then runs the modules); while
    routed, the two routed forwards concatenated, bit for bit (the plain and the ``1 + w`` formula); a pair of two
    formulas, or with a module of another formula, stays None."""
    model = tiny_model(arch)
    norms = routing.norm_modules(model)
    a, b = norms[0], norms[1]
    with torch.no_grad():
        a.weight.normal_(), b.weight.normal_()
    x, y = torch.randn(2, 3, a.weight.shape[0]), torch.randn(2, 3, b.weight.shape[0])
    assert routing.norm_cat_routed(a, x, b, y) is None  # not routed: the modules' own forwards run
    with routing.routed([a, b]), torch.no_grad():
        want = torch.cat([a(x), b(y)], -1)
        got = routing.norm_cat_routed(a, x, b, y)
    assert got is not None and torch.equal(got, want)
    other = PlusTwoRMSNorm(a.weight.shape[0])
    with routing.routed([a]):
        assert routing.norm_cat_routed(a, x, other, y) is None
