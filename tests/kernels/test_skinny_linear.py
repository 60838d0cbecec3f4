"""``skinny_linear``: the split-K Triton linear layer (interpreter on CPU, compiled on GPU) and the torch reference,
both against a float64 brute force written here (``x @ W^T + b`` of the very inputs, i.e. after their rounding to
bf16 / fp16).

The interpreted comparisons run in one subprocess with ``TRITON_INTERPRET=1`` (it must be set before Triton is
imported and must not leak into the rest of the suite): this file, run as a script, reads the cases the tests
wrote, runs the Triton version with ``torch.empty`` NaN-poisoned (an output element or a workspace partial never
written shows up) and saves the outputs for the tests here to compare. Most inputs are views of longer NaN-filled
buffers (``x[:, :K]``, ``weight[:N, :K]``), so a read past ``K`` or ``N`` shows up as NaN.

Tolerances (against the float64 brute force; |y| <~ 60 for these N(0, 1) inputs with K <= 333):

- fp32: rtol 1e-5, atol 1e-4. Products and sums in fp32 (IEEE dots, no TF32): errors of a few fp32 ulps of the
  partial sums, ~1e-5 at most here.
- bf16 / fp16: rtol 2**-7 (bf16) / 2**-9 (fp16), atol 1e-3, and a mean absolute error at most twice the
  reference's plus 1e-4 (a systematic error would pass the bound element by element). The fp32 sum, a little off
  the exact one, may round to the other neighbour: one ulp, at most 2**-7 (bf16) / 2**-10 (fp16) relative.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import check_replays, interpreted_outputs, poison_empty

from specdec.kernels.skinny_linear import _check_args, skinny_linear, skinny_linear_reference

HALF = (torch.bfloat16, torch.float16)
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


# --- cases -------------------------------------------------------------------------------------------------------


def make_case(seed, rows, k, n, dtype, *, bias=True, x_layout="2d", w_layout="contig", sms=None, block_k=None,
              device="cpu"):  # fmt: skip
    """One case. ``x_layout``: ``"2d"`` ``[M, K]``, ``"3d"`` ``[1, M, K]``, ``"sliced"`` ``[M, K]`` view of a
    ``[M, K + 5]`` buffer; ``w_layout``: ``"contig"``, ``"sliced"`` (``[N, K]`` view of a NaN-padded ``[N + 3,
    K + 7]`` buffer), ``"transposed"`` (``.t()`` of a ``[K, N]`` buffer). ``sms`` / ``block_k``: the plan's SM count
    and ``K`` tile (``None``: the wrapper's defaults, ``impl="triton"`` through the public function). ``device``:
    where the case is drawn and kept (the 8 B shapes on the GPU: a 151936-row weight drawn in float64 on the host
    took a minute)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, dtype=torch.float64, device=device).to(dtype)
    if x_layout == "sliced":
        x_base = torch.full((rows, k + 5), float("nan"), dtype=dtype, device=device)
        x_base[:, :k] = x
    else:
        x_base = x[None] if x_layout == "3d" else x
    w = torch.randn(n, k, generator=gen, dtype=torch.float64, device=device).to(dtype)
    if w_layout == "sliced":
        w_base = torch.full((n + 3, k + 7), float("nan"), dtype=dtype, device=device)
        w_base[:n, :k] = w
    else:
        w_base = w.t().contiguous() if w_layout == "transposed" else w
    b = torch.randn(n, generator=gen, dtype=torch.float64, device=device).to(dtype) if bias else None
    return dict(x_base=x_base, w_base=w_base, bias=b, rows=rows, k=k, n=n, x_layout=x_layout, w_layout=w_layout,
                sms=sms, block_k=block_k,
                info=(rows, k, n, str(dtype), bias, x_layout, w_layout, sms, block_k))  # fmt: skip


def case_args(case: dict, device: str | None = None) -> tuple:
    """``(x [..., K], weight [N, K], bias [N] or None)`` as views of the case's buffers, on ``device`` (None: where
    the case is)."""
    k, n = case["k"], case["n"]
    device = case["x_base"].device if device is None else device
    x = case["x_base"].to(device)
    x = x[:, :k] if case["x_layout"] == "sliced" else x
    w = case["w_base"].to(device)
    w = w.t() if case["w_layout"] == "transposed" else w[:n, :k]
    b = None if case["bias"] is None else case["bias"].to(device)
    return x, w, b


