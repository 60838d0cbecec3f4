"""``grouped_linear`` / ``gated_linear``: several products of one input in one launch, and a gated MLP's input side
with its activation, (interpreter on CPU, compiled on GPU) against float64 brute forces written here; and their
routing of a model's projection groups, token for token against HF ``generate``.

Oracles: ``x @ W_i^T + b_i`` in float64 of the very inputs (after their rounding to bf16 / fp16) for each weight;
for the gated form ``silu(g) * u`` in float64 of the float64 products ``g``, ``u``. Tolerances as
``test_skinny_linear.py``'s (fp32 rtol 1e-5 / atol 1e-4; bf16 rtol 2**-7, fp16 2**-9, atol 1e-3); the gated form
has three roundings (each product, the SiLU, the result), bounded relative to ``(|g| + 1) * |u|``, and in half
precision at least 97 % of its elements equal to those roundings applied to the exact products (``check_gated``:
the fp32 sum may round a product to the other neighbour where it lies within its error of a tie).

The interpreted comparisons run in one subprocess with ``TRITON_INTERPRET=1`` (``kernel_harness``): this file, run
as a script, reads the cases, runs the kernels with ``torch.empty`` NaN-poisoned (an output element or a workspace
partial never written shows up as NaN) and saves the outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import interpreted_outputs, poison_empty

from specdec.kernels.grouped_linear import gated_linear, grouped_linear
from specdec.kernels.grouped_linear.triton import group_plan

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# (rows, K, widths, dtype, bias, sms, block_k): the weights' N off and on the 64 / 128 column blocks, one to four
# weights, K split into many tiles, a few, or none, a partial last K tile
SPECS = [
    (1, 200, (70, 30, 130), FP32, True, 132, 32),
    (3, 333, (64, 64, 128), BF16, False, 132, 16),
    (17, 256, (130,), FP16, True, 4, 32),
    (1, 333, (70, 1, 5, 64), BF16, True, 1, None),
    (16, 200, (128, 40), FP32, False, 132, None),
    (64, 333, (70, 30, 30), BF16, True, 8, 32),
    (5, 40, (300, 300), BF16, False, 1, None),
    (33, 333, (16, 130, 70), FP16, False, 132, 16),
]


def make_case(seed: int, rows, k, widths, dtype, bias, sms, block_k, *, device="cpu") -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, dtype=torch.float64, device=device).to(dtype)
    ws = [torch.randn(n, k, generator=gen, dtype=torch.float64, device=device).to(dtype) for n in widths]
    bs = [torch.randn(n, generator=gen, dtype=torch.float64, device=device).to(dtype) for n in widths] if bias else None
    return dict(x=x, ws=ws, bs=bs, sms=sms, block_k=block_k, info=(rows, k, widths, str(dtype), bias, sms, block_k))


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def gated_args(case: dict) -> tuple:
    """The gated call of a case: its input, its first weight as the gate and that weight reversed as the up
    projection (one shape), with the biases likewise."""
    w = case["ws"][0]
    b = None if case["bs"] is None else case["bs"][0]
    return case["x"], w, w.flip(0), b, None if b is None else b.flip(0)


def _tolerance(dtype) -> dict:
    if dtype == BF16:
        return dict(rtol=2**-7, atol=1e-3)
    if dtype == FP16:
        return dict(rtol=2**-9, atol=1e-3)
    return dict(rtol=1e-5, atol=1e-4)


def brute_grouped(x, ws, bs) -> list[torch.Tensor]:
    return [x.double() @ w.double().T + (0 if bs is None else bs[i].double()) for i, w in enumerate(ws)]


def sums_error(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An allowance for the fp32 sums of ``x @ w^T``: ``sqrt(K) * 2**-21`` times the sum of the products' magnitudes
    (order-dependent, not relative to the result: a sum near zero by cancellation keeps it; it covers sums
    truncated at every step, as a GPU's matrix units may add)."""
    return x.shape[-1] ** 0.5 * 2**-21 * (x.double().abs() @ w.double().abs().T)


