"""``rms_norm_cat``: two RMSNorms written side by side (EAGLE-3's layer input: the token embedding's norm, then the
hidden's). The reference against HF's own modules and ``torch.cat`` (``LlamaRMSNorm`` plain, ``Qwen3NextRMSNorm``
with the unit offset), the Triton version through the interpreter and compiled on CUDA: each half equal, bit for
bit, to the one-input ``rms_norm`` kernel on its input run in the same place (whose own tests hold it to the float64
oracle and HF). Planted bugs (the halves swapped, one eps used for both) fail the comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

from specdec.kernels.rms_norm import rms_norm, rms_norm_cat

# (leading shape, D, dtype, strided inputs, unit offset)
SPECS = [((1, 1), 256, torch.bfloat16, False, False), ((2, 9), 384, torch.bfloat16, True, False),
         ((5,), 100, torch.float32, False, False), ((3, 4), 64, torch.float16, True, True),
         ((1, 1), 4096, torch.bfloat16, True, True), ((33,), 96, torch.float32, True, True)]


def make_case(seed: int, lead, dim, dtype, strided, unit_offset) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rows(scale):
        x = (torch.randn(*lead, 2 * dim if strided else dim, generator=gen) * scale).to(dtype)
        return x[..., dim:] if strided else x  # strided: a column slice of a wider tensor

    a, b = rows(3), rows(0.2)
    wa = (1 + 0.2 * torch.randn(dim, generator=gen)).to(dtype)
    wb = (0.3 * torch.randn(dim, generator=gen)).to(dtype)
    return dict(a=a, b=b, wa=wa, wb=wb, eps_a=1e-6, eps_b=0.05, unit_offset=unit_offset)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def halves(case: dict, impl: str, device="cpu") -> torch.Tensor:
    """The two one-input norms where the call under test ran, concatenated: what each half must equal."""
    a, b, wa, wb = (case[k].to(device) for k in ("a", "b", "wa", "wb"))
    off = case["unit_offset"]
    return torch.cat([rms_norm(a, wa, case["eps_a"], unit_offset=off, impl=impl),
                      rms_norm(b, wb, case["eps_b"], unit_offset=off, impl=impl)], -1)  # fmt: skip


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want)


def call(case: dict, impl: str = "auto", device="cpu") -> torch.Tensor:
    a, b, wa, wb = (case[k].to(device) for k in ("a", "b", "wa", "wb"))
    return rms_norm_cat(a, b, wa, wb, case["eps_a"], case["eps_b"], unit_offset=case["unit_offset"], impl=impl)


def test_reference_is_hfs_norm_modules_concatenated():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    for case in cases():
        dim = case["a"].shape[-1]
        modules = []
        for w, eps in ((case["wa"], case["eps_a"]), (case["wb"], case["eps_b"])):
            module = (Qwen3NextRMSNorm if case["unit_offset"] else LlamaRMSNorm)(dim, eps=eps).to(w.dtype)
            with torch.no_grad():
                module.weight.copy_(w)
            modules.append(module)
        with torch.no_grad():
            want = torch.cat([modules[0](case["a"]), modules[1](case["b"])], -1)
        check(call(case), want)  # CPU auto: the reference


def test_misfits_take_the_reference_or_are_refused():
    a, b, w = torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64), torch.randn(8)
    with pytest.raises(ValueError, match="impl=.triton. takes a and b of one shape, dtype and device"):
        rms_norm_cat(a, b, w, w, 1e-6, 1e-6, impl="triton")
    out = rms_norm_cat(a, b, w, w, 1e-6, 1e-6)
    assert out.shape == (2, 16) and out.dtype == torch.float64  # the second half's promotion, as torch.cat's
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm_cat(a, a, w, torch.randn(7), 1e-6, 1e-6)
    a.requires_grad_(True)
    rms_norm_cat(a, a.detach(), w, w, 1e-6, 1e-6).sum().backward()
    assert a.grad is not None


def test_planted_swaps_fail_the_check():
    case = cases()[1]
    want = halves(case, "torch")
    dim = case["a"].shape[-1]
    with pytest.raises(AssertionError):
        check(torch.cat([want[..., dim:], want[..., :dim]], -1), want)  # halves swapped
    one_eps = dict(case, eps_b=case["eps_a"])
    with pytest.raises(AssertionError):
        check(call(one_eps, "torch"), want)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("rms_norm_cat"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_halves_equal_the_one_input_kernel(interpreted):
    for got, want in zip(interpreted["outputs"], interpreted["halves"], strict=True):
        check(got, want)


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [call(c, "triton") for c in data["cases"]],
           "halves": [halves(c, "triton") for c in data["cases"]]}  # fmt: skip
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_halves_equal_the_one_input_kernel_on_cuda_and_replay():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for case in cases():
        want = halves(case, "triton", "cuda")
        check(call(case, "triton", "cuda"), want)
        check(call(case, "auto", "cuda"), want)  # auto: Triton on CUDA
    case = cases()[1]
    graph, out = capture_without_host_reads(lambda: call(case, "auto", "cuda"))
    graph.replay()
    check(out, halves(case, "triton", "cuda"))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
