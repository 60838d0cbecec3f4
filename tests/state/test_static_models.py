"""The static round (``specdec.state.storage.StaticModel``, ``cuda_graphs=True``: uncaptured on CPU) on the targets
it used not to run: sliding-window attention (masks that also hide the keys out of the window, over storage that
keeps every key) and hybrid layers that hold attention and a recurrent mixer in one decoder layer (FalconH1,
Zamba2). Each run must equal HF greedy decoding token for token, past the sliding window, with drafts accepted."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers as tf
from hybrid_harness import _COMMON as HYBRID_COMMON
from hybrid_harness import _SPECS as HYBRID_SPECS
from models import perturbed_copy, tiny_model
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask, sliding_window_overlay

import specdec
from specdec.state.hybrid import cache_kwarg
from specdec.state.storage import StaticModel, _StaticHybridLayer, static_reason
from specdec.state.windows import keep_every_key, window_layout
from specdec.target import TargetModel

PROMPT = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(1))
NEW = 40  # prompt + new tokens: 50 positions, over six times the window of 8
TREE = specdec.DDTree(budget=8, topk=3)

# name -> (arch, config overrides); every window is 8 positions (gemma3 default: 256, never reached here)
SLIDING = {
    "gemma2": ("gemma2", {"sliding_window": 8}),  # eager, soft-capping, sliding / full layers: a mask per type
    "gemma3": ("gemma3", {"sliding_window": 8}),  # every layer slides: one mask
    "gemma3_mixed": ("gemma3", {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}),
    "gemma3_256": ("gemma3", {}),
    "mistral": ("mistral", {"sliding_window": 8}),  # no layer types: every layer slides
    "qwen2": ("qwen2", {"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1}),  # sdpa, mixed
}


def _sliding(name: str):
    arch, overrides = SLIDING[name]
    return tiny_model(arch, scale=2.0, **overrides)


@pytest.fixture
def static_round():
    """A model drafter over ``model`` (sliding-window draft models run in the round as the targets do)."""

    def drafter(model) -> specdec.ModelDrafter:
        return specdec.ModelDrafter(model)

    return drafter


def _greedy(model, drafter, *, tree=TREE):
    return specdec.generate(model, PROMPT, drafter=drafter, tree=tree, max_new_tokens=NEW, cuda_graphs=True)


# -- sliding-window attention ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SLIDING))
def test_sliding_window_targets_match_hf_greedy(name, static_round):
    model = _sliding(name)
    target = TargetModel(model)
    assert static_reason(target) is None
    assert target.max_length == model.config.max_position_embeddings  # no longer capped by the window
    ref = model.generate(PROMPT, do_sample=False, max_new_tokens=NEW)
    out = _greedy(model, static_round(perturbed_copy(model, noise=0.05)))  # a sliding-window draft model too
    assert torch.equal(out.sequences, ref)
    assert out.stats.tau > 1.5  # drafts were accepted
    plain = _greedy(model, None)
    assert torch.equal(plain.sequences, ref)


# HF's mask functions take the cache as ``cache`` (5.24) or ``past_key_values`` (5.17)
_MASK_CACHE = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def _captured_masks(static: StaticModel, monkeypatch) -> list:
    seen = []
    inner = static.target.forward

    def forward(*args, attention_mask=None, **kwargs):
        seen.append(attention_mask)
        return inner(*args, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(static.target, "forward", forward)
    return seen


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
@torch.no_grad()
def test_static_prompt_masks_equal_hf_masks(name, monkeypatch):
    """A prompt forward over static slots gets HF's own masks (``masking_utils``), per layer type."""
    arch, overrides = SLIDING[name]
    model = tiny_model(arch, attn="eager", **{**overrides, "sliding_window": 4})
    static = StaticModel(TargetModel(model), 32)
    seen = _captured_masks(static, monkeypatch)
    n = PROMPT.shape[1]
    positions = torch.arange(n)
    static.forward(PROMPT[:, :n], positions[None], static.causal_mask(positions, span=n), positions, span=n)
    hf = {"config": model.config, "inputs_embeds": torch.zeros(1, n, 64), "attention_mask": None, _MASK_CACHE: None,
          "position_ids": positions[None]}  # fmt: skip
    sliding, full = create_sliding_window_causal_mask(**hf), create_causal_mask(**hf)
    assert not torch.equal(sliding, full)
    got = seen[0]
    if isinstance(got, dict):
        assert torch.equal(got["sliding_attention"], sliding) and torch.equal(got["full_attention"], full)
    else:
        assert torch.equal(got, sliding)


@torch.no_grad()
def test_static_tree_mask_hides_ancestors_out_of_the_window(monkeypatch):
    """Tree nodes sit at slot ``prefix + i`` but position ``prefix + depth``: the window counts positions, as HF's
    ``sliding_window_overlay`` over (query position, key position)."""
    window, prefix = 4, 12
    model = tiny_model("mistral", sliding_window=window)
    static = StaticModel(TargetModel(model), 32)
    seen = _captured_masks(static, monkeypatch)
    parents = [-1, 0, 0, 0, 3, 4, 5, 6]  # node 7 (depth 5) has node 3 (depth 1, slot 3) four positions up
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    n = len(parents)
    ancestor = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            ancestor[i] |= ancestor[p]
    slots = torch.arange(prefix + n)
    visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool), ancestor], dim=1)
    positions = prefix + torch.tensor(depth)
    write = prefix + torch.arange(n)
    static.forward(PROMPT[:, :n], positions[None], static.additive_mask(visible), write, span=prefix + n)
    key_positions = torch.cat([slots[:prefix], positions])
    overlay = sliding_window_overlay(window)(0, 0, positions[:, None], key_positions[None, :])
    expected = visible & overlay
    assert not bool(expected[7, prefix + 3]) and bool(visible[7, prefix + 3])  # by position, not by slot
    assert torch.equal(seen[0][0, 0] == 0, expected)