def brute_gated(x, wg, wu, bg, bu) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(g) * u`` in float64, and the bound of its error: ``eps * (|g| + 1) * |u|`` for the roundings (a
    product's rounding error is relative to it, and the SiLU's slope is at most 1.1), plus the fp32 sums' error
    (``sums_error``) carried through the other factor: ``|silu(g)|`` times ``u``'s, ``1.1 * |u|`` times ``g``'s.
    ``eps`` is 2**-6 for bf16 (three roundings of 2**-8 each), 2**-8 for fp16, 1e-5 for fp32."""
    g = x.double() @ wg.double().T + (0 if bg is None else bg.double())
    u = x.double() @ wu.double().T + (0 if bu is None else bu.double())
    eps = {BF16: 2**-6, FP16: 2**-8}.get(x.dtype, 1e-5)
    silu = g / (1 + torch.exp(-g))
    return silu * u, eps * (g.abs() + 1) * u.abs() + silu.abs() * sums_error(x, wu) + 1.1 * u.abs() * sums_error(x, wg)


def check_grouped(case: dict, got: list[torch.Tensor]) -> None:
    """Each product within ``_tolerance`` of the float64 brute force, the fp32 sums' allowance added to ``atol``."""
    want = brute_grouped(case["x"], case["ws"], case["bs"])
    assert len(got) == len(want), case["info"]
    for g, w, weight in zip(got, want, case["ws"], strict=True):
        assert g.dtype == case["x"].dtype and g.shape == w.shape and g.is_contiguous(), case["info"]
        assert not g.isnan().any(), case["info"]
        tol = _tolerance(g.dtype)
        bound = tol["atol"] + tol["rtol"] * w.cpu().abs() + sums_error(case["x"].cpu(), weight.cpu())
        excess = (g.cpu().double() - w.cpu()).abs() - bound
        assert float(excess.max()) <= 0, (case["info"], float(excess.max()))


def rounded_gated(x, wg, wu, bg, bu) -> torch.Tensor:
    """The layer's own arithmetic on exact products: each float64 product rounded to ``x``'s dtype, the SiLU in fp32
    rounded once, the product in fp32 rounded once."""
    g = (x.double() @ wg.double().T + (0 if bg is None else bg.double())).to(x.dtype)
    u = (x.double() @ wu.double().T + (0 if bu is None else bu.double())).to(x.dtype)
    return (F.silu(g.float()).to(x.dtype).float() * u.float()).to(x.dtype)


def check_gated(case: dict, got: torch.Tensor) -> None:
    """Element by element within ``bound + 1e-3`` of the float64 brute force (``brute_gated``'s error bound)."""
    want, bound = (t.cpu() for t in brute_gated(*gated_args(case)))
    assert got.dtype == case["x"].dtype and got.shape == want.shape and not got.isnan().any(), case["info"]
    excess = (got.cpu().double() - want).abs() - (bound + 1e-3)
    assert float(excess.max()) <= 0, (case["info"], float(excess.max()))
    if got.dtype != FP32:  # each product rounded before the SiLU: equal to the layer's arithmetic but near a tie
        same = got.cpu() == rounded_gated(*(t.cpu() if t is not None else None for t in gated_args(case)))
        assert float(same.float().mean()) >= 0.97, (case["info"], float(same.float().mean()))


# --- CPU ----------------------------------------------------------------------------------------------------------


def test_cases_cover_the_plans():
    plans = [group_plan(c["x"].shape[0], [w.shape[0] for w in c["ws"]], c["x"].shape[1], c["sms"],
                        itemsize=c["x"].element_size(), block_k=c["block_k"]) for c in cases()]  # fmt: skip
    assert {p["SPLIT_K"] > 1 for p in plans} == {True, False}
    assert sum(p["SPLIT_K"] > 2 for p in plans) >= 3 and {p["BLOCK_N"] for p in plans} == {64, 128}
    assert {len(c["ws"]) for c in cases()} == {1, 2, 3, 4} and {p["BLOCK_M"] for p in plans} == {16, 32, 64}
    gated = [group_plan(c["x"].shape[0], [c["ws"][0].shape[0]], c["x"].shape[1], c["sms"], tiles_per_block=2,
                        itemsize=c["x"].element_size(), block_k=c["block_k"]) for c in cases()]  # fmt: skip
    assert {p["SPLIT_K"] > 1 for p in gated} == {True, False}


