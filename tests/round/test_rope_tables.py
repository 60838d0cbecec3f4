"""The target's rotary tables (``specdec.state.rope``): each rotary module answers the round's forwards with one
gather from a table of its own values; the values equal the module's own forward bit for bit, modules whose values
depend on more than each position are left alone, the forwards are swapped only while a scope runs, and the round's
tokens equal HF's ``generate``."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model

import specdec
from specdec.attention import AttentionScope
from specdec.state.rope import RopeTables


def _rotary(model):
    return model.model.rotary_emb


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lookup_equals_the_modules_forward(arch, dtype):
    model = tiny_model(arch).to(dtype)
    tables = RopeTables(model, 96, dtype)
    assert tables.tables, "every rotary module of a static rope type gets a table"
    positions = torch.tensor([[0, 5, 5, 95, 17], [3, 2, 1, 0, 64]])
    x = torch.zeros(1, dtype=dtype)
    for module, forward in tables.forwards():
        cos, sin = forward(x, positions)
        own_cos, own_sin = type(module).forward(module, x, positions)  # the module's own, computed now
        assert cos.shape == own_cos.shape and torch.equal(cos, own_cos)
        assert sin.shape == own_sin.shape and torch.equal(sin, own_sin)


def test_a_length_dependent_rope_keeps_its_forward():
    model = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert RopeTables(model, 64, torch.float32).tables == []


def test_per_layer_type_ropes_keep_their_forward():
    assert RopeTables(tiny_model("gemma3"), 64, torch.float32).tables == []  # forward(x, positions, layer_type)


def test_a_module_that_is_not_per_position_is_refused(monkeypatch):
    model = tiny_model("qwen3")
    module = _rotary(model)
    own = type(module).forward

    def shifted(self, x, position_ids):  # depends on the call's first position: no table can answer it
        return own(self, x, position_ids - position_ids[..., :1])

    monkeypatch.setattr(type(module), "forward", shifted)
    assert RopeTables(model, 64, torch.float32).tables == []


def test_swapped_only_inside_the_scope():
    model = tiny_model("qwen3")
    module = _rotary(model)
    tables = RopeTables(model, 64, torch.float32)
    scope = AttentionScope(model, grouped=False, forwards=tables.forwards())
    assert "forward" not in module.__dict__
    with pytest.raises(RuntimeError), scope:
        assert "forward" in module.__dict__
        raise RuntimeError("inside")
    assert "forward" not in module.__dict__


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_round_tokens_equal_hf_generate(arch):
    torch.manual_seed(0)
    model = tiny_model(arch, scale=3.0)
    ids = torch.randint(3, 100, (1, 11))
    want = model.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    called = []
    module = _rotary(model)
    own = type(module).forward

    def spy(self, x, position_ids):  # counts the calls that reach the module's own forward
        called.append(position_ids.shape)
        return own(self, x, position_ids)

    type(module).forward = spy
    try:
        first = specdec.generate(model, ids, max_new_tokens=20, do_sample=False, min_new_tokens=20, cuda_graphs=False)
        called.clear()  # the engine and its tables are built: later forwards read the tables only
        again = specdec.generate(model, ids, max_new_tokens=20, do_sample=False, min_new_tokens=20, cuda_graphs=False)
    finally:
        type(module).forward = own
    assert first.sequences.tolist() == want.tolist()
    assert again.sequences.tolist() == want.tolist()
    assert called == []