def cases() -> list[dict]:
    """32 small cases: M in {1, 3, 16, 17, 64} (padded row blocks of 16 / 32 / 64), K and N off the tile sizes
    (K 200 / 333, N 70 / 130) and on them (K 256, N 64 / 128), fp32 / bf16 / fp16, with and without bias, x as
    ``[M, K]``, ``[1, M, K]`` and a strided slice, the weight contiguous, a strided slice and transposed; plans
    with many splits of one tile, splits of several tiles with a short last split, and one split (the output
    written by the first kernel)."""
    specs = [
        # (rows, K, N, dtype, bias, x_layout, w_layout, sms, block_k)
        (1, 200, 70, FP32, True, "2d", "contig", None, None),
        (3, 333, 130, BF16, False, "3d", "sliced", None, None),
        (16, 256, 64, FP16, True, "sliced", "contig", None, None),
        (17, 333, 70, FP32, False, "2d", "transposed", None, None),
        (64, 200, 130, BF16, True, "3d", "contig", None, None),
        (1, 333, 130, FP16, False, "2d", "sliced", None, None),
        (3, 256, 128, BF16, True, "sliced", "transposed", None, None),
        (17, 200, 64, BF16, True, "3d", "sliced", None, None),
        # many splits of one 16-wide tile, the last tile partial
        (1, 333, 70, BF16, True, "2d", "sliced", 132, 16),
        (3, 200, 130, FP32, True, "3d", "contig", 132, 16),
        (16, 333, 130, FP16, False, "2d", "transposed", 132, 16),
        (17, 200, 70, BF16, False, "sliced", "sliced", 132, 16),
        (64, 333, 64, FP32, True, "2d", "sliced", 132, 16),
        (64, 256, 70, BF16, True, "3d", "contig", 132, 32),
        # splits of several tiles, a shorter last split
        (1, 333, 130, BF16, True, "2d", "contig", 4, 32),
        (3, 333, 70, FP16, True, "sliced", "sliced", 4, 32),
        (16, 333, 70, FP32, False, "3d", "contig", 4, 32),
        (17, 333, 130, BF16, True, "2d", "transposed", 4, 32),
        (64, 333, 70, FP16, False, "2d", "contig", 4, 32),
        (16, 200, 64, BF16, True, "sliced", "sliced", 2, 16),
        # one split: the first kernel writes the output (and adds the bias)
        (1, 200, 70, BF16, True, "2d", "sliced", 1, None),
        (3, 333, 130, FP32, True, "3d", "contig", 1, None),
        (16, 200, 130, FP16, True, "2d", "transposed", 1, 32),
        (17, 333, 70, BF16, False, "sliced", "contig", 1, 32),
        (64, 200, 64, BF16, True, "2d", "sliced", 1, None),
        (64, 333, 130, FP32, False, "3d", "sliced", 1, 16),
        # BLOCK_N 128 (the columns alone fill the "GPU") and K shorter than a tile
        (3, 200, 300, BF16, True, "2d", "sliced", 1, None),
        (16, 40, 70, FP32, True, "2d", "contig", None, None),
        (1, 5, 130, BF16, True, "3d", "sliced", None, None),
        (17, 13, 64, FP16, False, "2d", "contig", 132, 16),
        (16, 1, 70, BF16, True, "2d", "transposed", None, None),
        (64, 16, 130, FP32, True, "sliced", "contig", 132, None),
    ]
    return [make_case(i, *spec[:4], bias=spec[4], x_layout=spec[5], w_layout=spec[6], sms=spec[7], block_k=spec[8])
            for i, spec in enumerate(specs)]  # fmt: skip


def plan_of(case: dict) -> dict:
    """The launch plan the interpreter run uses for ``case`` (no SM count given: the wrapper's interpreter one)."""
    from specdec.kernels.skinny_linear.triton import _INTERPRETER_SMS, split_plan

    x, w, _ = case_args(case)
    return split_plan(case["rows"], case["n"], case["k"], case["sms"] or _INTERPRETER_SMS, itemsize=x.element_size(),
                      block_k=case["block_k"])  # fmt: skip