def test_plan_at_the_8b_shapes():
    for rows in (1, 32, 64):
        qkv = group_plan(rows, [4096, 1024, 1024], 4096, 132)  # 96 blocks: not split, K in tiles of 256
        assert qkv["starts"] == [0, 64, 80, 96] and qkv["SPLIT_K"] == 1 and qkv["BLOCK_K"] == 256
        wide = group_plan(rows, [4096], 12288, 132)  # down_proj's shape: 64 blocks, split
        assert wide["SPLIT_K"] > 1 and wide["programs"] >= 2 * 132
        gate = group_plan(rows, [12288], 4096, 132, tiles_per_block=2)
        assert gate["programs"] * 2 >= 2 * 132 and gate["SPLIT_K"] * gate["TILES"] * gate["BLOCK_K"] >= 4096
        stage = (gate["BLOCK_M"] + 2 * gate["BLOCK_N"]) * gate["BLOCK_K"] * 2 * gate["STAGES"]
        assert stage <= 200 * 1024
    with pytest.raises(ValueError, match="1 to 4 weights; got 5"):
        group_plan(1, [8] * 5, 16, 132)


def test_references_match_the_brute_forces_and_the_layers():
    for case in cases():
        x, ws, bs = case["x"], case["ws"], case["bs"]
        got = grouped_linear(x, ws, bs)  # CPU "auto": the reference
        for g, w, b in zip(got, ws, bs or [None] * len(ws), strict=True):
            assert torch.equal(g, F.linear(x, w, b)), case["info"]
        check_grouped(case, got)
        gated = gated_linear(*gated_args(case))
        x, wg, wu, bg, bu = gated_args(case)
        assert torch.equal(gated, F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu)), case["info"]
        check_gated(case, gated)


def test_the_checks_catch_a_swapped_weight_and_a_missing_rounding():
    # planted-bug checks of the comparisons themselves (kept)
    case = next(c for c in cases() if len(c["ws"]) == 3 and c["x"].dtype == BF16)
    x, ws, bs = case["x"], case["ws"], case["bs"]
    with pytest.raises(AssertionError):
        check_grouped(case, grouped_linear(x, [ws[0], ws[2], ws[1]], bs and [bs[0], bs[2], bs[1]]))
    x, wg, wu, bg, bu = gated_args(case)
    with pytest.raises(AssertionError):
        check_gated(case, F.silu(F.linear(x, wu, bu)) * F.linear(x, wg, bg))


def test_bad_arguments_are_refused():
    x, w = torch.randn(3, 40), torch.randn(7, 40)
    with pytest.raises(ValueError, match="1 to 4 weights; got 0"):
        grouped_linear(x, [])
    with pytest.raises(ValueError, match=r"weight 1 must be a 2-d \[N, K = 40\] tensor .*got torch.float32 \[7, 39\]"):
        grouped_linear(x, [w, w[:, :39]])
    with pytest.raises(ValueError, match="weight 0 is torch.float64 on cpu, x torch.float32"):
        grouped_linear(x, [w.double()])
    with pytest.raises(ValueError, match=r"biases \[True, False\]: give a bias for every weight or for none"):
        grouped_linear(x, [w, w], [torch.randn(7), None])
    with pytest.raises(ValueError, match="1 biases for 2 weights"):
        grouped_linear(x, [w, w], [torch.randn(7)])
    with pytest.raises(ValueError, match=r"bias 0 must be a \[7\] tensor"):
        grouped_linear(x, [w], [torch.randn(6)])
    with pytest.raises(ValueError, match="impl='cublas'"):
        grouped_linear(x, [w], impl="cublas")
    with pytest.raises(ValueError, match="at most 64 rows.*got x torch.float32 \\[65, 40\\]"):
        grouped_linear(torch.randn(65, 40), [w], impl="triton")
    with pytest.raises(ValueError, match=r"w_gate \[7, 40\] and w_up \[8, 40\] must have one shape"):
        gated_linear(x, w, torch.randn(8, 40))
    with pytest.raises(ValueError, match="x must be a float"):
        gated_linear(x.long(), w, w)


# --- routing: a model's groups, token for token against HF --------------------------------------------------------


def test_groups_found_in_dense_and_hybrid_layers():
    import transformers

    from specdec.kernels.grouped_linear.routing import projection_groups

    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    groups = projection_groups(model)
    assert [[type(m).__name__ for m in g.layers] for g in groups] == [["Linear"] * 3] * 2
    assert groups[0].layers[1] is model.model.layers[0].self_attn.k_proj
    model.model.layers[1].self_attn.v_proj.bias = torch.nn.Parameter(torch.zeros(16))  # a bias on one member only
    assert len(projection_groups(model)) == 1


