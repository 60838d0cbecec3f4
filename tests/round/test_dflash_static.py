"""The round's DFlash forwards (static context, block K/V written into the storage, grouped heads stacked along
the query axis, all layers' context projection in one product) against the drafter model's own
``project_context`` and the eager oracle's ``draft_logq`` (``oracles.dflash_eager``: dynamic caches, the model's
own forward), over the config variants the drafter supports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kernel_harness import route_gated_to_reference, run_code_interpreted
from models import tiny_model
from oracles.dflash_eager import DecodeContext, EagerDFlash

from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.dflash_model import DFlashDraftModel
from specdec.drafters.dflash_static import DFlashStatic

VARIANTS = {
    "plain": {},
    "causal": {"causal": True},
    "windows": {"sliding_windows": (None, 5)},
    "partial-rope-bias": {"partial_rotary_factor": 0.5, "attention_bias": True},
    "mha": {"num_key_value_heads": 4},
}


def drafter_for(target, variant: str) -> DFlashDrafter:
    base = DFlashDrafter.for_target(target, mask_token_id=3, num_layers=2, block_size=6, target_layer_ids=(0, 2))
    shape = {"num_attention_heads": 4, "num_key_value_heads": 2, **VARIANTS[variant]}
    cfg = dataclasses.replace(base.config, **shape)
    model = DFlashDraftModel(cfg)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 2 else 0.2) + (p.dim() == 1))
    return DFlashDrafter(model, target=target)


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen3", num_hidden_layers=4)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_static_forwards_equal_the_eager_drafter(target, variant):
    check_static_forwards(target, variant, "torch")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_static_forwards_through_the_attention_kernel_equal_the_eager_drafter(target, variant, monkeypatch):
    """The block's attention through ``tree_attention`` (what CUDA runs by default; its reference here: one mask
    row per block row, each sequence's length ``prefix + block``) against the eager oracle."""
    import specdec.kernels.tree_attention as ta
    from specdec import attention
    from specdec.drafters import dflash_static

    calls = []
    real = ta.tree_attention

    def spy(query, key, value, mask, scale, lengths=None, **kw):
        calls.append((mask.shape, None if lengths is None else lengths.tolist()))
        return real(query, key, value, mask, scale, lengths, **kw)

    monkeypatch.setattr(attention, "KERNEL", "triton")
    monkeypatch.setattr(dflash_static, "tree_attention", spy)
    check_static_forwards(target, variant, "torch")
    size = drafter_for(target, variant).config.block_size
    assert calls and all(n is not None and n[0] > size and mask[2] == size for mask, n in calls)


def test_static_forwards_with_the_gated_mlp_equal_the_eager_drafter(target, monkeypatch):
    """Where the round routes projection groups (CUDA), the block's MLPs take ``gated_linear`` over the halves of
    the stacked gate / up weight (its reference here): the same log-probabilities as the eager drafter."""
    calls = []
    route_gated_to_reference(monkeypatch, calls)
    check_static_forwards(target, "plain", "torch")
    assert calls and set(calls) == {"triton"}


def test_static_forwards_with_the_gated_kernel_in_the_interpreter():
    """The gated kernel itself (``Backends.grouped_linear="triton"``, run by Triton's interpreter in a subprocess)
    in the block's MLPs, against the eager oracle on two variants."""
    from kernel_harness import run_lines_interpreted

    run_lines_interpreted(
        "import torch",
        "from models import tiny_model",
        "from test_dflash_static import check_static_forwards",
        "import specdec.kernels.grouped_linear as package",
        "from specdec.kernels.grouped_linear import triton as kernels",
        "package.IMPL = 'triton'",
        "calls, real = [], kernels.gated_linear_triton",
        "kernels.gated_linear_triton = lambda *a, **k: calls.append(1) or real(*a, **k)",
        "target = tiny_model('qwen3', num_hidden_layers=4)",
        "with torch.no_grad():  # as the round runs (the kernel takes no autograd)",
        "    for variant in ('plain', 'partial-rope-bias'):",
        "        check_static_forwards(target, variant, 'torch')",
        "assert len(calls) > 0 and len(calls) % 2 == 0, len(calls)  # both layers of every block forward",
        folders=["round"],
    )


def test_static_forwards_with_the_triton_norms_in_the_interpreter():
    """``norm_impl="triton"`` (``specdec.kernels.rms_norm``) run by Triton's interpreter, in a subprocess (the
    interpreter must be chosen before Triton is imported), against the eager oracle on every variant."""
    pytest.importorskip("triton")
    tests = Path(__file__).resolve().parents[1]
    code = (
        "from models import tiny_model\n"
        "from test_dflash_static import VARIANTS, check_static_forwards\n"
        "target = tiny_model('qwen3', num_hidden_layers=4)\n"
        "for variant in VARIANTS:\n"
        "    check_static_forwards(target, variant, 'triton')\n"
    )
    run_code_interpreted(code, tests, tests / "round")


def test_block_rotary_through_the_kernel_in_the_interpreter():
    """Where the target's rotary embedding takes the kernel (``Backends.target_rotary``), the block's queries and
    keys are rotated by one ``specdec.kernels.rotary`` launch per layer (run by Triton's interpreter, in a
    subprocess): the block's log-probabilities equal the tensor-op rotation's bit for bit in bf16, on the full and
    the partial (half the head rotated, the rest passed on) rotary variants."""
    pytest.importorskip("triton")
    tests = Path(__file__).resolve().parents[1]
    code = (
        "import torch\n"
        "from models import tiny_model\n"
        "from test_dflash_static import block_logq_by_rotary\n"
        "target = tiny_model('qwen3', num_hidden_layers=4).to(torch.bfloat16)\n"
        "for variant, launches in (('plain', 4), ('causal', 4), ('partial-rope-bias', 4)):\n"
        "    (want, none), (got, calls) = (block_logq_by_rotary(target, variant, k) for k in ('torch', 'triton'))\n"
        "    assert none == 0 and calls == launches, (variant, none, calls)\n"
        "    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), variant\n"
    )
    run_code_interpreted(code, tests, tests / "round")


