"""Grouped-query attention of the round (``specdec.attention``) against HF's own ``sdpa`` attention."""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import specdec
from specdec import attention
from specdec.attention import NAME, AttentionScope, grouped_sdpa
from specdec.kernels._triton import _IMPORTABLE

KERNEL_MODULE = "specdec.kernels.tree_attention.triton"  # what the kernel choice asks ``importable`` about


class _Module(torch.nn.Module):
    """What HF's sdpa function reads off an attention module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(heads, kv_heads, q_len, span, *, seed=0, bool_mask=False):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q_len, 16, generator=g)
    key = torch.randn(1, kv_heads, span, 16, generator=g)
    value = torch.randn(1, kv_heads, span, 16, generator=g)
    # a random visibility pattern (every row sees slot 0), as tree masks are
    seen = torch.rand(q_len, span, generator=g) < 0.6
    seen[:, 0] = True
    if bool_mask:
        return query, key, value, seen[None, None]
    mask = torch.zeros(q_len, span).masked_fill_(~seen, torch.finfo(torch.float32).min)[None, None]
    return query, key, value, mask


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (8, 2), (6, 3), (4, 1)])
@pytest.mark.parametrize("q_len", [1, 5, 64])
@pytest.mark.parametrize("bool_mask", [False, True])
def test_grouped_sdpa_equals_hf_sdpa(heads, kv_heads, q_len, bool_mask):
    query, key, value, mask = _inputs(heads, kv_heads, q_len, 96, seed=q_len + heads, bool_mask=bool_mask)
    module = _Module(heads // kv_heads)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.3)
    assert got.shape == want.shape == (1, q_len, heads, 16)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_grouped_sdpa_hands_what_it_does_not_cover_to_hf(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return sdpa_attention_forward(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", spy)
    query, key, value, mask = _inputs(4, 2, 3, 32)
    module = _Module(2)
    grouped_sdpa(module, query, key, value, mask)
    assert calls == []  # the grouped case runs its own SDPA call
    grouped_sdpa(module, query, key, value, None, is_causal=True)  # no mask: HF's causal path
    grouped_sdpa(module, query, key, value, mask.expand(1, 4, 3, 32))  # a per-head mask
    grouped_sdpa(module, query, key, value, mask, softcap=None, position_bias=torch.zeros(1, 4, 3, 32))
    grouped_sdpa(_Module(1), query, key[:, :1].expand(1, 4, 32, 16), value[:, :1].expand(1, 4, 32, 16), mask)  # MHA
    assert len(calls) == 4


def test_scope_switches_sdpa_configs_and_restores_them():
    model = tiny_model("qwen3")
    other = tiny_model("llama", attn="eager")
    assert model.config._attn_implementation == "sdpa"
    scope = AttentionScope(model, other, None)
    with scope:
        assert model.config._attn_implementation == NAME
        assert other.config._attn_implementation == "eager"  # only sdpa is switched
        with scope:  # re-entrant
            assert model.config._attn_implementation == NAME
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), scope:
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


def test_round_runs_grouped_attention_and_leaves_the_model_as_it_was(monkeypatch):
    model = tiny_model("qwen3", scale=4.0)
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    assert heads > kv_heads  # a grouped-query target, or this test proves nothing
    seen = []

    def spy(module, query, key, value, mask, **kwargs):
        seen.append((query.shape[2], key.shape[1]))
        return grouped_sdpa(module, query, key, value, mask, **kwargs)

    from transformers import AttentionInterface

    attention._register()
    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, spy)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False)
    out = specdec.generate(model, ids, max_new_tokens=12)
    assert out.stats.path == "eager"
    assert torch.equal(out.sequences, want)
    assert seen and all(k == kv_heads for _, k in seen)
    assert model.config._attn_implementation == "sdpa"


def test_grouped_for_follows_the_mode(monkeypatch):
    monkeypatch.setitem(_IMPORTABLE, KERNEL_MODULE, True)
    monkeypatch.setattr(attention, "KERNEL", "auto")
    monkeypatch.setattr(attention, "MODE", "auto")
    # uncompiled: always; compiled: only where the grouped case is the Triton kernel (CUDA), not SDPA (CPU)
    assert attention.grouped_for(False) and not attention.grouped_for(True)
    assert attention.grouped_for(False, "cuda") and attention.grouped_for(True, torch.device("cuda"))
    monkeypatch.setattr(attention, "KERNEL", "sdpa")
    assert attention.grouped_for(False, "cuda") and not attention.grouped_for(True, "cuda")
    monkeypatch.setattr(attention, "MODE", "1")
    assert attention.grouped_for(False) and attention.grouped_for(True)
    monkeypatch.setattr(attention, "MODE", "0")
    assert not attention.grouped_for(False) and not attention.grouped_for(True, "cuda")
    monkeypatch.setattr(attention, "MODE", "yes")
    with pytest.raises(ValueError, match="SPECDEC_GROUPED_ATTENTION='yes'"):
        attention.grouped_for(False)


@pytest.mark.parametrize("arch", ["qwen3", "gpt2"])
def test_compiled_rounds_group_only_where_the_kernel_fits_the_model(monkeypatch, arch):
    import specdec.engine as engine_module
    from specdec.engine import Engine
    from specdec.target import TargetModel

    monkeypatch.setitem(_IMPORTABLE, KERNEL_MODULE, True)
    monkeypatch.setattr(attention, "KERNEL", "auto")
    monkeypatch.setattr(attention, "MODE", "auto")
    asked = []
    monkeypatch.setattr(engine_module, "grouped_for", lambda *args: asked.append(args) or attention.grouped_for(*args))
    model = tiny_model(arch)
    engine = Engine.for_target(TargetModel.wrap(model), capacity=64)
    engine.attention_scope(None, compiled=True)
    # the engine asks with the dtype and head dim the model's own attention modules use
    block = model.model.layers[0].self_attn if arch == "qwen3" else model.transformer.h[0].attn
    assert asked == [(True, engine.device, model.dtype, block.head_dim)]
    assert attention.grouped_for(True, "cuda", model.dtype, block.head_dim)
    assert not attention.grouped_for(True, "cuda", torch.bfloat16, 80)  # a head dim the kernel refuses: HF's
    assert attention.grouped_for(False, "cuda", torch.bfloat16, 80)  # uncompiled: grouped SDPA still


def test_triton_kernel_for_follows_the_kernel_choice(monkeypatch):
    monkeypatch.setattr(attention, "KERNEL", "auto")
    monkeypatch.setitem(_IMPORTABLE, KERNEL_MODULE, True)
    assert attention.triton_kernel_for("cuda", True, torch.bfloat16, 128)
    assert attention.triton_kernel_for(torch.device("cuda", 0), True)  # dtype / head dim unknown yet
    assert attention.triton_kernel_for("cuda", False, torch.bfloat16, 128)  # uncompiled too
    assert not attention.triton_kernel_for("cpu", True, torch.bfloat16, 128)  # off CUDA: SDPA, not the reference
    assert not attention.triton_kernel_for("cuda", True, torch.float64, 128)  # dtypes and head dims it refuses
    assert not attention.triton_kernel_for("cuda", True, torch.bfloat16, 80)
    monkeypatch.setitem(_IMPORTABLE, KERNEL_MODULE, False)
    assert not attention.triton_kernel_for("cuda", True, torch.bfloat16, 128)
    monkeypatch.setattr(attention, "KERNEL", "triton")
    assert attention.triton_kernel_for("cpu", False, torch.float64, 80)  # forced: tree_attention picks its impl
    monkeypatch.setattr(attention, "KERNEL", "sdpa")
    assert not attention.triton_kernel_for("cuda", True, torch.bfloat16, 128)
    monkeypatch.setattr(attention, "KERNEL", "flash")
    with pytest.raises(ValueError, match="SPECDEC_ATTENTION_KERNEL='flash'"):
        attention.triton_kernel_for("cuda", True)


def test_scope_that_does_not_group_leaves_the_model_alone():
    model = tiny_model("qwen3")
    with AttentionScope(model, grouped=False):
        assert model.config._attn_implementation == "sdpa"


def test_engine_groups_uncompiled_rounds_only_by_default(monkeypatch):
    from specdec.engine import Engine
    from specdec.target import TargetModel

    monkeypatch.setattr(attention, "MODE", "auto")
    model = tiny_model("qwen3")
    engine = Engine.for_target(TargetModel.wrap(model), capacity=64)
    greedy, sampling = specdec.Greedy(), specdec.SamplingParams()
    eager = engine.round_for(None, None, greedy, sampling, graph=False)
    compiled = engine.round_for(None, None, greedy, sampling, graph=False, compile=True)  # not run
    assert [id(c) for c in eager.captured.scope.configs] == [id(model.config)]
    assert compiled.captured.scope.configs == []


@pytest.mark.parametrize("q_len", [1, 7])
def test_triton_kernel_choice_calls_tree_attention_and_equals_hf(monkeypatch, q_len):
    """``SPECDEC_ATTENTION_KERNEL=triton``: the grouped case goes to ``tree_attention`` (its reference on CPU; the
    kernel itself is checked in ``tests/kernels/test_tree_attention.py``)."""
    import specdec.kernels.tree_attention as ta

    calls = []
    real = ta.tree_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(ta, "tree_attention", spy)
    query, key, value, mask = _inputs(8, 2, q_len, 40, seed=3)
    module = _Module(4)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    for kernel, called in (("auto", []), ("sdpa", []), ("triton", [query.shape])):  # auto: SDPA off CUDA
        calls.clear()
        monkeypatch.setattr(attention, "KERNEL", kernel)
        got, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.25)
        assert calls == called, kernel
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_round_with_the_triton_kernel_choice_equals_hf_greedy(monkeypatch):
    monkeypatch.setattr(attention, "KERNEL", "triton")
    model = tiny_model("llama", scale=4.0)
    ids = torch.tensor([[5, 9, 2, 77, 31, 8]])
    want = model.generate(ids, max_new_tokens=10, do_sample=False)
    out = specdec.generate(model, ids, max_new_tokens=10)
    assert out.stats.path == "eager" and torch.equal(out.sequences, want)


# --- each sequence's readable length (KV_LENGTHS) ------------------------------------------------------------------

LENGTH_TARGETS = ["qwen3", "llama", "gemma3", "phi3", "qwen3_5", "falcon_h1"]


def _length_target(name: str):
    if name in ("qwen3_5", "falcon_h1"):
        from state.hybrid_harness import tiny_hybrid

        return tiny_hybrid(name)
    return tiny_model(name, scale=4.0)


@pytest.mark.parametrize("name", LENGTH_TARGETS)
def test_round_hands_each_sequences_length_to_every_attention_call(monkeypatch, name):
    """With the kernel forced (its reference on CPU, which hides every slot at or past a sequence's length and
    never uses its K / V), every attention call of the prefill, the AR step and the DDTree round gets the lengths,
    they bound what the round wrote, and the tokens equal HF's greedy ones for a ragged batch."""
    import specdec.kernels.tree_attention as ta

    monkeypatch.setattr(attention, "KERNEL", "triton")
    monkeypatch.setattr(attention, "MODE", "1")
    model = _length_target(name)
    calls = []
    real = ta.tree_attention

    def spy(query, key, value, mask, scale, lengths=None, **kw):
        calls.append((query.shape[0], query.shape[2], key.shape[2], None if lengths is None else lengths.tolist()))
        return real(query, key, value, mask, scale, lengths, **kw)

    monkeypatch.setattr(ta, "tree_attention", spy)
    prompts = [[5, 9, 2, 77, 31, 8, 40, 41, 42, 17, 3], [12, 13, 99]]
    for tree in (None, specdec.DDTree(budget=6, topk=2)):
        calls.clear()
        hybrid = name in ("qwen3_5", "falcon_h1")
        drafter = None if tree is None else specdec.NGramDrafter() if hybrid else specdec.ModelDrafter(
            perturbed_copy(model, noise=0.05))  # fmt: skip
        wants = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            wants.append(model.generate(ids, max_new_tokens=14, do_sample=False)[0])
            out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=14)
            assert torch.equal(out.sequences[0], wants[-1]), (name, tree, prompt)
        width = max(map(len, prompts))  # the same prompts as one left-padded batch: each row as alone
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        seen = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = specdec.generate(model, ids, attention_mask=seen, drafter=drafter, tree=tree, max_new_tokens=14)
        for b, prompt in enumerate(prompts):
            assert torch.equal(out.sequences[b, width - len(prompt) :], wants[b]), (name, tree, b)
        assert calls and all(c[3] is not None for c in calls), (name, calls[:3])
        # a forward of Q rows over a span of S: each length counts at least the Q rows it wrote, at most S
        assert all(all(c[1] <= n <= c[2] for n in c[3]) for c in calls)
        assert max(n for c in calls for n in c[3]) >= len(prompts[0]) + 14 - 1  # the last step read the whole text


