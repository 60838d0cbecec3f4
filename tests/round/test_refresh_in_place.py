"""A drafter's state is reused by the next call on the same engine, and its captured rounds read the state's tensors
by address. ``refresh()`` (run before every reuse) must therefore update tensors in place: a tensor replaced by a new
one leaves a captured graph reading freed memory, which on CUDA gave EAGLE-3 drafts of garbage ids and, once the
memory was reused, an out-of-bounds ``index_copy_``. The CPU cannot capture, so the invariant is checked directly:
the address of every tensor a state holds is the same after ``refresh()``, and what changed in the drafter (EAGLE-3's
``d2t``, DFlash's weights in place) is in those same tensors.
"""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from test_batch import model_drafter
from test_round import sharp_drafter

import specdec
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.drafters.mtp import MTPDrafter
from specdec.target import TargetModel


def _tensors(state) -> dict[str, torch.Tensor]:
    """Every tensor the state holds: its attributes, and the entries of its tuple / list / dict attributes."""
    found = {}
    for name, value in vars(state).items():
        if isinstance(value, dict):
            items = value.items()
        else:
            items = enumerate(value) if isinstance(value, (list, tuple)) else [("", value)]
        for key, item in items:
            label = f"{name}[{key}]" if key != "" else name
            if isinstance(item, torch.Tensor):
                found[label] = item
            elif isinstance(item, tuple):  # e.g. (weight, bias) pairs
                found.update({f"{label}[{i}]": t for i, t in enumerate(item) if isinstance(t, torch.Tensor)})
    return found


DRAFTERS = {
    "dflash": sharp_drafter,
    "eagle3": lambda t: Eagle3Drafter.for_target(t, layer_ids=(2, 1, 3), seed=1),
    "mtp": lambda t: MTPDrafter.random(t, seed=1, std=0.3),
    "model": model_drafter,
    "ngram": lambda t: specdec.NGramDrafter(),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_refresh_keeps_every_tensor_in_place(name):
    model = tiny_model("qwen3", num_hidden_layers=4, scale=2.0)
    drafter = DRAFTERS[name](model)
    state = drafter.attach(TargetModel(model), 32)
    before = {key: t.data_ptr() for key, t in _tensors(state).items()}
    assert before, "the state holds no tensors: the check would pass vacuously"
    state.refresh()
    after = {key: t.data_ptr() for key, t in _tensors(state).items()}
    assert after == before


def test_eagle3_refresh_takes_a_changed_d2t_into_the_same_tensor():
    model = tiny_model("qwen3", num_hidden_layers=4, scale=2.0)
    drafter = Eagle3Drafter.for_target(model, layer_ids=(2, 1, 3), seed=1, draft_vocab_size=64)
    state = drafter.attach(TargetModel(model), 32)
    held = state.target_ids
    with torch.no_grad():
        drafter.model.d2t.add_(1)  # every draft id now maps one target id further
    state.refresh()
    assert state.target_ids is held
    expected = torch.arange(drafter.model.d2t.shape[0]) + drafter.model.d2t  # d + d2t[d], the published rule
    assert torch.equal(state.target_ids, expected)


def test_dflash_refresh_takes_weights_changed_in_place_into_the_same_tensors():
    model = tiny_model("qwen3", num_hidden_layers=4, scale=2.0)
    drafter = sharp_drafter(model)
    state = drafter.attach(TargetModel(model), 32)
    held = _tensors(state)
    k_proj = drafter.model.layers[0].self_attn.k_proj.weight
    with torch.no_grad():
        k_proj.mul_(2.0)
    state.refresh()
    assert all(_tensors(state)[key] is t for key, t in held.items())
    stacked = state._weight[: k_proj.shape[0]]
    assert torch.equal(stacked, k_proj.detach())


def test_eagle3_refresh_takes_weights_changed_in_place_into_the_stacked_projections():
    """The head's q/k/v and gate/up projections run as two stacked products: a copy of those weights, which must
    follow the module's own weights when they change (a training step, ``load_state_dict``) and stay put otherwise."""
    model = tiny_model("qwen3", num_hidden_layers=4, scale=2.0)
    drafter = Eagle3Drafter.for_target(model, layer_ids=(2, 1, 3), seed=1)
    state = drafter.attach(TargetModel(model), 32)
    held = _tensors(state)
    attn, mlp = drafter.model.midlayer.self_attn, drafter.model.midlayer.mlp
    with torch.no_grad():
        attn.v_proj.weight.mul_(2.0)
    drafter.model.load_state_dict({**drafter.model.state_dict(), "midlayer.mlp.up_proj.weight": -mlp.up_proj.weight})
    state.refresh()
    assert all(_tensors(state)[key] is t for key, t in held.items())
    for name, linears in (("qkv", (attn.q_proj, attn.k_proj, attn.v_proj)), ("gate_up", (mlp.gate_proj, mlp.up_proj))):
        rows = state.packed[name][0].split([m.weight.shape[0] for m in linears])
        for got, linear in zip(rows, linears, strict=True):
            assert torch.equal(got, linear.weight.detach()), name
