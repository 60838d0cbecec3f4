"""``gdn_gates``: the reference against the Gated DeltaNet layer's own formulas (HF's ``l2norm``, ``sigmoid``,
``softplus`` of the Qwen3.5 module), the Triton version through the interpreter and compiled on CUDA against the
reference (contiguous and strided inputs, as a tree's post-conv rows arrive; fp32 within a few ulps: the sums'
order and the GPU's ``exp`` / ``log`` differ; ``beta`` in bf16 within one bf16 ulp), softplus across its whole
range (the tiny-``exp`` end and the threshold), the argument checks, and a planted bug (keys not normalised) that
the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

from specdec.kernels.gdn_gates import fits_triton, gdn_gates, gdn_gates_reference

# (T, H, HV, K, V, dtype)
SPECS = [
    (1, 2, 4, 16, 16, torch.float32),
    (5, 4, 4, 32, 64, torch.bfloat16),
    (33, 16, 32, 128, 128, torch.bfloat16),  # the Qwen3.5 8 B-style shape, a 32-node tree
    (3, 2, 6, 64, 32, torch.float16),
    (7, 3, 6, 48, 48, torch.float32),  # head counts and widths that are no powers of two
]


def make_case(seed: int, total, heads, vheads, kdim, vdim, dtype) -> dict:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(total, 2 * heads * kdim + vheads * vdim, generator=gen) * 2).to(dtype)
    b = (torch.randn(total, vheads, generator=gen) * 4).to(dtype)
    # a + dt_bias over softplus's whole range: far below zero (exp tiny), around it, past the threshold 20
    a = (torch.linspace(-40, 30, total * vheads).reshape(total, vheads)[:, torch.randperm(vheads, generator=gen)]).to(
        dtype
    )
    a_log = torch.randn(vheads, generator=gen)
    dt_bias = torch.randn(vheads, generator=gen).to(dtype)
    if seed % 2:  # strided as a tree's rows arrive (the post-conv rows a transposed view; b / a column-major)
        x, b, a = (t.t().contiguous().t() for t in (x, b, a))
    return dict(x=x, b=b, a=a, a_log=a_log, dt_bias=dt_bias, shape=dict(num_k_heads=heads, head_k_dim=kdim,
                num_v_heads=vheads))  # fmt: skip


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def args(case: dict, device: str = "cpu") -> tuple:
    return tuple(case[n].to(device) for n in ("x", "b", "a", "a_log", "dt_bias"))


def check(case: dict, got) -> None:
    want = gdn_gates_reference(*args(case), **case["shape"])
    names = ("q", "k", "beta", "g")
    for name, a, b in zip(names, got, want, strict=True):
        a = a.cpu()
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, name
        if name == "beta" and case["b"].dtype != torch.float32:  # rounded to b's dtype: one ulp of it apart at most
            ulp = torch.finfo(case["b"].dtype).eps
            torch.testing.assert_close(a, b, rtol=ulp, atol=0, msg=name)
        else:
            torch.testing.assert_close(a, b, rtol=4e-6, atol=1e-7, msg=name)


def test_reference_is_the_layers_own_formulas():
    """Against the module's formulas written out from HF's Qwen3.5 Gated DeltaNet (``l2norm`` with its eps 1e-6,
    ``q * K^-1/2`` after the norm, ``b.sigmoid()``, ``-A_log.float().exp() * softplus(a.float() + dt_bias)``), and
    softplus's range checked against float64."""
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    for case in cases():
        x, b, a, a_log, dt_bias = args(case)
        h, kdim, hv = (case["shape"][n] for n in ("num_k_heads", "head_k_dim", "num_v_heads"))
        q, k, beta, g = gdn_gates_reference(x, b, a, a_log, dt_bias, **case["shape"])
        total = x.shape[0]
        want_q = qwen.l2norm(x[:, : h * kdim].float().reshape(total, h, kdim), dim=-1, eps=1e-6)
        want_k = qwen.l2norm(x[:, h * kdim : 2 * h * kdim].float().reshape(total, h, kdim), dim=-1, eps=1e-6)
        torch.testing.assert_close(q, want_q.repeat_interleave(hv // h, dim=1) * kdim**-0.5, rtol=2e-6, atol=0)
        torch.testing.assert_close(k, want_k, rtol=2e-6, atol=0)
        assert torch.equal(beta, b.sigmoid().float())
        want_g = -a_log.double().exp() * F.softplus(a.double() + dt_bias.double())
        torch.testing.assert_close(g.double(), want_g, rtol=2e-6, atol=1e-30)


def test_unnormalised_keys_fail_the_check():
    case = cases()[1]
    q, k, beta, g = gdn_gates_reference(*args(case), **case["shape"])
    with pytest.raises(AssertionError):
        check(case, (q, k * 1.01, beta, g))


def test_fits_and_refusals():
    case = cases()[1]
    x, b, a, a_log, dt_bias = args(case)
    assert fits_triton(x, b, a, **case["shape"])
    assert not fits_triton(x.double(), b, a, **case["shape"])
    assert fits_triton(x.t().contiguous().t(), b.t().contiguous().t(), a, **case["shape"])  # any strides
    assert not fits_triton(x, b, a, **{**case["shape"], "num_v_heads": 6})
    assert not fits_triton(x[:, :10], b, a, **case["shape"])  # too few columns for q and k
    got = gdn_gates(x, b, a, a_log, dt_bias, **case["shape"])  # CPU auto: the reference
    for one, two in zip(got, gdn_gates_reference(x, b, a, a_log, dt_bias, **case["shape"]), strict=True):
        assert torch.equal(one, two)
    with pytest.raises(ValueError, match="impl='triton' takes x"):
        gdn_gates(x.double(), b, a, a_log, dt_bias, impl="triton", **case["shape"])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("gdn_gates"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got)


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [gdn_gates(*args(c), impl="triton", **c["shape"]) for c in data["cases"]]}
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    for case in cases():
        check(case, gdn_gates(*args(case, "cuda"), impl="triton", **case["shape"]))
        check(case, gdn_gates(*args(case, "cuda"), **case["shape"]))  # auto: Triton on CUDA
    case = cases()[2]
    static = args(case, "cuda")
    graph, out = capture_without_host_reads(lambda: gdn_gates(*static, **case["shape"]))
    graph.replay()
    check(case, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
