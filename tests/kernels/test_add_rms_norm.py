"""``add_rms_norm``: a pre-norm layer's residual add and the RMSNorm after it, in one launch. The reference against
the DFlash drafter's own ops (the tensor add, then its ``_RMSNorm`` module), the Triton version through the
interpreter and compiled on CUDA: the sum equal, bit for bit, to the tensor add, and the norm equal, bit for bit,
to the one-input ``rms_norm`` kernel on that sum (whose own tests hold it to the float64 oracle). A planted bug (the
sum normalised before its rounding to x's dtype) fails the comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

from specdec.kernels.rms_norm import add_rms_norm, add_rms_norm_reference, rms_norm

# (leading shape, D, dtype, strided x)
SPECS = [((1, 16), 384, torch.bfloat16, False), ((2, 1), 4096, torch.bfloat16, True),
         ((5,), 100, torch.float32, False), ((3, 7), 64, torch.float16, True), ((33,), 384, torch.bfloat16, True)]


def make_case(seed: int, lead, dim, dtype, strided) -> dict:
    gen = torch.Generator().manual_seed(seed)
    if strided:  # x a column slice of a wider product, as a packed projection hands it over
        x = (torch.randn(*lead, 2 * dim, generator=gen) * 3).to(dtype)[..., dim:]
    else:
        x = (torch.randn(*lead, dim, generator=gen) * 3).to(dtype)
    residual = (torch.randn(*lead, dim, generator=gen) * 5).to(dtype)
    weight = (1 + 0.2 * torch.randn(dim, generator=gen)).to(dtype)
    return dict(x=x, residual=residual, weight=weight, eps=1e-6)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def check(case: dict, got, norm_of_sum) -> None:
    """``got = (sum, norm)``: the sum equals the tensor add bit for bit; the norm equals ``norm_of_sum`` (the
    one-input kernel on the tensor add's sum, run where ``got`` was) bit for bit."""
    total, normed = (t.cpu() for t in got)
    want = case["residual"] + case["x"]
    assert total.dtype == want.dtype and torch.equal(total, want)
    assert normed.dtype == norm_of_sum.dtype and torch.equal(normed, norm_of_sum.cpu())


def test_reference_is_the_layers_add_and_norm():
    from specdec.drafters.dflash_model import _RMSNorm

    for case in cases():
        module = _RMSNorm(case["x"].shape[-1], case["eps"]).to(case["x"].dtype)
        with torch.no_grad():
            module.weight.copy_(case["weight"])
            total = case["residual"] + case["x"]
            want = module(total)
        got = add_rms_norm(case["x"], case["residual"], case["weight"], case["eps"])  # CPU auto: the reference
        assert torch.equal(got[0], total) and torch.equal(got[1], want)


def test_mixed_dtypes_and_autograd_take_the_reference():
    x, r, w = torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64), torch.randn(8)
    with pytest.raises(ValueError, match="impl=.triton. takes x and residual of one shape, dtype and device"):
        add_rms_norm(x, r, w, 1e-6, impl="triton")
    total, _ = add_rms_norm(x, r, w, 1e-6)
    assert total.dtype == torch.float64  # the tensor add's promotion, as the layer's
    x.requires_grad_(True)
    total, normed = add_rms_norm(x, r.float(), w, 1e-6)
    normed.sum().backward()
    assert x.grad is not None


def test_the_sum_normalised_before_its_rounding_fails_the_check():
    case = cases()[0]
    exact = case["residual"].float() + case["x"].float()
    unrounded = (exact.to(torch.bfloat16), add_rms_norm_reference(case["x"], case["residual"], case["weight"],
                                                                  case["eps"])[1])  # fmt: skip
    wrong = rms_norm(exact, case["weight"].float(), case["eps"]).to(torch.bfloat16)
    with pytest.raises(AssertionError):
        check(case, (unrounded[0], wrong), unrounded[1])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("add_rms_norm"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_add_then_the_norm_kernel(interpreted):
    for case, got, norm_of_sum in zip(interpreted["cases"], interpreted["outputs"], interpreted["norm_of_sum"],
                                      strict=True):  # fmt: skip
        check(case, got, norm_of_sum)


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [], "norm_of_sum": []}
    for c in data["cases"]:
        out["outputs"].append(add_rms_norm(c["x"], c["residual"], c["weight"], c["eps"], impl="triton"))
        out["norm_of_sum"].append(rms_norm(c["residual"] + c["x"], c["weight"], c["eps"], impl="triton"))
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_add_then_the_norm_kernel_on_cuda_and_replays():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for case in cases():
        x, r, w = (case[k].cuda() for k in ("x", "residual", "weight"))
        norm_of_sum = rms_norm(r + x, w, case["eps"], impl="triton")
        check(case, add_rms_norm(x, r, w, case["eps"], impl="triton"), norm_of_sum)
        check(case, add_rms_norm(x, r, w, case["eps"]), norm_of_sum)  # auto: Triton on CUDA
    case = cases()[1]
    x, r, w = (case[k].cuda() for k in ("x", "residual", "weight"))
    graph, out = capture_without_host_reads(lambda: add_rms_norm(x, r, w, case["eps"]))
    graph.replay()
    check(case, out, rms_norm(r + x, w, case["eps"], impl="triton"))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