# --- oracles and comparisons --------------------------------------------------------------------------------------


def dense_args(args: tuple) -> tuple:
    """The same values in contiguous tensors. torch's CPU ``F.linear`` (2.13, oneDNN on CPUs with AMX) reads past a
    bf16 view of a NaN-padded buffer when both x and the weight are strided views, so it returns NaN rows there;
    the reference's own rounding error is measured on these copies."""
    x, weight, bias = args
    return x.contiguous(), weight.contiguous(), bias


def brute64(x, weight, bias) -> torch.Tensor:
    """``[..., N]`` float64: one dot product per output element, in float64 (on ``x``'s device)."""
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


def _tolerance(dtype: torch.dtype) -> dict:
    if dtype == BF16:
        return dict(rtol=2**-7, atol=1e-3)
    if dtype == FP16:
        return dict(rtol=2**-9, atol=1e-3)
    return dict(rtol=1e-5, atol=1e-4)


def check_kernel(case: dict, got: torch.Tensor) -> None:
    """``got`` has the reference's shape and dtype, no NaN, within the dtype's tolerance of the float64 brute force;
    with half inputs a mean error at most twice the reference's plus 1e-4."""
    args = case_args(case)
    x = args[0]
    want = brute64(*args)
    assert got.shape == (*x.shape[:-1], case["n"]) and got.dtype == x.dtype, case["info"]
    got = got.to(want.device).double()
    assert not got.isnan().any(), case["info"]
    torch.testing.assert_close(got, want, **_tolerance(x.dtype), msg=lambda m: f"{case['info']}: {m}")
    if x.dtype in HALF:
        ref = float((skinny_linear_reference(*dense_args(args)).double() - want).abs().mean())
        assert float((got - want).abs().mean()) <= 2 * ref + 1e-4, case["info"]


# --- tests on CPU -------------------------------------------------------------------------------------------------


def test_cases_cover_what_matters():
    cs = cases()
    info = [c["info"] for c in cs]
    assert {i[0] for i in info} == {1, 3, 16, 17, 64}
    assert {i[1] for i in info} >= {200, 333, 256} and {i[2] for i in info} >= {70, 130, 64, 128}
    assert {(i[3], i[4]) for i in info} == {(str(d), b) for d in (FP32, BF16, FP16) for b in (True, False)}
    assert {i[5] for i in info} == {"2d", "3d", "sliced"} and {i[6] for i in info} == {"contig", "sliced", "transposed"}
    plans = [plan_of(c) for c in cs]
    # several splits with the last K tile partial; splits of several tiles with a short last one; one split
    assert sum(p["SPLIT_K"] >= 3 and c["k"] % p["BLOCK_K"] != 0 for c, p in zip(cs, plans, strict=True)) >= 8
    assert sum(p["SPLIT_K"] > 1 and p["TILES"] > 1 and p["k_tiles"] % p["TILES"] != 0 for p in plans) >= 4
    assert sum(p["SPLIT_K"] == 1 for p in plans) >= 8 and sum(p["SPLIT_K"] > 1 for p in plans) >= 16
    assert {p["BLOCK_M"] for p in plans} == {16, 32, 64} and {p["BLOCK_N"] for p in plans} == {64, 128}
    assert sum(c["n"] % p["BLOCK_N"] != 0 for c, p in zip(cs, plans, strict=True)) >= 10
    for fmt in (FP32, BF16, FP16):  # each dtype both split and not
        assert {p["SPLIT_K"] > 1 for c, p in zip(cs, plans, strict=True) if c["x_base"].dtype == fmt} == {True, False}


