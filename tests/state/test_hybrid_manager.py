"""``manager_for``: the right manager per model, clear errors for recurrent layers without an exact adapter."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from hybrid_harness import VOCAB, prefill, random_tree, tiny_hybrid, tree_forward
from oracles.eager_state import eager_manager_for

from specdec.state import SUPPORTED_MIXERS, HybridState, KVState, manager_for


def _tiny(cls, config_cls, **kwargs):
    torch.manual_seed(0)
    base = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2)
    return cls(config_cls(**base, **kwargs)).eval()


def test_attention_only_model_gets_kv_state():
    model = _tiny(
        tf.LlamaForCausalLM, tf.LlamaConfig, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
    )
    assert isinstance(manager_for(model), KVState)
    assert isinstance(manager_for(model, hybrid_mode="snapshot"), KVState)


@pytest.mark.parametrize(
    ("build", "layer_class"),
    [
        (
            lambda: _tiny(
                tf.JambaForCausalLM,
                tf.JambaConfig,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=128,
                mamba_d_state=8,
                attn_layer_period=2,
                attn_layer_offset=1,
                expert_layer_period=100,
                num_experts=1,
            ),
            "JambaMambaMixer",
        ),
        (lambda: _tiny(tf.MambaForCausalLM, tf.MambaConfig, state_size=8), "MambaMixer"),
        (
            lambda: _tiny(
                tf.Lfm2ForCausalLM,
                tf.Lfm2Config,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=128,
                layer_types=["conv", "full_attention"],
            ),
            "Lfm2ShortConv",
        ),
    ],
    ids=["jamba-mamba1", "mamba1", "lfm2-shortconv"],
)
def test_unsupported_recurrent_layers_raise(build, layer_class):
    with pytest.raises(ValueError, match=layer_class) as info:
        manager_for(build())
    assert "Qwen3_5GatedDeltaNet" in str(info.value)  # the message lists what is supported


def test_subclassed_mixer_is_not_adapted_silently():
    model = tiny_hybrid("qwen3_5")
    mixer = model.model.layers[0].linear_attn
    mixer.__class__ = type("MyDeltaNet", (type(mixer),), {})
    with pytest.raises(ValueError, match="MyDeltaNet"):
        manager_for(model)


def test_stateful_model_without_known_mixer_raises():
    class Opaque(torch.nn.Module):
        _is_stateful = True

    with pytest.raises(ValueError, match="_is_stateful"):
        manager_for(Opaque())


def test_unknown_hybrid_mode_raises():
    with pytest.raises(ValueError, match="hybrid_mode"):
        manager_for(tiny_hybrid("mamba2"), hybrid_mode="approximate")


def test_supported_mixers_are_listed():
    assert {
        "Qwen3_5GatedDeltaNet",
        "Qwen3NextGatedDeltaNet",
        "Mamba2Mixer",
        "FalconH1Mixer",
        "BambaMixer",
        "NemotronHMamba2Mixer",
        "Zamba2MambaMixer",
    } <= set(SUPPORTED_MIXERS)


def test_forward_without_the_scope_cache_is_refused():
    model = tiny_hybrid("qwen3_5")
    manager = eager_manager_for(model)
    assert isinstance(manager, HybridState)
    cache = prefill(model, torch.arange(8)[None])
    tree = random_tree(torch.Generator().manual_seed(0), 4, "random")
    with pytest.raises(ValueError, match="did not receive the cache"), manager.verify_scope(model, cache, tree, 8):
        tree_forward(model, prefill(model, torch.arange(8)[None]), tree, 8)  # a different cache object
    manager.rollback(cache, 8)


def test_snapshot_mode_detects_a_forward_that_ignored_the_cache():
    model = tiny_hybrid("mamba2")
    manager = eager_manager_for(model, hybrid_mode="snapshot")
    cache = prefill(model, torch.arange(8)[None])
    tree = random_tree(torch.Generator().manual_seed(0), 4, "chain")
    with (
        pytest.raises(ValueError, match="did not receive the cache"),
        manager.verify_scope(model, cache, tree, 8),
        torch.no_grad(),
    ):
        model(input_ids=tree.tokens[None], past_key_values=cache)  # wrong kwarg name: silently swallowed
    manager.rollback(cache, 8)