def test_a_member_called_with_another_input_computes_its_own(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # take the group's path on the CPU (the reference under it below)
    from specdec.kernels.grouped_linear import routing

    layers = [torch.nn.Linear(16, n, bias=False) for n in (8, 4, 4)]
    group = routing.ProjectionGroup(layers)
    calls = []

    def fake(x, weights, biases, impl):  # the reference, counted
        calls.append(x)
        return [F.linear(x, w) for w in weights]

    monkeypatch.setattr("specdec.kernels.grouped_linear.grouped_linear", fake)
    x, y = torch.randn(2, 16), torch.randn(2, 16)
    with torch.no_grad():
        q = group.forward(0, x)
        k = group.forward(1, x)  # from q's launch
        assert len(calls) == 1 and torch.equal(k, F.linear(x, layers[1].weight))
        v = group.forward(2, y)  # another input: a launch of its own
        assert len(calls) == 2 and torch.equal(v, F.linear(y, layers[2].weight))
        assert torch.equal(q, F.linear(x, layers[0].weight))
        group.forward(0, y)  # from v's launch
        assert len(calls) == 2
        y.add_(1.0)  # changed in place since: a new launch
        k2 = group.forward(1, y)
        assert len(calls) == 3 and torch.equal(k2, F.linear(y, layers[1].weight))
        group.forward(1, y)
        assert len(calls) == 4  # k consumed: a second k call with the same input is a new launch
    offloaded = routing.ProjectionGroup([layers[0], torch.nn.Linear(16, 4, bias=False, device="meta"), layers[2]])
    with torch.no_grad():  # a member's weights elsewhere (offloaded): each member computes its own product
        q = offloaded.forward(0, x)
        assert len(calls) == 4 and torch.equal(q, F.linear(x, layers[0].weight))
    with torch.inference_mode():  # inference tensors keep no version counter: matched by identity
        z = torch.randn(2, 16)
        group.forward(0, z)
        v = group.forward(2, z)
        assert len(calls) == 5 and torch.equal(v, F.linear(z, layers[2].weight))


# --- Triton through the interpreter -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("grouped_linear"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_grouped_matches_float64_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["grouped"], strict=True):
        check_grouped(case, got)


@pytest.mark.interpreter
def test_interpreted_gated_matches_float64_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["gated"], strict=True):
        check_gated(case, got)


@pytest.mark.interpreter
def test_interpreted_routing_is_token_identical_to_hf(interpreted):
    # dense (Llama, Qwen3) and hybrid (Qwen3.5, Qwen3-Next: their linear-attention layers' input projections)
    assert set(interpreted["models"]) == {"qwen3", "llama", "qwen3_5", "qwen3_next"}
    for name, (got, want, counts, groups) in interpreted["models"].items():
        assert torch.equal(got, want), name
        assert counts["grouped"] > 0 and counts["gated"] > 0, (name, counts)
        want_groups = {"qwen3": [3, 3], "llama": [3, 3], "qwen3_next": [2, 3, 2], "qwen3_5": [4, 3, 4]}[name]
        assert groups == want_groups, (name, groups)


@pytest.mark.interpreter
def test_interpreted_routing_on_every_architecture(interpreted):
    # every tiny architecture of the suite, dense and hybrid: token-identical to HF with the groups routed; each
    # module holding q_proj / k_proj / v_proj layers (or a Gated DeltaNet layer's input projections) forms a group
    from models import ARCHS
    from state.hybrid_harness import FAMILIES

    assert set(interpreted["architectures"]) == {*ARCHS, "gpt2", *FAMILIES}
    for name, (equal, counts, groups, named) in interpreted["architectures"].items():
        assert equal, name
        assert groups == named, (name, groups, named)
        assert (counts["grouped"] > 0) == (named > 0), (name, counts)
    assert sum(named > 0 for *_, named in interpreted["architectures"].values()) >= 15


def _named_groups(model) -> int:
    """Modules of ``model`` whose children include every layer of one of ``routing.GROUPS``' name sets."""
    from specdec.kernels.grouped_linear.routing import GROUPS

    return sum(any(all(isinstance(getattr(m, n, None), torch.nn.Linear) for n in names) for names in GROUPS)
               for m in model.modules())  # fmt: skip