def test_split_plan_fills_the_gpu_at_the_8b_shapes():
    from specdec.kernels.skinny_linear.triton import split_plan

    sms = 132
    for rows in (1, 16, 32, 64):
        for k, n in ((4096, 6144), (4096, 4096), (4096, 12288), (4096, 24576), (12288, 4096), (4096, 1024),
                     (4096, 151936)):  # fmt: skip
            p = split_plan(rows, n, k, sms)
            span = p["TILES"] * p["BLOCK_K"]
            # the splits cover K exactly once, each a whole number of K tiles, none empty
            assert p["k_tiles"] * p["BLOCK_K"] >= k > (p["k_tiles"] - 1) * p["BLOCK_K"], (rows, k, n, p)
            assert p["SPLIT_K"] == -(-p["k_tiles"] // p["TILES"]) and (p["SPLIT_K"] - 1) * span < k, (rows, k, n, p)
            assert p["programs"] == p["n_blocks"] * p["SPLIT_K"] and p["n_blocks"] * p["BLOCK_N"] >= n
            assert p["BLOCK_M"] == max(16, 1 << (rows - 1).bit_length()) and p["BLOCK_K"] >= 16
            assert (p["SPLIT_K"] == 1) == (p["n_blocks"] >= 2 * sms), (rows, k, n, p)
            assert p["programs"] <= 5 * sms or p["SPLIT_K"] == 1, (rows, k, n, p)
            if k >= 4096 and n >= 4096:
                assert p["programs"] >= 2 * sms, (rows, k, n, p)
            stage = (p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * 2 * p["STAGES"]
            assert stage <= 200 * 1024, (rows, k, n, p)  # an H200 has 227 KiB of shared memory per SM
    p = split_plan(32, 4096, 12288, sms)
    assert p["SPLIT_K"] > 1 and p["programs"] >= 2 * sms and p["SPLIT_K"] * p["TILES"] * p["BLOCK_K"] >= 12288
    assert split_plan(1, 151936, 4096, sms)["SPLIT_K"] == 1  # the lm_head: columns enough
    with pytest.raises(ValueError, match=r"0 <= M <= 64 rows; got 65"):
        split_plan(65, 4096, 4096, sms)
    with pytest.raises(ValueError, match=r"block_k=24: pass a power of two >= 16"):
        split_plan(1, 64, 64, sms, block_k=24)


def test_reference_is_f_linear_and_matches_float64_brute_force():
    for case in cases():
        args = case_args(case)
        got, linear = skinny_linear_reference(*args), torch.nn.functional.linear(*args)
        if args[0].dtype == BF16 and (got.isnan().any() or linear.isnan().any()):  # torch's bug: see dense_args
            args = dense_args(args)
            got, linear = skinny_linear_reference(*args), torch.nn.functional.linear(*args)
        assert torch.equal(got, linear), case["info"]
        half = args[0].dtype in HALF
        torch.testing.assert_close(got.double(), brute64(*args), rtol=2**-8 if half else 1e-5,
                                   atol=1e-6 if half else 1e-4)  # fmt: skip


def test_check_catches_a_dropped_k_tile_and_a_missing_bias():
    # The comparisons see the last 16 features of K left out, or the bias not added (planted-bug checks, kept).
    case = next(c for c in cases() if c["info"][:4] == (64, 200, 130, str(BF16)))
    x, w, b = case_args(case)
    with pytest.raises(AssertionError):
        check_kernel(case, skinny_linear_reference(x[..., :-16], w[:, :-16], b))
    with pytest.raises(AssertionError):
        check_kernel(case, skinny_linear_reference(x, w))


def test_torch_impl_and_cpu_auto_are_the_reference():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    for case in cases()[::3]:
        args = case_args(case)
        want = skinny_linear_reference(*args)
        assert torch.equal(skinny_linear(*args, impl="torch"), want), case["info"]
        assert torch.equal(skinny_linear(*args), want), case["info"]
    x, w = torch.randn(130, 40, dtype=torch.float64), torch.randn(7, 40, dtype=torch.float64)
    assert torch.equal(skinny_linear(x, w), torch.nn.functional.linear(x, w))  # fp64 with M > 64: the reference
    with pytest.raises(ValueError, match="GPU"):
        skinny_linear(*case_args(cases()[0]), impl="triton")


def test_bad_arguments_are_refused():
    x, w, b = torch.randn(3, 40), torch.randn(7, 40), torch.randn(7)
    with pytest.raises(ValueError, match=r"x must be a \[\.\.\., K\] tensor .*got torch.int64 \[3, 40\]"):
        skinny_linear(x.long(), w)
    with pytest.raises(ValueError, match=r"x must be a .*got torch.float32 \[\]"):
        skinny_linear(torch.tensor(1.0), w)
    with pytest.raises(ValueError, match=r"x must be a .*got list"):
        skinny_linear([1.0] * 40, w)
    with pytest.raises(ValueError, match=r"weight must be a 2-d \[N, K\] tensor .*got torch.float32 \[1, 7, 40\]"):
        skinny_linear(x, w[None])
    with pytest.raises(ValueError, match=r"weight must be a 2-d .*got torch.float32 \[40\]"):
        skinny_linear(x, w[0])
    with pytest.raises(ValueError, match=r"weight must be a 2-d .*got torch.int32 \[7, 40\]"):
        skinny_linear(x, w.int())
    with pytest.raises(ValueError, match=r"weight is torch.bfloat16, x torch.float32: convert"):
        skinny_linear(x, w.bfloat16())
    with pytest.raises(ValueError, match=r"x has K = 40 .*weight \[N, K\] = \[40, 7\] takes K = 7.*not transposed"):
        skinny_linear(x, w.t())
    with pytest.raises(ValueError, match=r"weight is on meta, x on cpu: move them to one device"):
        skinny_linear(x, w.to("meta"))
    with pytest.raises(ValueError, match=r"bias must be None or a 1-d \[N\] = \[7\] tensor; got torch.float32 \[6\]"):
        skinny_linear(x, w, b[:6])
    with pytest.raises(
        ValueError, match=r"bias must be None or a 1-d \[N\] = \[7\] tensor; got torch.float32 \[1, 7\]"
    ):
        skinny_linear(x, w, b[None])
    with pytest.raises(ValueError, match=r"bias must be .*got float"):
        skinny_linear(x, w, 0.5)
    with pytest.raises(ValueError, match=r"bias is torch.float16, x torch.float32: convert it to x's dtype"):
        skinny_linear(x, w, b.half())
    with pytest.raises(ValueError, match=r"bias is on meta, x on cpu: move them to one device"):
        skinny_linear(x, w, b.to("meta"))
    with pytest.raises(ValueError, match=r"impl='triton' takes float32, bfloat16, float16; got torch.float64: use"):
        _check_args(x.double(), w.double(), None, "triton")
    with pytest.raises(ValueError, match=r"at most M = 64 rows .*got M = 65 from x \[5, 13, 40\]: use impl='torch'"):
        _check_args(torch.randn(5, 13, 40), w, b, "triton")
    with pytest.raises(ValueError, match=r"impl='cublas': choose 'auto', 'torch' or 'triton'"):
        skinny_linear(x, w, b, impl="cublas")
    _check_args(torch.randn(2, 32, 40), w, b, "triton")  # fits: no error
    _check_args(x.bfloat16(), w.bfloat16().t().contiguous().t(), b.bfloat16(), "triton")  # any strides: no error


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("skinny_linear"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_matches_float64_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check_kernel(case, got)


@pytest.mark.interpreter
def test_interpreted_is_deterministic(interpreted):
    for case, got, again in zip(interpreted["cases"], interpreted["outputs"], interpreted["again"], strict=True):
        assert torch.equal(got, again), case["info"]


@pytest.mark.interpreter
def test_interpreted_auto_dispatch_fallbacks_and_edges(interpreted):
    # under TRITON_INTERPRET=1 "auto" runs Triton, except for what the kernel does not take (fp64, M > 64)
    assert interpreted["auto_impl"] == "triton"
    check_kernel(interpreted["cases"][0], interpreted["auto"])
    assert interpreted["fallback_calls"] == 0
    assert interpreted["empty_m"].shape == (0, 7) and interpreted["empty_n"].shape == (2, 3, 0)
    assert torch.equal(interpreted["empty_k"], interpreted["empty_k_bias"].expand(3, 5))  # K = 0: the bias
    x, w = interpreted["vector_args"]
    assert interpreted["vector"].shape == (9,)
    torch.testing.assert_close(interpreted["vector"].double(), brute64(x, w, None), rtol=1e-5, atol=1e-4)


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved cases through the interpreter, saved beside them."""
    from unittest import mock

    import specdec.kernels.skinny_linear as package
    from specdec.kernels.skinny_linear import triton as kernels

    def run(case: dict) -> torch.Tensor:
        x, w, b = case_args(case)
        if case["sms"] is None and case["block_k"] is None:
            return skinny_linear(x, w, b, impl="triton")
        out = kernels.skinny_linear_triton(x.reshape(-1, case["k"]), w, b, sms=case["sms"], block_k=case["block_k"])
        return out.view(*x.shape[:-1], case["n"])

    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [run(c) for c in data["cases"]], "again": [run(c) for c in data["cases"]]}
    with mock.patch.object(kernels, "skinny_linear_triton", side_effect=kernels.skinny_linear_triton) as spy:
        out["auto"] = skinny_linear(*case_args(data["cases"][0]))
        out["auto_impl"] = "triton" if spy.call_count else "torch"
        spy.reset_mock()
        skinny_linear(torch.randn(3, 40, dtype=torch.float64), torch.randn(7, 40, dtype=torch.float64))
        skinny_linear(torch.randn(5, 13, 40), torch.randn(7, 40))
        out["fallback_calls"] = spy.call_count
    out["empty_m"] = skinny_linear(torch.randn(0, 40), torch.randn(7, 40), impl="triton")
    out["empty_n"] = skinny_linear(torch.randn(2, 3, 40), torch.randn(0, 40), impl="triton")
    out["empty_k_bias"] = torch.randn(5)
    out["empty_k"] = skinny_linear(torch.randn(3, 0), torch.randn(5, 0), out["empty_k_bias"], impl="triton")
    out["vector_args"] = (torch.randn(40), torch.randn(9, 40))
    out["vector"] = skinny_linear(*out["vector_args"], impl="triton")
    assert package._triton_available()
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------

SHAPES_8B = [(4096, 4096), (4096, 12288), (12288, 4096), (4096, 1024)]  # (K, N)


def cuda_case(seed: int, rows: int, k: int, n: int, *, bias: bool = False, x_layout: str = "3d") -> dict:
    return make_case(seed, rows, k, n, BF16, bias=bias, x_layout=x_layout, device="cuda")


@pytest.mark.gpu
def test_compiled_matches_float64_brute_force_on_cuda():
    # each row count and each Qwen3-8B shape once (a shape is a Triton compile; the small cases below cover the rest)
    for i, (rows, (k, n)) in enumerate(zip((1, 16, 32, 64), SHAPES_8B, strict=True)):
        case = cuda_case(i, rows, k, n, bias=i % 2 == 1, x_layout=("2d", "3d")[i % 2])
        args = case_args(case, "cuda")
        got = skinny_linear(*args, impl="triton")
        check_kernel(case, got)
        check_kernel(case, skinny_linear(*args))  # "auto" is Triton on CUDA
        assert torch.equal(got, skinny_linear(*args, impl="triton")), case["info"]  # deterministic
    for case in cases():  # the small cases too, fp32 / fp16 and strided operands, with the device's plan
        check_kernel(case, skinny_linear(*case_args(case, "cuda"), impl="triton"))


@pytest.mark.gpu
def test_kernel_inside_torch_compile_matches_float64_brute_force():
    # without a bias too (a Qwen3 layer's linears): its placeholder argument once aliased the output
    for i, (rows, (k, n)) in enumerate([(1, (4096, 4096)), (32, (12288, 4096)), (64, (4096, 1024))]):
        case = cuda_case(100 + i, rows, k, n, bias=i != 1)
        args = case_args(case, "cuda")
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, w, b: skinny_linear(x, w, b, impl="triton") * 1)
        check_kernel(case, compiled(*args))
    case = make_case(7, 32, 4096, 4096, FP32)  # fp32: IEEE dots inside the compiled graph (with the case's bias)
    torch._dynamo.reset()
    check_kernel(case, torch.compile(lambda x, w, b: skinny_linear(x, w, b, impl="triton"))(*case_args(case, "cuda")))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k, n", [(32, 12288, 4096), (1, 4096, 151936)])
def test_compiled_kernel_replays_in_a_cuda_graph(rows, k, n):
    # One capture (split-K, and one split at the lm_head shape), then new inputs copied in before each replay.
    cs = [cuda_case(200 + i, rows, k, n, bias=True) for i in range(3)]

    def check(case, got):
        check_kernel(case, got)
        torch.testing.assert_close(got, skinny_linear_reference(*case_args(case, "cuda")), rtol=2**-7, atol=1e-2)

    bases = ("x_base", "w_base", "bias")
    check_replays(cs, bases, lambda static: skinny_linear(*case_args(static, "cuda"), impl="triton"), check)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