def test_decode_mask_over_a_cache_that_keeps_every_key_equals_hf():
    """The eager path: a ``DynamicCache`` whose sliding layers keep every key, the mask of a 3-token forward after
    9 cached tokens (``WindowLayout.masks``) equals HF's sliding mask over that cache."""
    model = tiny_model("mistral", sliding_window=4, attn="eager")
    cache = DynamicCache(config=model.config)
    keep_every_key(cache)
    assert all(type(layer) is DynamicLayer for layer in cache.layers)
    cache.update(torch.zeros(1, 2, 9, 16), torch.zeros(1, 2, 9, 16), 0)
    query = 9 + torch.arange(3)
    hf = {"config": model.config, "inputs_embeds": torch.zeros(1, 3, 64), "attention_mask": None, _MASK_CACHE: cache,
          "position_ids": query[None]}  # fmt: skip
    hf = create_sliding_window_causal_mask(**hf)
    full = torch.zeros(1, 1, 3, 12).masked_fill_(torch.arange(12)[None] > query[:, None], torch.finfo().min)
    ours = window_layout(model).masks(full, query, torch.arange(12))
    assert torch.equal(ours, hf)


@torch.no_grad()
def test_keep_every_key_refuses_a_layer_that_slid():
    model = tiny_model("mistral", sliding_window=4)
    cache = DynamicCache(config=model.config)
    model(input_ids=PROMPT, **{cache_kwarg(model): cache}, use_cache=True)  # 10 tokens: the sliding layers dropped some
    with pytest.raises(ValueError, match="slid past its window"):
        keep_every_key(cache)


def test_masks_specdec_cannot_build_keep_the_window_cap():
    model = tiny_model("gemma3", sliding_window=8, use_bidirectional_attention=True)
    target = TargetModel(model)
    assert "bidirectional" in static_reason(target)
    assert static_reason(TargetModel(tiny_model("llama"))) is None
    assert target.max_length == model.config.sliding_window
    with pytest.raises(ValueError, match="bidirectional"):
        StaticModel(target, 32)


# -- hybrid layers (attention + recurrent mixer in one decoder layer) -----------------------------------------------

# name -> (spec of hybrid_harness, overrides, weight scale). The scales keep the skip-path drafter's guesses right
# often enough for drafts to be accepted, with outputs that do not settle into one repeated token and that change
# when the recurrent state is not committed (FalconH1's mixer is weighted up for that).
HYBRIDS = {
    "falcon_h1": ("falcon_h1", {"ssm_out_multiplier": 8.0}, 0.5),
    "falcon_h1_rmsnorm": ("falcon_h1_rmsnorm", {}, 1.0),
    "zamba2": ("zamba2", {}, 1.2),
    # three hybrid layers over two shared attention blocks: K/V rows per decoder layer, not per block
    "zamba2_shared": (
        "zamba2",
        {"num_hidden_layers": 4, "layers_block_type": ["hybrid", "mamba", "hybrid", "hybrid"], "num_mem_blocks": 2},
        1.4,
    ),
}


def _hybrid(name: str):
    spec, overrides, scale = HYBRIDS[name]
    model_name, config_name, kwargs = HYBRID_SPECS[spec]
    torch.manual_seed(0)
    config = getattr(tf, config_name)(**HYBRID_COMMON, **{"num_hidden_layers": 3, **kwargs, **overrides})
    config._attn_implementation = "sdpa"
    model = getattr(tf, model_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model


def _skip_path_drafter(target):
    """An attention drafter that is the target's embedding -> final norm -> LM head path alone (its layers add
    nothing): a bigram guess of the target's next token."""
    inner = target.model
    draft = tiny_model("qwen3", rms_norm_eps=target.config.rms_norm_eps)
    with torch.no_grad():
        for layer in draft.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        draft.model.embed_tokens.weight.copy_(inner.embed_tokens.weight * getattr(inner, "embedding_multiplier", 1.0))
        draft.model.norm.weight.copy_(inner.final_layernorm.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight * getattr(inner, "lm_head_multiplier", 1.0))
    return draft


@pytest.mark.parametrize("prefill", ["model", "scan"])
@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_layer_targets_match_hf_greedy(name, prefill, static_round, monkeypatch):
    from specdec.state import hybrid as hybrid_state

    monkeypatch.setattr(hybrid_state, "PREFILL", prefill)  # the process setting (specdec.backends: hybrid_prefill)
    model = _hybrid(name)
    target = TargetModel(model)
    assert static_reason(target) is None
    static = StaticModel(target, 64)
    hybrid = [i for i, layer in static.recurrent.items() if isinstance(layer, _StaticHybridLayer)]
    assert hybrid and set(hybrid) <= set(static.attention_layers)
    assert {a.layer_idx for a in target.state.adapters} == set(static.recurrent)
    ref = model.generate(PROMPT, do_sample=False, max_new_tokens=NEW)
    plain = _greedy(model, None)  # no drafter: one token per round through the static tree verify
    assert torch.equal(plain.sequences, ref)
    out = _greedy(model, static_round(_skip_path_drafter(model)))
    assert torch.equal(out.sequences, ref)
    assert sum(out.stats.accept_hist[1:]) >= 3  # rounds that accepted drafts