def _routed_generate(model, rows: int, length: int, new: int) -> tuple:
    """``rows`` random prompts of ``length`` tokens decoded by HF's greedy ``generate`` and by ``specdec.generate``
    with the groups routed: (HF's sequences, specdec's, the kernels' call counts)."""
    from unittest import mock

    import specdec
    from specdec.kernels.grouped_linear import triton as kernels

    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, length))
    mask = torch.ones_like(ids)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    counts = {"grouped": 0, "gated": 0}

    def counted(name: str, launch):
        def call(*a, **k):
            counts[name] += 1
            return launch(*a, **k)

        return call

    patch = mock.patch.object
    with patch(kernels, "grouped_linear_triton", counted("grouped", kernels.grouped_linear_triton)), \
            patch(kernels, "gated_linear_triton", counted("gated", kernels.gated_linear_triton)):  # fmt: skip
        got = specdec.generate(model, ids, attention_mask=mask, max_new_tokens=new, drafter=specdec.NGramDrafter(),
                               backends={"grouped_linear": "triton"})  # fmt: skip
    return want, got.sequences if hasattr(got, "sequences") else got, counts


def _every_architecture() -> dict:
    """Each tiny architecture of the suite, one sequence of 8 tokens and 8 new ones through ``specdec.generate``
    with the groups routed: (equal to HF's greedy, the kernels' call counts, groups found, groups by name)."""
    from models import ARCHS, tiny_model
    from state.hybrid_harness import FAMILIES, tiny_hybrid

    from specdec.kernels.grouped_linear.routing import projection_groups

    out = {}
    for name in [*ARCHS, "gpt2", *FAMILIES]:
        model = tiny_model(name) if name in ARCHS or name == "gpt2" else tiny_hybrid(name)
        want, got, counts = _routed_generate(model, 1, 8, 8)
        out[name] = (bool(torch.equal(got, want)), counts, len(projection_groups(model)), _named_groups(model))
    return out


def _generate_models() -> dict:
    """Tiny Qwen3, Llama, Qwen3.5 and Qwen3-Next (hybrid) models, two sequences each, decoded by
    ``specdec.generate`` with the projection groups routed, each beside HF's greedy ``generate``, the kernels' call
    counts and the groups' sizes."""
    from models import tiny_model
    from state.hybrid_harness import tiny_hybrid

    from specdec.kernels.grouped_linear.routing import projection_groups

    out = {}
    builds = {"qwen3": lambda: tiny_model("qwen3"), "llama": lambda: tiny_model("llama"),
              "qwen3_5": lambda: tiny_hybrid("qwen3_5"), "qwen3_next": lambda: tiny_hybrid("qwen3_next")}  # fmt: skip
    for name, build in builds.items():
        model = build()
        want, got, counts = _routed_generate(model, 2, 9, 12)
        out[name] = (got, want, counts, [len(g.layers) for g in projection_groups(model)])
    return out


def _run_interpreted(folder: Path) -> None:
    from specdec.kernels.grouped_linear import triton as kernels

    data = torch.load(folder / "cases.pt")
    out = {"models": _generate_models(), "architectures": _every_architecture()}
    poison_empty()
    out["grouped"] = [kernels.grouped_linear_triton(c["x"], c["ws"], c["bs"], sms=c["sms"], block_k=c["block_k"])
                      for c in data["cases"]]  # fmt: skip
    out["gated"] = [kernels.gated_linear_triton(*gated_args(c), sms=c["sms"], block_k=c["block_k"])
                    for c in data["cases"]]  # fmt: skip
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_compiled_matches_float64_brute_force_on_cuda():
    for case in cases():
        dev = dict(case)
        dev["x"] = case["x"].cuda()
        dev["ws"] = [w.cuda() for w in case["ws"]]
        dev["bs"] = None if case["bs"] is None else [b.cuda() for b in case["bs"]]
        check_grouped(case, grouped_linear(dev["x"], dev["ws"], dev["bs"], impl="triton"))
        check_gated(case, gated_linear(*gated_args(dev), impl="triton"))
    for rows in (1, 32):  # the Qwen3-8B shapes with the device's plan
        case = make_case(9, rows, 4096, (4096, 1024, 1024), BF16, False, None, None, device="cuda")
        check_grouped(case, grouped_linear(case["x"], case["ws"], impl="triton"))
        gate = make_case(10, rows, 4096, (12288,), BF16, False, None, None, device="cuda")
        check_gated(gate, gated_linear(*gated_args(gate), impl="triton"))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