def block_logq_by_rotary(target, variant: str, kernel: str) -> tuple[tuple, int]:
    """((the context after two ingests, a block's ``logq``), rotary kernel launches) of a bf16 drafter with
    ``Backends.target_rotary = kernel``."""
    from specdec.drafters import dflash_static
    from specdec.kernels.rotary import routing

    drafter = drafter_for(target, variant).to(dtype=torch.bfloat16)
    cfg = drafter.config
    gen = torch.Generator().manual_seed(0)
    static = DFlashStatic(drafter, capacity=48, norm_impl="torch")
    hidden = torch.randn(1, 9, len(cfg.target_layer_ids) * cfg.context_size, generator=gen).to(torch.bfloat16)
    calls = []
    real, before = dflash_static.rotary, routing.KERNEL
    dflash_static.rotary = lambda *args, **kw: calls.append(1) or real(*args, **kw)
    routing.KERNEL = kernel
    try:
        static.ingest(hidden[:, :7], 0)
        static.ingest(hidden[:, 7:], torch.tensor([7]))
        logq = static.logq(torch.tensor([5]), torch.tensor([9]), cfg.block_size - 1)
    finally:
        dflash_static.rotary, routing.KERNEL = real, before
    return (static.kv[..., :9, :].clone(), logq), len(calls)


def check_static_forwards(target, variant: str, norm_impl: str, perturb: bool = False) -> None:
    """DFlashStatic's ingest and block forward against the eager oracle over a sequence of rounds. ``perturb``: the
    drafter's weights are changed in place after the storage was built (its stacked copies must follow)."""
    drafter = drafter_for(target, variant)
    cfg = drafter.config
    width = len(cfg.target_layer_ids) * cfg.context_size
    gen = torch.Generator().manual_seed(0)
    static = DFlashStatic(drafter, capacity=48, norm_impl=norm_impl)
    if perturb:
        with torch.no_grad():
            for layer in drafter.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                for module in (attn.q_proj, attn.k_proj, attn.v_proj, attn.q_norm, attn.k_norm, mlp.gate_proj,
                               mlp.up_proj):  # fmt: skip
                    module.weight.add_(torch.randn(module.weight.shape, generator=gen) * 0.5)
        static.sync_weights()
    static.kv.normal_(generator=gen)  # stale rows past the context must never be seen
    ids = torch.randint(4, 100, (1, 30), generator=gen)
    hidden = torch.randn(1, 29, width, generator=gen)
    oracle = EagerDFlash(drafter)
    committed = 9  # tokens whose features are in the context; the root sits at position `committed`
    oracle.prefill(DecodeContext(input_ids=ids[:, : committed + 1], target_hidden=hidden[:, :committed]))
    static.ingest(hidden[:, :committed], 0)
    while committed < 29:
        keys = drafter.model.project_context(hidden[:, :committed], torch.arange(committed)[None])
        for layer, (k, v) in enumerate(keys):
            torch.testing.assert_close(static.kv[layer, 0, :, :, :committed], k, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(static.kv[layer, 1, :, :, :committed], v, rtol=1e-5, atol=1e-5)
        ctx = DecodeContext(input_ids=ids[:, : committed + 1])
        want = oracle.draft_logq(ctx, depth=cfg.block_size - 1)
        got = static.logq(ids[0, committed].view(1), torch.tensor([committed]), cfg.block_size - 1)[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        span = committed + cfg.block_size + committed % 3  # attending over fewer slots changes nothing
        got = static.logq(ids[0, committed].view(1), torch.tensor([committed]), cfg.block_size - 1, span)[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        step = min(1 + committed % 5, 29 - committed)  # accepted path lengths 1..5
        rows = hidden[:, committed : committed + step]
        oracle.commit(DecodeContext(input_ids=ids[:, : committed + step + 1], target_hidden=rows))
        static.ingest(rows, torch.tensor(committed))
        committed += step


@pytest.mark.parametrize("variant", ["plain", "partial-rope-bias"])
def test_block_forward_follows_in_place_updates(target, variant):
    # the stacked q / k / v, gate / up and query / key norm weights of the block forward, refreshed in place
    check_static_forwards(target, variant, "torch", perturb=True)


def test_stacked_weights_follow_in_place_updates(target):
    drafter = drafter_for(target, "plain")
    static = DFlashStatic(drafter, capacity=32)
    hidden = torch.randn(1, 5, len(drafter.config.target_layer_ids) * drafter.config.context_size)
    with torch.no_grad():
        for proj in (drafter.model.layers[1].self_attn.k_proj, drafter.model.layers[1].self_attn.v_proj):
            proj.weight.add_(torch.randn_like(proj.weight))
    static.sync_weights()
    static.ingest(hidden, 0)
    k, v = drafter.model.project_context(hidden, torch.arange(5)[None])[1]
    torch.testing.assert_close(static.kv[1, 0, :, :, :5], k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static.kv[1, 1, :, :, :5], v, rtol=1e-5, atol=1e-5)
