"""HF's ``apply_rotary_pos_emb`` through ``rotary`` while the round runs (``specdec.kernels.rotary.routing``,
``Backends.target_rotary``): which modeling modules are routed (a probe, bit for bit), that the name is bound only
while the round runs and restored after (an error too), and that the tokens do not change. On CPU ``rotary`` is its
reference; the kernel is tested in ``tests/kernels/test_rotary.py``."""

from __future__ import annotations

import types

import pytest
import torch
import transformers.models.llama.modeling_llama as llama
import transformers.models.qwen3.modeling_qwen3 as qwen3
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from models import tiny_model
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec.kernels.rotary import routing


def test_the_probe_routes_hfs_function_and_not_a_variant(monkeypatch):
    assert routing.rotary_modules(tiny_model("qwen3")) == [qwen3]
    assert routing.rotary_modules(tiny_model("llama")) == [llama]
    assert routing.rotary_modules(tiny_model("gpt2")) == []  # no rotary embedding
    fake = types.ModuleType("interleaved_rope")

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # pairs (0, 1), (2, 3), ...: another formula
        def rot(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin

    fake.apply_rotary_pos_emb = interleaved
    monkeypatch.setitem(__import__("sys").modules, "interleaved_rope", fake)
    model = tiny_model("qwen3")
    monkeypatch.setattr(type(model.model.layers[0].self_attn), "__module__", "interleaved_rope")
    assert fake not in routing.rotary_modules(model)


def test_rotary_kernel_choice(monkeypatch):
    from specdec import Backends

    assert Backends().target_rotary == "auto"  # the kernel where it runs (CUDA, bf16)
    monkeypatch.setattr(routing, "KERNEL", "torch")
    assert not routing.rotary_kernel_for("cuda")
    monkeypatch.setattr(routing, "KERNEL", "auto")
    assert not routing.rotary_kernel_for("cpu")
    monkeypatch.setattr(routing, "KERNEL", "triton")
    assert routing.rotary_kernel_for("cpu")
    monkeypatch.setattr(routing, "KERNEL", "wide")
    with pytest.raises(ValueError, match="SPECDEC_TARGET_ROTARY='wide'"):
        routing.rotary_kernel_for("cpu")


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen3_next"])
def test_routed_rounds_keep_the_tokens_and_restore_the_module(arch, monkeypatch):
    """``qwen3_next``: a hybrid whose attention layers rotate a quarter of each head (partial rotary)."""
    module = {"qwen3": qwen3, "llama": llama, "qwen3_next": qwen3_next}[arch]
    original = module.apply_rotary_pos_emb
    from specdec.kernels import rotary as package

    calls = []
    real = package.rotary
    widths = lambda q, k, cos, sin: (q.shape[-1], cos.shape[-1])  # noqa: E731 - (head dim, rotated dims)
    monkeypatch.setattr(package, "rotary", lambda *a, **k: calls.append(widths(*a)) or real(*a, **k))
    ids = torch.tensor([[5, 9, 2, 77, 31, 8, 40]])
    tree = specdec.DDTree(budget=6, topk=2)
    # fp32: the call does not fit the kernel, HF's function runs; the tokens are HF's
    make = (lambda: tiny_hybrid(arch, scale=4.0)) if arch == "qwen3_next" else (lambda: tiny_model(arch, scale=4.0))
    model = make()
    want = model.generate(ids, max_new_tokens=10, do_sample=False)
    out = specdec.generate(model, ids, max_new_tokens=10, backends={"target_rotary": "triton"})
    assert torch.equal(out.sequences, want) and calls == []
    # bf16: routed through rotary (its reference here), the same tokens as the unrouted round
    model = make().to(torch.bfloat16)  # a model of its own: engines are kept per model
    drafter = specdec.NGramDrafter()
    unrouted = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=10,
                                backends={"target_rotary": "torch"})  # fmt: skip
    assert calls == []
    routed = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=10,
                              backends={"target_rotary": "triton"})  # fmt: skip
    assert calls and torch.equal(routed.sequences, unrouted.sequences)
    if arch == "qwen3_next":
        assert all(rotated < dim for dim, rotated in calls), calls  # the partial calls took the kernel's path
    assert module.apply_rotary_pos_emb is original  # restored


def test_routing_is_restored_after_an_error():
    original = qwen3.apply_rotary_pos_emb
    with pytest.raises(RuntimeError, match="boom"), routing.routed([qwen3]):
        assert getattr(qwen3.apply_rotary_pos_emb, "specdec_original", None) is original
        with routing.routed([qwen3]):  # an enclosing scope's binding is kept, not wrapped twice
            assert qwen3.apply_rotary_pos_emb.specdec_original is original
        raise RuntimeError("boom")
    assert qwen3.apply_rotary_pos_emb is original
