"""``rms_norm``: the Triton RMSNorm (interpreter on CPU, compiled on GPU) vs the reference, the reference vs the
drafter's own ``_RMSNorm`` module (bitwise), and both vs a float64 oracle.

The interpreted comparisons run in one subprocess with ``TRITON_INTERPRET=1`` (it must be set before Triton is
imported and must not leak into the rest of the suite): this file, run as a script, reads the cases the tests
wrote, runs the Triton version with ``torch.empty`` NaN-poisoned (an output element never written shows up) and
saves the outputs for the tests here to compare.

Agreement with the reference (the fp32 sum of squares is added in another order): with fp32 / fp64 ``x`` the
outputs are within rtol 2e-6, atol 1e-6. With bf16 / fp16 ``x`` the normalised value is rounded to x's dtype
before the weight multiply, so a tiny fp32 difference can move it to the neighbouring value near a rounding
midpoint (and a half output then by up to 2 ulps, not 1): every element must equal the reference or that product
with the other neighbour of the exact ``x / rms``, and at least 99.5 % must be equal. (Compiled on an H200 the
GPU's reduction order put 0.10 % of the bf16 -> fp32 outputs on the other neighbour, 892 of 878306, mostly in
the long D = 4100 rows; the interpreter about 0.001 %. A conversion that truncates instead of rounding puts about
half of them there; a wrong tie rule gives values outside the two neighbours' products.)
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

from specdec.drafters.dflash_model import _RMSNorm
from specdec.kernels.rms_norm import rms_norm, rms_norm_reference

DIMS = [1, 7, 64, 128, 384, 4100]
X_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = [1e-6, 1e-5]
HALF = (torch.bfloat16, torch.float16)
LAYOUTS = ["contiguous", "strided", "transposed"]
# per-row magnitudes (powers of ten); fp16 stays inside its range (x**2 is summed in fp32 for every dtype)
EXPONENTS = {torch.float16: [-6, -3, -1, 0, 0, 0, 1, 2, 3]}
EXPONENTS_WIDE = [-20, -8, -3, -1, 0, 0, 0, 1, 3, 8, 15]


# --- cases -------------------------------------------------------------------------------------------------------


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _leading(gen: torch.Generator, rows: int, ndim: int) -> tuple[int, ...]:
    """A leading shape of ``ndim`` dims with about ``rows`` rows (exactly ``rows`` for ``ndim`` 1; none for 0)."""
    if ndim == 0:
        return ()
    shape = [rows]
    while len(shape) < ndim:
        split = _randint(gen, 1, min(shape[0], 6))
        shape = [max(shape[0] // split, 1), split, *shape[1:]]
    return tuple(shape)


def _values(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, zero_rows: float) -> torch.Tensor:
    """Normal values, each row at its own magnitude (tiny to large), some rows all zero."""
    rows = math.prod(shape[:-1])
    exps = torch.tensor(EXPONENTS.get(dtype, EXPONENTS_WIDE), dtype=torch.float64)
    scale = 10.0 ** exps[torch.randint(len(exps), (rows, 1), generator=gen)]
    scale = scale * (torch.rand(rows, 1, generator=gen, dtype=torch.float64) + 0.5)
    scale[torch.rand(rows, generator=gen) < zero_rows] = 0.0
    x = torch.randn(rows, shape[-1], generator=gen, dtype=torch.float64) * scale
    return x.to(dtype).reshape(shape)


def pick_shape(gen: torch.Generator, dim: int, rows: int, ndim: int, groups: int) -> tuple[tuple[int, ...], int]:
    """``(x's shape, period)``: about ``rows`` rows in a leading shape of ``ndim`` dims and a random period 1-5;
    ``ndim`` 3 with ``groups`` > 1: the drafter's stacked key norms, ``[R, L, H, D]`` with ``L = groups`` and
    ``period = H``."""
    if ndim == 3 and groups > 1:
        heads = _randint(gen, 1, 4)
        return (max(rows // (groups * heads), 1), groups, heads, dim), heads
    return (*_leading(gen, rows, ndim), dim), _randint(gen, 1, 5)


def make_case(gen, shape, x_dtype, w_dtype, eps, *, groups, period, layout="contiguous", w_layout="contiguous",
              zero_rows=0.1) -> dict:  # fmt: skip
    """One case: ``x`` of ``shape`` stored as ``layout`` (``strided``: rows further apart than D, NaN between;
    ``transposed``: the last dim not contiguous; ``heads``: the first of more heads, ``x = base[..., :G, :]`` with
    NaN heads after them, as the query and key heads of a fused q / k / v product), a ``[groups, D]`` weight (for one
    group sometimes ``[D]``), stored as ``w_layout``."""
    dim = shape[-1]
    x = _values(gen, shape, x_dtype, zero_rows)
    if layout == "strided":
        base = torch.full((*shape[:-1], dim + 3), float("nan"), dtype=x_dtype)
        base[..., :dim] = x
    elif layout == "keys" and len(shape) >= 4:  # the keys of a stacked key / value product [R, 2, L, H, D]
        base = torch.full((*shape[:-3], 2, *shape[-3:]), float("nan"), dtype=x_dtype)
        base[..., 0, :, :, :] = x
    elif layout == "heads" and len(shape) >= 3:
        base = torch.full((*shape[:-2], shape[-2] + _randint(gen, 1, 3), dim), float("nan"), dtype=x_dtype)
        base[..., : shape[-2], :] = x
    elif layout == "transposed" and len(shape) >= 2:
        base = x.transpose(-1, -2).contiguous()
    else:
        base, layout = x, "contiguous"
    w_scale = [1.0, 0.05, 30.0][_randint(gen, 0, 2)]
    weight = (torch.randn(groups, dim, generator=gen, dtype=torch.float64) * w_scale + 0.3).to(w_dtype)
    if w_layout == "transposed":
        w_base = weight.t().contiguous()
    else:
        w_base, w_layout = (weight[0] if groups == 1 and _randint(gen, 0, 1) else weight), "contiguous"
    return dict(base=base, layout=layout, shape=shape, w_base=w_base, w_layout=w_layout, eps=eps, period=period)


def cases(num: int = 108, seed: int = 0) -> list[dict]:
    """Every (D, x dtype, weight dtype, eps) of ``DIMS`` x ``X_DTYPES`` x {same, fp32} x ``EPS`` (72), then random
    sizes and mixed dtypes; rows 1..300 (fewer for D = 4100), leading shapes of 0-4 dims, G in {1, 3}, periods
    1-5, strided and transposed ``x``, transposed weights."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num):
        if i < 72:
            dim, x_dtype, eps = DIMS[i % 6], X_DTYPES[(i // 6) % 3], EPS[(i // 36) % 2]
            w_dtype = x_dtype if (i // 18) % 2 == 0 else torch.float32
        else:
            dim, eps = _randint(gen, 1, 700), EPS[i % 2]
            x_dtype, w_dtype = [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16),
                                (torch.float64, torch.float32), (torch.bfloat16, torch.float64),
                                *[(d, d) for d in X_DTYPES]][i % 7]  # fmt: skip
        rows = _randint(gen, 1, 40 if dim > 1000 else 300)
        ndim = [1, 2, 3, 4, 0, 1, 3][i % 7]
        groups = [1, 3][(i // 2) % 2]
        layout = LAYOUTS[(i // 4) % 3]
        shape, period = pick_shape(gen, dim, rows, ndim, groups)
        out.append(make_case(gen, shape, x_dtype, w_dtype, eps, groups=groups, period=period, layout=layout,
                             w_layout="transposed" if i % 9 == 4 else "contiguous"))  # fmt: skip
    return out


def drafter_cases(seed: int = 1) -> list[dict]:
    """The drafter's norms: 16 rows of hidden 384 / 4096, heads 6 / 32 of D 64 / 128, the stacked key norms
    ``[R, L, H, D]`` with ``[L, D]`` weights; bf16 with bf16 and fp32 weights."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for w_dtype in (torch.bfloat16, torch.float32):
        for dim, heads in ((384, 1), (4096, 1), (64, 6), (128, 32), (128, 8)):
            shape = (16, dim) if heads == 1 else (16, heads, dim)
            out.append(make_case(gen, shape, torch.bfloat16, w_dtype, 1e-6, groups=1, period=1, zero_rows=0.0))
        out.append(make_case(gen, (16, 3, 2, 128), torch.bfloat16, w_dtype, 1e-6, groups=3, period=2, zero_rows=0.0))
        # the query and key heads of a fused q / k / v product ([B, S, H + H_kv (+ H_kv), D]), one weight row per head
        for shape in ((1, 16, 8, 64), (2, 16, 40, 128), (32, 10, 128)):
            out.append(make_case(gen, shape, torch.bfloat16, w_dtype, 1e-6, groups=shape[-2], period=1,
                                 layout="heads", zero_rows=0.0))  # fmt: skip
        # the keys of the context projection's stacked key / value product: [B, R, 2, L, H_kv, D] -> [:, :, 0]
        out.append(make_case(gen, (1, 7, 3, 2, 64), torch.bfloat16, w_dtype, 1e-6, groups=3, period=2, layout="keys",
                             zero_rows=0.0))  # fmt: skip
    return out


def case_x(case: dict, device: str = "cpu") -> torch.Tensor:
    base = case["base"].to(device)
    if case["layout"] == "strided":
        return base[..., : case["shape"][-1]]
    if case["layout"] == "keys":
        return base[..., 0, :, :, :]
    if case["layout"] == "heads":
        return base[..., : case["shape"][-2], :]
    return base.transpose(-1, -2) if case["layout"] == "transposed" else base


def case_weight(case: dict, device: str = "cpu") -> torch.Tensor:
    w = case["w_base"].to(device)
    return w.t() if case["w_layout"] == "transposed" else w


def case_args(case: dict, device: str = "cpu") -> tuple:
    return case_x(case, device), case_weight(case, device), case["eps"]


# --- oracles and comparisons --------------------------------------------------------------------------------------


def weight_rows(case: dict) -> torch.Tensor:
    """``[R, D]`` float64: the weight row of every row of x."""
    weight = case_weight(case).double().reshape(-1, case["shape"][-1])
    rows = math.prod(case["shape"][:-1])
    return weight[(torch.arange(rows) // case["period"]) % weight.shape[0]]


def _normed64(case: dict) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps)`` in float64, ``[R, D]``."""
    x = case_x(case).double().reshape(-1, case["shape"][-1])
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + case["eps"])


def oracle64(case: dict) -> torch.Tensor:
    """``weight * x / sqrt(mean(x**2) + eps)`` in float64, ``[R, D]``."""
    return weight_rows(case) * _normed64(case)


def _ulp_order(t: torch.Tensor) -> torch.Tensor:
    """bf16 / fp16 bits as integers ordered like the values (+0 and -0 both 0), to count ulps between them."""
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def bracket_products(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs allowed with bf16 / fp16 ``x``: the weight times either value of x's dtype next to the exact
    (float64) ``x / rms``. The fp32 normalisation is far more precise than x's dtype, but near a rounding midpoint
    a different sum order may round it to the other neighbour."""
    x, weight, _ = case_args(case)
    exact = _normed64(case)
    near = exact.to(x.dtype)
    step = torch.where(near.double() > exact, -math.inf, math.inf)
    other = torch.where(near.double() == exact, near, torch.nextafter(near, step.to(x.dtype)))
    w = weight_rows(case).to(weight.dtype)
    return tuple((w * v).view(case["shape"]) for v in (near, other))


def _subnormal(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).tiny * torch.finfo(dtype).eps


def check_oracle(case: dict, got: torch.Tensor) -> None:
    """Within the roundings the definition makes: x / rms to x's dtype, the product to the output dtype (half an
    ulp each, or half the smallest subnormal), plus 2e-6 relative for the fp32 normalisation."""
    x_dtype, out_dtype = case["base"].dtype, got.dtype
    want = oracle64(case)
    got = got.cpu().double().reshape(want.shape)
    rel = torch.finfo(x_dtype).eps / 2 + torch.finfo(out_dtype).eps / 2 + 2e-6
    bound = want.abs() * rel + weight_rows(case).abs() * _subnormal(x_dtype) / 2 + _subnormal(out_dtype) / 2
    err = (got - want).abs()
    assert bool((err <= bound).all()), (_info(case), float((err - bound).max()))


def _info(case: dict) -> tuple:
    return case["shape"], case["base"].dtype, case["w_base"].dtype, tuple(case["w_base"].shape), case["period"]


def compare(cases_: list[dict], outputs: list[torch.Tensor], *, oracle: bool = True) -> dict:
    """Each output against the reference (and the float64 oracle). With fp32 / fp64 ``x`` the outputs are within
    rtol 2e-6, atol 1e-6. With bf16 / fp16 ``x`` every element equals the reference or the weight times one of
    the two values of x's dtype around the exact ``x / rms`` (``bracket_products``; half outputs are then at most
    2 ulps apart), and at least 99.5 % are equal. Returns ``{(x dtype, out dtype): [equal, total]}`` for those."""
    assert len(outputs) == len(cases_)
    counts: dict = {}
    for case, got in zip(cases_, outputs, strict=True):
        want = rms_norm_reference(*case_args(case), period=case["period"])
        assert got.shape == want.shape == case["shape"] and got.dtype == want.dtype, _info(case)
        got = got.cpu()
        assert not got.isnan().any(), _info(case)
        if case["base"].dtype in HALF:
            equal = got == want
            near, other = bracket_products(case)
            assert bool((equal | (got == near) | (got == other)).all()), (_info(case), int((~equal).sum()))
            if got.dtype in HALF:
                assert int((_ulp_order(got) - _ulp_order(want)).abs().max()) <= 2, _info(case)
            tally = counts.setdefault((case["base"].dtype, got.dtype), [0, 0])
            tally[0] += int(equal.sum())
            tally[1] += equal.numel()
        else:
            torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6, msg=lambda m, c=case: f"{_info(c)}: {m}")
        if oracle:
            check_oracle(case, got)
    for key, (equal, total) in counts.items():
        assert equal >= 0.995 * total, (key, equal, total)
    return counts


# --- tests on CPU -------------------------------------------------------------------------------------------------


def test_cases_cover_what_matters():
    cs = cases()
    assert {c["shape"][-1] for c in cs} >= set(DIMS)
    assert {(c["base"].dtype, c["w_base"].dtype) for c in cs} >= {(d, w) for d in X_DTYPES for w in (d, torch.float32)}
    assert {len(c["shape"]) - 1 for c in cs} == {0, 1, 2, 3, 4}
    assert {c["layout"] for c in cs} == set(LAYOUTS) and sum(c["w_layout"] == "transposed" for c in cs) > 5
    grouped = [c for c in cs if c["w_base"].dim() == 2 and c["w_base"].numel() > c["shape"][-1]]
    assert len(grouped) > 40 and {c["period"] for c in grouped} >= {1, 2, 3, 4, 5}
    assert max(math.prod(c["shape"][:-1]) for c in cs) > 250
    # rows of zeros, of tiny and of large magnitude
    rows = [case_x(c).double().reshape(-1, c["shape"][-1]).abs().amax(-1) for c in cs]
    peaks = torch.cat(rows)
    assert (peaks == 0).sum() > 50 and ((peaks > 0) & (peaks < 1e-5)).sum() > 100 and (peaks > 1e6).sum() > 100


def test_reference_is_the_drafter_module():
    # For one weight row the reference must be _RMSNorm itself, bit for bit (any dtype pair, any layout).
    for case in cases() + drafter_cases():
        x, weight, eps = case_args(case)
        if weight.dim() == 2 and weight.shape[0] > 1:
            continue
        module = _RMSNorm(x.shape[-1], eps)
        module.weight = torch.nn.Parameter(weight.reshape(-1).clone(), requires_grad=False)
        with torch.no_grad():
            want = module(x)
        got = rms_norm(x, weight, eps, period=case["period"], impl="torch")
        assert got.dtype == want.dtype and torch.equal(got, want), _info(case)


def test_grouped_reference_is_the_module_per_group():
    # With [G, D] weights: the rows of each group through _RMSNorm with that group's weight row, bit for bit.
    checked = 0
    for case in cases():
        x, weight, eps = case_args(case)
        if weight.dim() == 1 or weight.shape[0] == 1:
            continue
        rows = x.reshape(-1, x.shape[-1])
        group = (torch.arange(rows.shape[0]) // case["period"]) % weight.shape[0]
        got = rms_norm_reference(x, weight, eps, period=case["period"]).reshape(rows.shape)
        for g in range(weight.shape[0]):
            module = _RMSNorm(x.shape[-1], eps)
            module.weight = torch.nn.Parameter(weight[g].clone(), requires_grad=False)
            with torch.no_grad():
                assert torch.equal(got[group == g], module(rows[group == g])), (_info(case), g)
        checked += 1
    assert checked > 40


def test_reference_matches_float64_oracle():
    cs = cases() + drafter_cases()
    outputs = [rms_norm(*case_args(c), period=c["period"], impl="torch") for c in cs]
    compare(cs, outputs)
    for case, got in zip(cs, outputs, strict=True):  # with half x: one of the two outputs the definition allows
        if case["base"].dtype in HALF:
            near, other = bracket_products(case)
            assert bool(((got == near) | (got == other)).all()), _info(case)


def test_oracle_check_catches_a_wrong_weight_row():
    # The comparisons are sharp enough to see one weight row off (the planted-bug check, kept as a test).
    case = next(c for c in cases() if c["w_base"].dim() == 2 and c["w_base"].shape[0] == 3 and c["period"] > 1)
    x, weight, eps = case_args(case)
    wrong = rms_norm_reference(x, weight.roll(1, 0), eps, period=case["period"])
    with pytest.raises(AssertionError):
        check_oracle(case, wrong)


def test_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    case = cases(num=8)[7]
    args = case_args(case)
    assert torch.equal(rms_norm(*args, period=case["period"]), rms_norm_reference(*args, period=case["period"]))
    with pytest.raises(ValueError, match="GPU"):
        rms_norm(*args, impl="triton")


def test_empty_and_one_row_weights():
    x = torch.randn(0, 3, 64)
    assert rms_norm(x, torch.randn(2, 64), 1e-6, period=3).shape == (0, 3, 64)
    x, w = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(64)
    want = rms_norm_reference(x, w, 1e-6)
    assert want.dtype == torch.float32
    assert torch.equal(rms_norm_reference(x, w[None], 1e-6, period=4), want)


def test_bad_arguments_are_refused():
    x, w = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(ValueError, match=r"weight must be \[D\] or \[G, D\].*D = x.shape\[-1\] = 8.*got \[7\]"):
        rms_norm(x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match=r"got \[2, 9\]"):
        rms_norm(x, torch.randn(2, 9), 1e-6)
    with pytest.raises(ValueError, match=r"got \[1, 2, 8\]"):
        rms_norm(x, torch.randn(1, 2, 8), 1e-6)
    with pytest.raises(ValueError, match=r"got \[0, 8\]"):
        rms_norm(x, torch.randn(0, 8), 1e-6)
    with pytest.raises(ValueError, match=r"x must be .*got torch.int64.*x.float\(\)"):
        rms_norm(torch.ones(4, 8, dtype=torch.long), w, 1e-6)
    with pytest.raises(ValueError, match=r"x must be .*got torch.float32 \[\]"):
        rms_norm(torch.tensor(1.0), torch.randn(1), 1e-6)
    with pytest.raises(ValueError, match=r"weight must be a tensor of .*got torch.int32.*weight.float\(\)"):
        rms_norm(x, torch.ones(8, dtype=torch.int32), 1e-6)
    with pytest.raises(ValueError, match=r"period=0: pass a Python int >= 1"):
        rms_norm(x, w, 1e-6, period=0)
    with pytest.raises(ValueError, match="period"):
        rms_norm(x, w, 1e-6, period=2.0)
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x, w, torch.tensor(1e-6))
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x, w, -1.0)
    with pytest.raises(ValueError, match=r"impl='reference': choose 'auto', 'torch' or 'triton'"):
        rms_norm(x, w, 1e-6, impl="reference")
    with pytest.raises(ValueError, match="one device"):
        rms_norm(x, w.to("meta"), 1e-6)


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    data = {"cases": cases(), "drafter": drafter_cases()}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("rms_norm"), data)


@pytest.mark.interpreter
def test_interpreted_equals_reference(interpreted):
    counts = compare(interpreted["cases"], interpreted["outputs"])
    assert {x for x, _ in counts} == set(HALF) and all(total > 50_000 for _, total in counts.values())


@pytest.mark.interpreter
def test_interpreted_drafter_shapes(interpreted):
    compare(interpreted["drafter"], interpreted["drafter_outputs"])


@pytest.mark.interpreter
def test_interpreted_auto_dispatch_and_empty(interpreted):
    # under TRITON_INTERPRET=1 "auto" runs Triton; an empty x launches nothing
    assert interpreted["auto_impl"] == "triton"
    compare(interpreted["cases"][:1], [interpreted["auto"]])
    assert interpreted["empty"].shape == (0, 3, 64) and interpreted["empty"].dtype == torch.float32


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved cases through the interpreter, saved beside them."""
    from unittest import mock

    import specdec.kernels.rms_norm as package
    from specdec.kernels.rms_norm import triton as kernels

    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {
        "outputs": [rms_norm(*case_args(c), period=c["period"], impl="triton") for c in data["cases"]],
        "drafter_outputs": [rms_norm(*case_args(c), period=c["period"], impl="triton") for c in data["drafter"]],
    }
    with mock.patch.object(kernels, "rms_norm_triton", side_effect=kernels.rms_norm_triton) as spy:
        case = data["cases"][0]
        out["auto"] = rms_norm(*case_args(case), period=case["period"])
        out["auto_impl"] = "triton" if spy.call_count else "torch"
    out["empty"] = rms_norm(torch.randn(0, 3, 64), torch.randn(2, 64), 1e-6, period=3, impl="triton")
    assert package._triton_available()
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_compiled_equals_reference_on_cuda():
    cs = cases() + drafter_cases()
    compare(cs, [rms_norm(*case_args(c, "cuda"), period=c["period"], impl="triton") for c in cs])
    # "auto" picks Triton on CUDA; the CUDA reference (the eager drafter's ops) agrees too
    compare(cs[:30], [rms_norm(*case_args(c, "cuda"), period=c["period"]) for c in cs[:30]])
    compare(cs, [rms_norm(*case_args(c, "cuda"), period=c["period"], impl="torch") for c in cs])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_compiled_kernel_replays_in_a_cuda_graph(layout):
    # One capture, then new inputs and weights copied into the static tensors before each replay.
    gen = torch.Generator().manual_seed(3)
    cs = [make_case(gen, (8, 3, 4, 128), torch.bfloat16, torch.bfloat16, 1e-6, groups=3, period=4, layout=layout)
          for _ in range(8)]  # fmt: skip
    static_x, static_w = case_x(cs[0], "cuda").clone(), case_weight(cs[0], "cuda").clone()  # clone keeps strides

    def step():
        return rms_norm(static_x, static_w, 1e-6, period=4)

    graph, out = capture_without_host_reads(step)
    outputs = []
    for case in cs:
        static_x.copy_(case_x(case))
        static_w.copy_(case_weight(case))
        graph.replay()
        outputs.append(out.clone())
    compare(cs, outputs)


# --- the rows' view (host logic, CPU) -----------------------------------------------------------------------------


def _rows_by_trying(x: torch.Tensor) -> tuple[tuple, tuple, int]:
    """Brute force: the first view of ``x`` as ``[R, D]``, else as ``[R / inner, inner, D]`` (trailing leading dims
    merged, the widest first), that ``torch`` accepts; ``(shape, strides, inner)`` or None where none does."""
    dim = x.shape[-1]
    try:
        v = x.view(-1, dim)
        return tuple(v.shape), v.stride(), 1
    except RuntimeError:
        pass
    for split in range(1, x.dim() - 1):
        inner = math.prod(x.shape[split:-1])
        try:
            v = x.view(-1, inner, dim)
        except RuntimeError:
            continue
        if inner > 1:
            return tuple(v.shape), v.stride(), inner
    return None


def _strided_inputs():
    """Views the library's norms meet (heads cut out of a wider row, the keys of a stacked key / value product, size-1
    dims among them, transposes) and contiguous ones."""
    base = torch.arange(2 * 16 * 10 * 64, dtype=torch.float32).view(2, 16, 10, 64)
    yield base
    yield base[:, :, :8]  # query heads of a q / k / v row
    yield base[:, :, 8:9]  # one key head
    yield base[:1, :, :8]  # one sequence: [1, 16, 8, 64] of strides (10240, 640, 64, 1)
    yield base[:, :1, 2:6]
    yield base.transpose(1, 2)
    yield base[:, ::2]
    yield base[..., :32]
    yield base.view(2, 16, 5, 2, 64)[:, :, :, 0]
    yield base.view(2, 16, 2, 5, 64)[:, :, 0, :4]
    yield base.view(32, 640)[:, :64]
    yield base.view(2, 16, 640)[:, :, :128].view(2, 16, 2, 64)


def test_rows_view_equals_the_views_torch_accepts():
    from specdec.kernels.rms_norm.triton import _rows_of

    seen = set()
    for x in _strided_inputs():
        rows, inner, stride_inner = _rows_of(x)
        expected = _rows_by_trying(x)
        if expected is None:  # no view: a contiguous copy
            assert rows.is_contiguous() and rows.shape == (x.numel() // x.shape[-1], x.shape[-1]) and inner == 1
            assert torch.equal(rows, x.reshape(-1, x.shape[-1]))
            seen.add("copy")
            continue
        assert (tuple(rows.shape), rows.stride(), inner) == expected
        assert rows.data_ptr() == x.data_ptr()  # a view, no copy
        assert stride_inner == (rows.stride(1) if inner > 1 else 0)
        seen.add("rows" if inner == 1 else "grid")
    assert seen == {"rows", "grid", "copy"}  # each outcome is met


def test_rows_view_traces_under_torch_compile():
    # A view that cannot be taken is an error of torch.compile's trace, not one the code can catch: the choice must
    # come from the strides (the failure seen compiling the DFlash block's query-head norm).
    from specdec.kernels.rms_norm.triton import _rows_of

    def rows_sum(x):
        rows, inner, _ = _rows_of(x)
        return rows.float().sum() * inner

    compiled = torch.compile(rows_sum, backend="eager", fullgraph=True)
    for x in _strided_inputs():
        torch._dynamo.reset()
        assert torch.equal(compiled(x), rows_sum(x))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