def test_a_length_one_short_changes_the_tokens(monkeypatch):
    """The planted bug: lengths one short hide each forward's last row (the newest token) from every query."""
    import specdec.state.storage as storage

    monkeypatch.setattr(attention, "KERNEL", "triton")
    monkeypatch.setattr(attention, "MODE", "1")
    model = tiny_model("qwen3", scale=4.0)
    ids = torch.tensor([[5, 9, 2, 77, 31, 8]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(specdec.generate(model, ids, max_new_tokens=12).sequences, want)
    real = storage.StaticModel.forward

    def short(self, *args, **kwargs):
        orig = self.target.forward

        def forward(*a, kv_lengths=None, **kw):
            return orig(*a, kv_lengths=None if kv_lengths is None else kv_lengths - 1, **kw)

        self.target.forward = forward
        try:
            return real(self, *args, **kwargs)
        finally:
            del self.target.forward

    monkeypatch.setattr(storage.StaticModel, "forward", short)
    assert not torch.equal(specdec.generate(model, ids, max_new_tokens=12).sequences, want)


def test_long_prompt_chunks_go_to_sdpa_and_short_forwards_to_the_kernel(monkeypatch):
    import specdec.kernels.tree_attention as ta

    calls = []
    monkeypatch.setattr(ta, "tree_attention", lambda q, *a, **k: calls.append(q.shape[2]) or q.transpose(1, 2))
    monkeypatch.setattr(attention, "KERNEL", "triton")
    module = _Module(4)
    for q_len in (1, attention.MAX_KERNEL_QUERIES, attention.MAX_KERNEL_QUERIES + 1):
        query, key, value, mask = _inputs(8, 2, q_len, 300, seed=q_len)
        grouped_sdpa(module, query, key, value, mask, scaling=0.25)
    assert calls == [1, attention.MAX_KERNEL_QUERIES]
