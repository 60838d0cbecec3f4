"""``TargetModel.wrap`` makes a model's wrapper once (making one walks every module: milliseconds per call at real
sizes) and must make a new one whenever what it was made from changes; the weights' state it reads each call is the
engine's staleness check (a cast, a move or an in-place update between calls)."""

from __future__ import annotations

import torch
from models import tiny_model
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec.target import TargetModel


def test_the_wrapper_is_reused_while_nothing_changes():
    model = tiny_model("qwen3", num_hidden_layers=2)
    first = TargetModel.wrap(model)
    assert TargetModel.wrap(model) is first
    assert TargetModel.wrap(first) is first


def test_a_cast_a_new_attention_implementation_or_other_options_make_a_new_wrapper():
    model = tiny_model("qwen3", num_hidden_layers=2)
    first = TargetModel.wrap(model)
    model.to(torch.float64)
    cast = TargetModel.wrap(model)
    assert cast is not first and cast.dtype == torch.float64
    model.set_attn_implementation("eager")
    eager = TargetModel.wrap(model)
    assert eager is not cast
    assert TargetModel.wrap(model, hybrid_mode="snapshot") is not eager


def test_a_replaced_layer_makes_a_new_wrapper_with_its_state():
    """A hybrid target whose recurrent mixer is replaced by a new module: the new wrapper's state manager must run
    the new module (a reused one would keep an adapter over the old mixer, which no longer runs in the model)."""
    import copy

    model = tiny_hybrid("qwen3_5")
    first = TargetModel.wrap(model)
    layer = next(layer for layer in model.model.layers if hasattr(layer, "linear_attn"))
    old = layer.linear_attn
    layer.linear_attn = copy.deepcopy(old)
    wrapped = TargetModel.wrap(model)
    assert wrapped is not first
    modules = [adapter.module for adapter in wrapped.state.adapters]
    assert any(m is layer.linear_attn for m in modules) and not any(m is old for m in modules)


def test_each_wrap_reads_the_weights_state_of_that_call():
    model = tiny_model("qwen3", num_hidden_layers=2)
    before = TargetModel.wrap(model).versions
    with torch.no_grad():
        model.lm_head.weight.mul_(1.0)  # an in-place update: same addresses, one more version
    wrapped = TargetModel.wrap(model)
    assert wrapped.versions == before + 1
    held = specdec.SpeculativeModel(model)  # holds its wrapper; each call refreshes it
    with torch.no_grad():
        model.lm_head.weight.mul_(1.0)
    assert TargetModel.wrap(held.target).versions == before + 2


def test_the_engine_makes_its_attention_scope_once_per_setting():
    """The scope routing the forwards is made once per setting (making one walks every module); a setting that
    routes more (the linear layers through the split-K kernel) gets its own, and the greedy tokens stay HF's."""
    from specdec.backends import use
    from specdec.engine import Engine

    model = tiny_model("qwen3", num_hidden_layers=2)
    ids = torch.randint(4, 100, (1, 9), generator=torch.Generator().manual_seed(0))
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
    assert torch.equal(specdec.generate(model, ids, max_new_tokens=6).sequences, want)
    engine = Engine._engines[model][1]
    plain = engine.attention_scope(None)
    assert engine.attention_scope(None) is plain and not plain.linears
    with use({"linear_kernel": "triton"}):
        routed = engine.attention_scope(None)
        assert routed is not plain and routed.linears
        assert torch.equal(specdec.generate(model, ids, max_new_tokens=6).sequences, want)
    assert engine.attention_scope(None) is plain
    assert torch.equal(specdec.generate(model, ids, max_new_tokens=6).sequences, want)


def test_a_model_is_freed_once_its_user_drops_it():
    """The engines (static storage, rounds) and the wrapper of a model are kept on the model, not in a map keyed by
    it whose values point back at it (which kept every model passed to ``generate`` alive with its storage). A
    copy of a model does not share them and decodes as HF does."""
    import copy
    import gc
    import weakref

    model = tiny_model("qwen3", num_hidden_layers=2)
    ids = torch.randint(4, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    specdec.generate(model, ids, max_new_tokens=4, drafter=specdec.NGramDrafter(), tree=specdec.DDTree(budget=6))
    held = specdec.SpeculativeModel(model)
    held.generate(ids, max_new_tokens=4)
    twin = copy.deepcopy(model)
    want = twin.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4)
    assert torch.equal(specdec.generate(twin, ids, max_new_tokens=4).sequences, want)
    from specdec.engine import Engine

    assert Engine._engines[twin] is not Engine._engines[model]
    gone = weakref.ref(model)
    del model, held
    gc.collect()
    assert gone() is None


def test_weights_state_reads_the_tensors_torch_lists():
    """The weights' state (read on every call) holds each tensor ``Module.parameters()`` and ``buffers()`` list, once
    each (tied embeddings, a module held twice), with its address, dtype and device, and sums their update counters;
    a cast, a replaced parameter and an in-place update each change what it reads."""
    from specdec.target import weights_state

    for model in (tiny_model("qwen3"), tiny_model("gpt2"), tiny_hybrid("qwen3_next")):
        model.extra = torch.nn.ModuleList([model.get_input_embeddings()])  # one module reached twice
        tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
        signature, versions = weights_state([model, model.get_output_embeddings()])
        assert sorted(signature, key=str) == sorted(((t.data_ptr(), t.dtype, t.device) for t in tensors.values()),
                                                    key=str)  # fmt: skip
        assert versions == sum(t._version for t in tensors.values())
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        assert weights_state([model])[1] == versions + 1
        layer = model.get_output_embeddings()
        layer.weight = torch.nn.Parameter(layer.weight.detach().clone())  # replaced (and untied, if it was tied)
        replaced = weights_state([model])[0]
        assert replaced != signature and len(replaced) == len({id(t) for t in (*model.parameters(), *model.buffers())})
        assert weights_state([model.double()])[0] != replaced
